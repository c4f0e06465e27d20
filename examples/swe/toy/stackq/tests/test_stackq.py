import pytest

from stackq import BoundedQueue, Stack


class TestStack:
    def test_push_pop(self):
        s = Stack()
        s.push(1)
        s.push(2)
        assert s.pop() == 2
        assert len(s) == 1

    def test_pop_empty(self):
        with pytest.raises(IndexError):
            Stack().pop()

    def test_peek(self):
        s = Stack()
        assert s.peek() is None
        s.push("a")
        assert s.peek() == "a"
        assert len(s) == 1


class TestBoundedQueue:
    def test_fifo(self):
        q = BoundedQueue(3)
        q.put(1)
        q.put(2)
        assert q.get() == 1
        assert q.get() == 2

    def test_full(self):
        q = BoundedQueue(2)
        assert q.put("a")
        assert q.put("b")
        assert q.is_full()
        assert not q.put("c")

    @pytest.mark.parametrize("capacity", [0, -1])
    def test_bad_capacity(self, capacity):
        with pytest.raises(ValueError):
            BoundedQueue(capacity)
