import pytest

from calendar_utils import day_of_year, days_in_month, days_in_year, is_leap


@pytest.mark.parametrize("year, leap", [(2000, True), (1900, False), (2024, True), (2023, False)])
def test_is_leap(year, leap):
    assert is_leap(year) is leap


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2023, 4) == 30


def test_bad_month():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 12, 31) == 366


def test_days_in_year():
    assert days_in_year(2024) == 366
    assert days_in_year(2023) == 365
