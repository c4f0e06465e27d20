import pytest

from intervals import contains, length, merge, overlaps, total_length


@pytest.mark.parametrize(
    "a, b, expected",
    [((1, 3), (2, 5), True), ((1, 2), (3, 4), False), ((1, 3), (3, 4), True), ((5, 6), (1, 2), False)],
)
def test_overlaps(a, b, expected):
    assert overlaps(a, b) is expected


def test_merge():
    assert merge([(5, 7), (1, 3), (2, 4)]) == [(1, 4), (5, 7)]


def test_merge_touching():
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]


def test_merge_empty():
    assert merge([]) == []


def test_length():
    assert length((3, 3)) == 1
    assert length((1, 10)) == 10


def test_total_length():
    assert total_length([(1, 3), (2, 4), (10, 10)]) == 5


def test_contains():
    assert contains((1, 5), 5)
    assert not contains((1, 5), 6)
