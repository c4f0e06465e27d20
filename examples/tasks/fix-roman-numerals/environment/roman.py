"""Conversion between integers and Roman numerals."""

_VALUES = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]

_SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    """Return the Roman numeral for n (1 <= n <= 3999)."""
    if n < 0 or n > 3999:
        raise ValueError(f"out of range: {n}")
    out = []
    for value, symbol in _VALUES:
        if n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


def from_roman(s):
    """Return the integer value of the Roman numeral s."""
    total = 0
    for i, ch in enumerate(s):
        value = _SYMBOLS[ch]
        if i + 1 < len(s) and _SYMBOLS[s[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
