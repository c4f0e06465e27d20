import unittest

from roman import from_roman, to_roman


class RomanTest(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(to_roman(1), "I")
        self.assertEqual(to_roman(4), "IV")
        self.assertEqual(to_roman(9), "IX")
        self.assertEqual(to_roman(14), "XIV")

    def test_repeated_symbols(self):
        self.assertEqual(to_roman(3), "III")
        self.assertEqual(to_roman(30), "XXX")
        self.assertEqual(to_roman(2024), "MMXXIV")

    def test_hundreds(self):
        self.assertEqual(to_roman(400), "CD")
        self.assertEqual(to_roman(900), "CM")
        self.assertEqual(to_roman(1994), "MCMXCIV")

    def test_from_roman(self):
        self.assertEqual(from_roman("MCMXCIV"), 1994)
        self.assertEqual(from_roman("XLII"), 42)

    def test_out_of_range(self):
        for bad in (0, -1, 4000):
            with self.assertRaises(ValueError):
                to_roman(bad)

    def test_invalid_numerals(self):
        for bad in ("", "IIII", "IC", "ABC", "VV", "iv"):
            with self.assertRaises(ValueError):
                from_roman(bad)


if __name__ == "__main__":
    unittest.main()
