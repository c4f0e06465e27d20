import unittest

from roman import from_roman, to_roman

REFERENCE = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def reference_roman(n):
    out = ""
    for value, symbol in REFERENCE:
        while n >= value:
            out += symbol
            n -= value
    return out


class HiddenRomanTest(unittest.TestCase):
    def test_all_numbers_both_ways(self):
        for n in range(1, 4000):
            expected = reference_roman(n)
            self.assertEqual(to_roman(n), expected, n)
            self.assertEqual(from_roman(expected), n, expected)

    def test_known_values(self):
        self.assertEqual(to_roman(3999), "MMMCMXCIX")
        self.assertEqual(to_roman(444), "CDXLIV")
        self.assertEqual(from_roman("MMMDCCCLXXXVIII"), 3888)

    def test_out_of_range(self):
        for bad in (0, -5, 4000, 10000):
            with self.assertRaises(ValueError):
                to_roman(bad)

    def test_invalid_numerals(self):
        for bad in ("", "IIII", "IC", "VV", "MMMM", "XM", "IIV", "XLX", "DD", "LC",
                    "iv", "X ", " X", "ABC", "IVI", "CMC", "0"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                from_roman(bad)


if __name__ == "__main__":
    unittest.main()
