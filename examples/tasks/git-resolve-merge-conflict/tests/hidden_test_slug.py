import unittest

from slug import slugify, unslugify


class HiddenSlugTest(unittest.TestCase):
    def test_examples_from_instruction(self):
        self.assertEqual(slugify("  Hello,   World! "), "hello-world")
        self.assertEqual(slugify("C++ is fun"), "c-is-fun")

    def test_combined_behaviour(self):
        self.assertEqual(slugify("Rock & Roll"), "rock-roll")
        self.assertEqual(slugify("Tabs\tand\nnewlines"), "tabs-and-newlines")
        self.assertEqual(slugify("already-slugged title"), "already-slugged-title")
        self.assertEqual(slugify("Version 2.0: What's New?"), "version-20-whats-new")
        self.assertEqual(slugify("   "), "")

    def test_unslugify_unchanged(self):
        self.assertEqual(unslugify("a-b-c"), "a b c")


if __name__ == "__main__":
    unittest.main()
