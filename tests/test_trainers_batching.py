"""Batch selection: exact sums, oldest first, nothing blocks the queue, minimums honoured."""

from __future__ import annotations

import itertools
import random

from clotho.trainers.batching import form_batch, pick_exact, scaled_minimums


def test_fifo_when_sizes_are_equal() -> None:
    assert pick_exact([4, 4, 4, 4], 8) == [0, 1]


def test_group_that_cannot_fit_is_passed_over_not_blocking() -> None:
    # Upstream packs by the largest size (16 here, above the batch): no batch ever forms.
    assert pick_exact([16, 4, 4], 8) == [1, 2]
    # A 3 next to 4s: the 4s still form a batch; the 3 waits for a partner.
    assert pick_exact([3, 4, 4], 8) == [1, 2]
    assert pick_exact([3, 4, 5], 8) == [0, 2]


def test_prefers_oldest_groups_even_when_greedy_fails() -> None:
    # Greedy oldest-first would take 5 then be stuck; the oldest exact subset is [5, 3].
    assert pick_exact([5, 2, 2, 3], 8) == [0, 3]
    assert pick_exact([2, 6, 3, 3, 2], 8) == [0, 1]


def test_impossible_or_short_queue_is_none() -> None:
    assert pick_exact([], 4) is None
    assert pick_exact([3, 3], 4) is None
    assert pick_exact([2, 1], 4) is None
    assert pick_exact([5], 4) is None
    assert pick_exact([1, 2], 0) == []


def test_matches_brute_force_on_random_queues() -> None:
    rng = random.Random(7)
    for _ in range(400):
        sizes = [rng.choice([1, 2, 3, 4, 8, 16]) for _ in range(rng.randint(0, 8))]
        target = rng.choice([4, 8, 16])
        expected = None
        for r in range(len(sizes) + 1):
            for combo in itertools.combinations(range(len(sizes)), r):
                if sum(sizes[i] for i in combo) == target and (
                    expected is None or list(combo) < expected
                ):
                    expected = list(combo)
        assert pick_exact(sizes, target) == expected, (sizes, target)


def test_minimum_allocation_is_respected() -> None:
    # env 0 floods the queue; env 1 must still get half of the batch.
    queue = [(0, 2), (0, 2), (0, 2), (0, 2), (1, 2), (1, 2)]
    picked = form_batch(queue, 8, {1: 4})
    assert picked is not None
    assert sum(queue[i][1] for i in picked if queue[i][0] == 1) >= 4
    assert sum(queue[i][1] for i in picked) == 8
    assert picked == [0, 1, 4, 5]


def test_starved_live_env_with_minimum_holds_the_batch() -> None:
    queue = [(0, 4), (0, 4), (0, 4)]
    assert form_batch(queue, 8, {1: 4}) is None
    assert form_batch(queue, 8, {}) == [0, 1]


def test_minimum_impossible_by_sizes_falls_back_to_plain_batch() -> None:
    # env 1 has its 2 sequences queued, but as one group of 6 next to 4s: no exact batch of 8
    # can hold it, so the minimum is dropped for this batch instead of stalling forever.
    queue = [(0, 4), (0, 4), (1, 6)]
    assert form_batch(queue, 8, {1: 2}) == [0, 1]


def test_minimums_are_scaled_down_when_they_exceed_the_batch() -> None:
    assert scaled_minimums({0: 8, 1: 8}, 8) == {0: 4, 1: 4}
    assert scaled_minimums({0: 2, 1: 0}, 8) == {0: 2}
