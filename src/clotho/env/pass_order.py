"""Items taken pass after pass, each pass shuffled by (seed, pass number) alone: the order
never depends on what else drew from the environment's RNG, and a resumed `clotho serve`
rebuilds its place from two numbers and a fingerprint of the item names."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from clotho.errors import ConfigError

T = TypeVar("T")


class PassOrder(Generic[T]):
    def __init__(
        self, items: Sequence[T], name: Callable[[T], str], *, seed: int, shuffle: bool
    ) -> None:
        self.items = list(items)
        self.seed = seed
        self.shuffle = shuffle
        names = "\n".join(name(i) for i in self.items).encode()
        self.digest = hashlib.sha256(names).hexdigest()[:16]
        self.epoch = 0  # passes begun
        self._left: list[T] = []

    def _order(self, epoch: int) -> list[T]:
        order = list(self.items)
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next(self) -> T:
        if not self._left:
            self.epoch += 1
            self._left = self._order(self.epoch)
        return self._left.pop()

    def state_dict(self) -> dict[str, Any]:
        """The pass and how many of its items are left (popped from the end)."""
        return {"items": self.digest, "epoch": self.epoch, "left": len(self._left)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("items") != self.digest:
            raise ConfigError(
                "the serve state was saved for another item set (names or order differ): "
                "resuming it would repeat or skip items; use a new --state-dir"
            )
        epoch, left = state.get("epoch"), state.get("left")
        if not isinstance(epoch, int) or not isinstance(left, int) or epoch < 0 or left < 0:
            raise ConfigError(f"epoch/left in the serve state are {epoch!r}/{left!r}")
        if left > len(self.items) or (epoch == 0 and left):
            raise ConfigError(f"the serve state has {left} items left of {len(self.items)}")
        self.epoch = epoch
        self._left = self._order(epoch)[:left] if epoch else []


class PassOrdered:
    """Mixin (before `Environment` in the bases) for an environment whose items come from
    the `PassOrder` in `self._order`: items, and their place saved for `clotho serve`."""

    _order: PassOrder[Any]

    async def get_next_item(self) -> Any:
        return self._order.next()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "order": self._order.state_dict()}  # type: ignore[misc]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)  # type: ignore[misc]
        order = state.get("order")
        if not isinstance(order, dict):
            raise ConfigError("the serve state has no item order (saved by another version?)")
        self._order.load_state_dict(order)
