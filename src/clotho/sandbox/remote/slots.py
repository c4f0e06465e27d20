"""Slots on remote hosts (a Modal sandbox, a Nomad allocation): N sandboxes per host.

The pool logic the seed got wrong, in one place and tested against doubles: a host is
ended only when no slot of it is acquired (idle scale-down and max lifetime never pull a
host from under a rollout); a host takes new slots only during the first half of its
lifetime; `min_hosts` are kept warm; hosts beyond that scale down after `idle_timeout_s`
with no slot in use. The vendor adapters (`modal_backend.py`, `nomad_backend.py`) say how a
host is made, used and ended; nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from clotho.sandbox.pool import wait_for_change

log = logging.getLogger(__name__)


class RemoteHost(Protocol):
    """What the slot pool needs of a host: an id and a way to end it."""

    id: str

    async def terminate(self) -> None: ...


H = TypeVar("H", bound=RemoteHost)


@dataclass(eq=False)
class HostState(Generic[H]):
    host: H
    slots: int
    created: float
    used: set[int] = field(default_factory=set)  # slot numbers acquired
    idle_since: float = 0.0
    ending: bool = False

    def free_slot(self) -> int | None:
        for k in range(self.slots):
            if k not in self.used:
                return k
        return None


class SlotHosts(Generic[H]):
    """Hosts with `slots` slots each, made by `create` and ended by `host.terminate()`."""

    def __init__(
        self,
        create: Callable[[], Awaitable[H]],
        *,
        slots: int,
        min_hosts: int,
        max_hosts: int,
        idle_timeout_s: float,
        max_lifetime_s: float,
        acquire_timeout_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        removable: Callable[[H, list[H]], bool] | None = None,
        create_gate: asyncio.Semaphore | None = None,
    ) -> None:
        self._create_host = create
        # Creations at once (`create_concurrency`), shared by every pool of a backend: a
        # burst of acquires waits its turn; only creating is gated, never using a slot.
        self._create_gate = create_gate
        self.slots = slots
        self.min_hosts = min_hosts
        self.max_hosts = max_hosts
        self.idle_timeout_s = idle_timeout_s
        self.max_lifetime_s = max_lifetime_s
        self.acquire_timeout_s = acquire_timeout_s
        self._clock = clock
        self._removable = removable or (lambda host, live: True)
        self.hosts: list[HostState[H]] = []
        self._starting = 0
        self._cond = asyncio.Condition()
        self._ending: set[asyncio.Task[None]] = set()

    async def _create(self) -> H:
        if self._create_gate is None:
            return await self._create_host()
        async with self._create_gate:
            return await self._create_host()

    def _young(self, state: HostState[H], now: float) -> bool:
        return now - state.created < self.max_lifetime_s / 2

    async def acquire(self) -> tuple[H, int]:
        """A free slot of a young host, else a new host's, else wait for one."""
        deadline = time.monotonic() + self.acquire_timeout_s  # waiting is real time
        async with self._cond:
            while True:
                now = self._clock()
                for state in self.hosts:
                    if state.ending or not self._young(state, now):
                        continue
                    slot = state.free_slot()
                    if slot is not None:
                        state.used.add(slot)
                        return state.host, slot
                if len(self.hosts) + self._starting < self.max_hosts:
                    break
                await wait_for_change(
                    self._cond,
                    deadline,
                    lambda: (
                        f"no free slot within {self.acquire_timeout_s:g} s: "
                        f"{len(self.hosts)} hosts of {self.slots} slots, max {self.max_hosts}"
                    ),
                )
            self._starting += 1
        try:
            host = await self._create()
        except BaseException:
            async with self._cond:
                self._starting -= 1
                self._cond.notify_all()
            raise
        async with self._cond:
            self._starting -= 1
            state = HostState(host, self.slots, created=self._clock(), used={0})
            self.hosts.append(state)
            self._cond.notify_all()
        return host, 0

    async def release(self, host: H, slot: int, *, end: bool = False) -> None:
        """Give a slot back; a host past half its lifetime ends with its last slot, and so
        does one whose slot cannot be cleaned in place (`end`: a single-slot host whose
        workdir is the image's)."""
        async with self._cond:
            state = next((s for s in self.hosts if s.host is host), None)
            if state is None:
                return
            state.used.discard(slot)
            now = self._clock()
            if end:
                state.ending = True  # no new slot; ended when its last one is back
            if not state.used:
                state.idle_since = now
                if state.ending or not self._young(state, now):
                    self._end(state)
            self._cond.notify_all()

    async def warm(self) -> None:
        """Start hosts until `min_hosts` exist."""
        missing = self.min_hosts - len(self.hosts) - self._starting
        if missing <= 0:
            return
        async with self._cond:
            self._starting += missing
        results = await asyncio.gather(
            *(self._create() for _ in range(missing)), return_exceptions=True
        )
        async with self._cond:
            self._starting -= missing
            for result in results:
                if isinstance(result, BaseException):
                    log.warning("starting a warm host failed: %s", result)
                else:
                    now = self._clock()
                    self.hosts.append(HostState(result, self.slots, created=now, idle_since=now))
            self._cond.notify_all()

    async def maintain(self) -> list[str]:
        """One round of scale-down: end hosts with no slot acquired that are past the idle
        timeout (beyond `min_hosts`) or past their lifetime. Returns the ids ended."""
        ended = []
        async with self._cond:
            now = self._clock()
            live = [s for s in self.hosts if not s.ending]
            spare = len(live) - self.min_hosts
            for state in sorted(live, key=lambda s: s.idle_since):
                if state.used:
                    continue  # never under an acquired slot
                if not self._removable(state.host, [s.host for s in self.hosts]):
                    continue
                old = now - state.created >= self.max_lifetime_s / 2
                idle = now - state.idle_since >= self.idle_timeout_s
                if old or (idle and spare > 0):
                    self._end(state)
                    spare -= 1
                    ended.append(state.host.id)
            self._cond.notify_all()
        return ended

    def _end(self, state: HostState[H]) -> None:
        state.ending = True
        if state in self.hosts:
            self.hosts.remove(state)
        task = asyncio.ensure_future(self._terminate(state.host))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _terminate(self, host: H) -> None:
        try:
            await host.terminate()
        except Exception as exc:
            log.warning("ending host %s failed: %s", host.id, exc)

    async def close(self) -> None:
        """End every host, in use or not (the run is over)."""
        async with self._cond:
            for state in list(self.hosts):
                self._end(state)
        while self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)
