#!/bin/bash
# Reference solution: OrderedDict-based LRU cache.
set -euo pipefail
cat > /app/lru.py <<'PY'
"""A least-recently-used (LRU) cache.

See /app/SPEC.md for the required behaviour.
"""
from collections import OrderedDict


def _check_capacity(capacity):
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")


class LRUCache:
    def __init__(self, capacity):
        _check_capacity(capacity)
        self._capacity = capacity
        self._data = OrderedDict()  # least recently used first
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return default

    def put(self, key, value):
        if key in self._data:
            self._data.move_to_end(key)
            self._data[key] = value
            return None
        self._data[key] = value
        if len(self._data) > self._capacity:
            return self._data.popitem(last=False)
        return None

    def delete(self, key):
        if key in self._data:
            del self._data[key]
            return True
        return False

    def keys(self):
        return list(self._data)

    def resize(self, capacity):
        _check_capacity(capacity)
        self._capacity = capacity
        evicted = []
        while len(self._data) > capacity:
            evicted.append(self._data.popitem(last=False))
        return evicted

    def __len__(self):
        return len(self._data)

    def __contains__(self, key):
        return key in self._data
PY
