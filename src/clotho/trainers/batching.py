"""Choosing which queued groups make up the next batch. Pure functions, no I/O.

A batch is whole groups whose sequence counts add up to exactly `batch_size`; groups are
never split (their scores are normalised together). Upstream packs groups into "packs" of
the largest group size in the queue, which assumes power-of-two sizes: one group larger than
the batch, or of a size that does not divide it, stops every batch. Here the choice is an
exact subset sum that prefers the oldest groups: a group that cannot fit now is passed over
and waits, and never blocks the ones behind it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def pick_exact(sizes: Sequence[int], target: int) -> list[int] | None:
    """Indices (ascending) of groups whose sizes sum to `target`, or None if none do.

    Among all such subsets this returns the lexicographically smallest list of indices, so
    the oldest groups go first and a plain FIFO queue of equal sizes is served in order.
    """
    if target == 0:
        return []
    if target < 0 or sum(s for s in sizes if s > 0) < target:
        return None
    full = (1 << (target + 1)) - 1
    # reach[i]: bit k set when some subset of sizes[i:] sums to k.
    reach = [0] * (len(sizes) + 1)
    reach[-1] = 1
    for i in range(len(sizes) - 1, -1, -1):
        size, after = sizes[i], reach[i + 1]
        reach[i] = after | ((after << size) & full) if 0 < size <= target else after
    if not (reach[0] >> target) & 1:
        return None
    picked: list[int] = []
    need = target
    for i, size in enumerate(sizes):
        if need == 0:
            break
        if 0 < size <= need and (reach[i + 1] >> (need - size)) & 1:
            picked.append(i)
            need -= size
    return picked


def scaled_minimums(minimums: Mapping[int, int], batch_size: int) -> dict[int, int]:
    """Shrink per-environment minimum sequence counts proportionally when they exceed the batch."""
    wanted = {env: m for env, m in minimums.items() if m > 0}
    total = sum(wanted.values())
    if total <= batch_size:
        return wanted
    return {env: m * batch_size // total for env, m in wanted.items()}


def form_batch(
    groups: Sequence[tuple[int | None, int]],
    batch_size: int,
    minimums: Mapping[int, int] | None = None,
) -> list[int] | None:
    """Indices of the queued groups that form the next batch, or None.

    `groups` is the queue as (env_id, size) in arrival order. `minimums` maps a live
    environment to the sequences it must contribute (already scaled to the batch). An
    environment with a minimum and too little queued data holds the batch back: that is
    what a minimum means. When every minimum is covered by queued data but group sizes make
    an exact batch that respects them impossible, the minimums are dropped for this batch
    rather than stall forever.
    """
    sizes = [size for _, size in groups]
    wanted = {env: m for env, m in (minimums or {}).items() if m > 0}
    if not wanted:
        return pick_exact(sizes, batch_size)
    forced: list[int] = []
    for env, minimum in sorted(wanted.items()):
        mine = [i for i, (owner, _) in enumerate(groups) if owner == env]
        taken = 0
        for i in mine:
            if taken >= minimum:
                break
            forced.append(i)
            taken += sizes[i]
        if taken < minimum:
            return None
    need = batch_size - sum(sizes[i] for i in forced)
    if need >= 0:
        chosen = set(forced)
        rest = [i for i in range(len(sizes)) if i not in chosen]
        fill = pick_exact([sizes[i] for i in rest], need)
        if fill is not None:
            return sorted(forced + [rest[j] for j in fill])
    return pick_exact(sizes, batch_size)
