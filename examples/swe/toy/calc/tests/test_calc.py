import pytest

from calc import clamp, mean, median, power, running_sum


@pytest.mark.parametrize(
    "value, expected", [(5, 5), (-3, 0), (42, 10), (0, 0), (10, 10)], ids=["inside", "below", "above", "low edge", "high edge"]
)
def test_clamp(value, expected):
    assert clamp(value, 0, 10) == expected


def test_clamp_rejects_empty_range():
    with pytest.raises(ValueError):
        clamp(1, 5, 2)


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_running_sum():
    assert running_sum([1, 2, 3]) == [1, 3, 6]


def test_power():
    assert power(2, 10) == 1024
    assert power(3, 0) == 1
