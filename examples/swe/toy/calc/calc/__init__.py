"""Small numeric helpers."""


def clamp(value, low, high):
    """Limit value to [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    if value < low:
        return low
    if value > high:
        return high
    return value


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of nothing")
    total = 0
    for v in values:
        total += v
    return total / len(values)


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of nothing")
    middle = n // 2
    if n % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def running_sum(values):
    out = []
    total = 0
    for i in range(len(values)):
        total += values[i]
        out.append(total)
    return out


def power(base, exponent):
    return base**exponent
