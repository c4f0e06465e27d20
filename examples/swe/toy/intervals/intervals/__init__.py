"""Closed integer intervals."""


def overlaps(a, b):
    return a[0] <= b[1] and b[0] <= a[1]


def merge(intervals):
    ordered = sorted(intervals)
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(interval):
    return interval[1] - interval[0] + 1


def total_length(intervals):
    return sum(length(i) for i in merge(intervals))


def contains(interval, point):
    return interval[0] <= point <= interval[1]
