import time
import unittest

from lru import LRUCache


class BehaviourTest(unittest.TestCase):
    def test_capacity_validation(self):
        for bad in (0, -1, 1.5, "3", None):
            with self.assertRaises(ValueError, msg=repr(bad)):
                LRUCache(bad)
        c = LRUCache(2)
        with self.assertRaises(ValueError):
            c.resize(0)

    def test_get_put_basic(self):
        c = LRUCache(2)
        self.assertIsNone(c.put("a", 1))
        self.assertIsNone(c.put("b", 2))
        self.assertEqual(c.get("a"), 1)
        self.assertEqual(c.get("zzz"), None)
        self.assertEqual(c.get("zzz", 42), 42)
        self.assertEqual(len(c), 2)

    def test_eviction_order_respects_get(self):
        c = LRUCache(3)
        c.put(1, "one")
        c.put(2, "two")
        c.put(3, "three")
        c.get(1)  # 2 is now the least recently used
        self.assertEqual(c.put(4, "four"), (2, "two"))
        self.assertEqual(c.keys(), [3, 1, 4])
        self.assertNotIn(2, c)

    def test_update_refreshes_without_evicting(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        self.assertIsNone(c.put("a", 10))
        self.assertEqual(c.keys(), ["b", "a"])
        self.assertEqual(c.put("c", 3), ("b", 2))
        self.assertEqual(c.get("a"), 10)

    def test_contains_does_not_touch_recency_or_stats(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        self.assertIn("a", c)
        self.assertEqual(c.put("c", 3), ("a", 1))
        self.assertEqual((c.hits, c.misses), (0, 0))

    def test_missing_get_does_not_change_recency(self):
        c = LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.get("x")
        self.assertEqual(c.keys(), ["a", "b"])

    def test_stats(self):
        c = LRUCache(2)
        c.put("a", None)
        self.assertIsNone(c.get("a", "default"))  # stored None is a hit
        c.get("a")
        c.get("b")
        self.assertEqual((c.hits, c.misses), (2, 1))

    def test_delete(self):
        c = LRUCache(3)
        c.put("a", 1)
        c.put("b", 2)
        self.assertTrue(c.delete("a"))
        self.assertFalse(c.delete("a"))
        self.assertEqual(c.keys(), ["b"])
        self.assertEqual(len(c), 1)
        c.put("c", 3)
        c.put("d", 4)
        self.assertEqual(len(c), 3)

    def test_resize(self):
        c = LRUCache(4)
        for k in "abcd":
            c.put(k, k.upper())
        c.get("a")
        self.assertEqual(c.resize(2), [("b", "B"), ("c", "C")])
        self.assertEqual(c.keys(), ["d", "a"])
        self.assertEqual(c.resize(5), [])
        for k in "xyz":
            self.assertIsNone(c.put(k, 0))
        self.assertEqual(len(c), 5)
        self.assertEqual(c.put("w", 0), ("d", "D"))

    def test_keys_returns_list(self):
        c = LRUCache(1)
        self.assertEqual(c.keys(), [])
        c.put((1, 2), "tuple key")
        self.assertIsInstance(c.keys(), list)
        self.assertEqual(c.keys(), [(1, 2)])
        self.assertEqual(c.put("new", 1), ((1, 2), "tuple key"))


class PerformanceTest(unittest.TestCase):
    def test_large_cache_is_fast(self):
        n = 50_000
        c = LRUCache(n)
        start = time.perf_counter()
        for i in range(n):
            c.put(i, i)
        for i in range(0, n, 2):
            c.get(i)
        for i in range(n, n + 100_000):
            c.put(i, i)
            c.get(i - 7)
            (i - 3) in c
        elapsed = time.perf_counter() - start
        self.assertEqual(len(c), n)
        self.assertLess(elapsed, 8.0, "operations are far too slow; they must be O(1)")


if __name__ == "__main__":
    unittest.main()
