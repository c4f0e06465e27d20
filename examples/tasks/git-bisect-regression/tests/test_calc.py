import unittest

import calc


class CalcTest(unittest.TestCase):
    def test_add_sub_mul(self):
        self.assertEqual(calc.add(2, 3), 5)
        self.assertEqual(calc.sub(2, 3), -1)
        self.assertEqual(calc.mul(4, 3), 12)

    def test_div(self):
        self.assertEqual(calc.div(7, 2), 3.5)
        with self.assertRaises(ValueError):
            calc.div(1, 0)

    def test_mean(self):
        self.assertEqual(calc.mean([1, 2, 3, 4]), 2.5)
        with self.assertRaises(ValueError):
            calc.mean([])

    def test_median(self):
        self.assertEqual(calc.median([3, 1, 2]), 2)
        self.assertEqual(calc.median([4, 1, 3, 2]), 2.5)
        self.assertEqual(calc.median([10, 20]), 15)

    def test_percent(self):
        self.assertEqual(calc.percent(1, 3), 33.33)

    def test_variance(self):
        self.assertEqual(calc.variance([1, 2, 3, 4]), 1.25)

    def test_clamp(self):
        self.assertEqual(calc.clamp(5, 0, 3), 3)
        self.assertEqual(calc.clamp(-1, 0, 3), 0)


if __name__ == "__main__":
    unittest.main()
