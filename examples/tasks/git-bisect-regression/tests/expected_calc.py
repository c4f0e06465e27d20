"""Small statistics helpers."""

__version__ = "1.2.0"


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def mul(a, b):
    return a * b


def div(a, b):
    if b == 0:
        raise ValueError("division by zero")
    return a / b


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of empty data")
    return sum(values) / len(values)


def median(values):
    s = sorted(values)
    if not s:
        raise ValueError("median of empty data")
    mid = len(s) // 2
    if len(s) % 2:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def percent(part, whole):
    """Return part as a percentage of whole, rounded to 2 places."""
    if whole == 0:
        raise ValueError("whole must not be zero")
    return round(100.0 * part / whole, 2)


def variance(values):
    values = list(values)
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def clamp(x, lo, hi):
    return max(lo, min(hi, x))
