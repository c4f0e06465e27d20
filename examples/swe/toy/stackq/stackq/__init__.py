"""A stack and a bounded queue."""


class Stack:
    def __init__(self):
        self._items = []

    def push(self, item):
        self._items.append(item)

    def pop(self):
        if not self._items:
            raise IndexError("pop from an empty stack")
        return self._items.pop()

    def peek(self):
        if not self._items:
            return None
        return self._items[-1]

    def __len__(self):
        return len(self._items)


class BoundedQueue:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._items = []

    def put(self, item):
        if len(self._items) >= self.capacity:
            return False
        self._items.append(item)
        return True

    def get(self):
        if not self._items:
            raise IndexError("get from an empty queue")
        return self._items.pop(0)

    def is_full(self):
        return len(self._items) == self.capacity
