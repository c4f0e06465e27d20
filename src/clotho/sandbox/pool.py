"""`SlotPool`: warm sandboxes per configuration, leases, reset by replacement, no leaks.

A sandbox an agent used is never handed out again: `release(reset=True)` destroys it in the
background and, when the key is kept warm, starts a fresh replacement off the critical path.
A fresh sandbox is clean by construction; before it is handed out it must answer a health
check, or it is destroyed. `acquire` takes a warm sandbox when there is one, otherwise
creates one, and waits (up to a timeout) when the pool is at `max_size`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from clotho.errors import SandboxError
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig

if TYPE_CHECKING:
    from clotho.sandbox.docker.slots import SlotHost

log = logging.getLogger(__name__)

Opener = Callable[[SandboxConfig, dict[str, str]], Awaitable[Sandbox]]


class PoolConfig(BaseModel):
    max_size: int = Field(
        64, ge=1, description="sandboxes alive at once: in use, idle and starting"
    )
    warm: int = Field(0, ge=0, description="idle sandboxes kept ready per configuration in use")
    idle_timeout_s: float = Field(300.0, gt=0)
    max_lifetime_s: float = Field(3600.0, gt=0)
    acquire_timeout_s: float = Field(600.0, gt=0)
    health_timeout_s: float = Field(10.0, gt=0)
    health_interval_s: float = Field(
        10.0, ge=0, description="an idle sandbox checked less than this long ago is not re-checked"
    )
    lease_s: float = Field(6 * 3600.0, gt=0, description="lease written on every sandbox")
    reset: Literal["replace", "git"] = Field(
        "replace",
        description="replace: destroy a used sandbox (a fresh one is clean by construction); "
        "git: for repository workspaces, `git reset --hard && git clean -fdx` in the workdir, "
        "kill leftover processes and restart the shell, verified, else destroyed",
    )


@dataclass
class _Slot:
    sandbox: Sandbox
    key: str
    created: float = field(default_factory=time.monotonic)
    idle_since: float = field(default_factory=time.monotonic)
    checked: float = field(default_factory=time.monotonic)  # a new sandbox has just answered


# Reset the repository and print what is still not clean: an empty output proves the reset.
GIT_RESET = "git reset -q --hard && git clean -qfdx && git status --porcelain --ignored"
# End the session shell's background jobs and the shell itself (the wrapper starts a fresh
# one): no variables or processes of the previous agent survive. Processes that detached
# themselves completely (double fork) are not its jobs; use reset="replace" for those.
END_SESSION = "kill -9 $(jobs -p) 2>/dev/null; exit 0"


def config_key(config: SandboxConfig) -> str:
    return config.model_dump_json()


class SlotPool:
    def __init__(
        self,
        config: PoolConfig | None = None,
        *,
        labels: dict[str, str] | None = None,
        opener: Opener | None = None,
        docker_url: str | None = None,
    ) -> None:
        self.config = config or PoolConfig()
        self._docker_url = docker_url
        self.labels = dict(labels or {})
        self._opener = opener or self._open
        self._idle: dict[str, deque[_Slot]] = defaultdict(deque)
        self._in_use: dict[int, _Slot] = {}
        self._starting = 0
        self._wanted: dict[str, SandboxConfig] = {}
        self._cond = asyncio.Condition()
        self._background: set[asyncio.Task[Any]] = set()
        self._docker: Any = None
        self._slots: SlotHost | None = None  # made on first use of slots_per_container > 1
        self._maintenance: asyncio.Task[None] | None = None
        self._closed = False
        self.created = 0
        self.destroyed = 0

    # -- opening sandboxes -------------------------------------------------------------

    async def _open(self, config: SandboxConfig, labels: dict[str, str]) -> Sandbox:
        if isinstance(config, DockerSandboxConfig):
            from clotho.sandbox.docker.backend import DockerSandbox, docker_client

            if self._docker is None:
                self._docker = docker_client(config.docker_url or self._docker_url)
                self._spawn(self._reap_orphans(docker=True))
            if config.slots_per_container > 1:  # slots of shared containers
                from clotho.sandbox.docker.slots import SlotHost

                if self._slots is None:
                    self._slots = SlotHost(self._docker)
                return await self._slots.open(config, labels, lease_s=self.config.lease_s)
            return await DockerSandbox.create(
                config, labels, docker=self._docker, lease_s=self.config.lease_s
            )
        from clotho.sandbox.factory import open_sandbox

        return await open_sandbox(config, labels)

    @property
    def docker(self) -> Any:
        """The shared Docker client (created on first use)."""
        if self._docker is None:
            from clotho.sandbox.docker.backend import docker_client

            self._docker = docker_client(self._docker_url)
            self._spawn(self._reap_orphans(docker=True))
        return self._docker

    def _total(self) -> int:
        return len(self._in_use) + self._starting + sum(len(q) for q in self._idle.values())

    # -- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> SlotPool:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        if self._maintenance is None:
            self._maintenance = asyncio.create_task(self._maintain())
            self._spawn(self._reap_orphans(docker=False))

    async def _reap_orphans(self, *, docker: bool) -> None:
        """Remove sandboxes that dead runs left behind (owner gone or lease expired)."""
        from clotho.sandbox import leases

        try:
            if docker:
                for record in await leases.docker_records(self.docker):
                    if record.orphaned():
                        await leases.remove_docker(self.docker, record)
            else:
                for record in leases.local_records():
                    if record.orphaned():
                        await asyncio.to_thread(leases.remove_local, record)
        except Exception as exc:
            log.warning("reaping orphaned sandboxes failed: %s", exc)

    async def close(self) -> None:
        """Destroy every sandbox, idle or in use, and wait for background work."""
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintenance
        slots = [s for q in self._idle.values() for s in q] + list(self._in_use.values())
        self._idle.clear()
        self._in_use.clear()
        await asyncio.gather(*(self._destroy(s) for s in slots), return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        if self._slots is not None:
            await self._slots.close()
            self._slots = None
        if self._docker is not None:
            await self._docker.close()
            self._docker = None

    # -- acquire / release -------------------------------------------------------------

    async def acquire(
        self,
        config: SandboxConfig,
        *,
        labels: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Sandbox:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        key = config_key(config)
        deadline = time.monotonic() + (timeout or self.config.acquire_timeout_s)
        while True:
            slot: _Slot | None = None
            async with self._cond:
                while True:
                    if self._idle[key]:
                        slot = self._idle[key].popleft()
                        self._in_use[id(slot.sandbox)] = slot
                        break
                    if self._total() < self.config.max_size:
                        self._starting += 1
                        break
                    if self._evict_other(key):
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise SandboxError(
                            f"no sandbox available within {timeout or self.config.acquire_timeout_s:g} s: "
                            f"{len(self._in_use)} in use, pool max_size {self.config.max_size}"
                        )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._cond.wait(), remaining)
            if slot is None:
                return await self._create_in_use(config, key, labels)
            if await self._healthy(slot):
                self._want(key, config)
                return slot.sandbox
            async with self._cond:
                self._in_use.pop(id(slot.sandbox), None)
                self._cond.notify_all()
            self._spawn(self._destroy(slot))

    async def _create_in_use(
        self, config: SandboxConfig, key: str, labels: dict[str, str] | None
    ) -> Sandbox:
        try:
            sandbox = await self._opener(config, {**self.labels, **(labels or {})})
        except BaseException:
            self._starting -= 1
            self._spawn(self._notify())  # capacity freed; not awaited, so a cancel can't lose it
            raise
        # No await between opening and tracking: a cancellation cannot leak the sandbox.
        self.created += 1
        self._starting -= 1
        self._in_use[id(sandbox)] = _Slot(sandbox, key)
        self._want(key, config)
        return sandbox

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def release(self, sandbox: Sandbox, *, reset: bool = True) -> None:
        """Give a sandbox back. A used sandbox is destroyed and (if kept warm) replaced."""
        async with self._cond:
            slot = self._in_use.pop(id(sandbox), None)
            if slot is not None and not reset and not self._closed:
                slot.idle_since = time.monotonic()
                self._idle[slot.key].append(slot)
            self._cond.notify_all()
        if slot is None:
            await sandbox.close()
            return
        if reset and self.config.reset == "git" and not self._closed:
            self._starting += 1  # counted while it resets, so max_size holds
            self._spawn(self._git_reset(slot))
        elif reset or self._closed:
            self._spawn(self._destroy(slot))
            self._refill(slot.key)

    @contextlib.asynccontextmanager
    async def lease(
        self, config: SandboxConfig, *, labels: dict[str, str] | None = None
    ) -> AsyncIterator[Sandbox]:
        sandbox = await self.acquire(config, labels=labels)
        try:
            yield sandbox
        finally:
            await asyncio.shield(self.release(sandbox))

    async def wait_idle(self, config: SandboxConfig, count: int, timeout: float) -> None:
        """Wait until `count` warm sandboxes of `config` are ready."""
        key = config_key(config)
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(self._idle[key]) >= count), timeout
            )

    def prewarm(self, config: SandboxConfig, count: int = 1) -> None:
        """Start `count` sandboxes for `config` in the background, within max_size."""
        key = config_key(config)
        for _ in range(count):
            if self._closed or self._total() >= self.config.max_size:
                return
            self._starting += 1
            self._spawn(self._add_idle(config, key))

    # -- internals ---------------------------------------------------------------------

    def _want(self, key: str, config: SandboxConfig) -> None:
        if self.config.warm:
            self._wanted[key] = config

    def _refill(self, key: str) -> None:
        config = self._wanted.get(key)
        if config is None:
            return
        missing = self.config.warm - len(self._idle[key])
        if missing > 0:
            self.prewarm(config, missing)

    async def _add_idle(self, config: SandboxConfig, key: str) -> None:
        try:
            sandbox = await self._opener(config, dict(self.labels))
        except Exception as exc:
            log.warning("could not start a warm sandbox: %s", exc)
            async with self._cond:
                self._starting -= 1
                self._cond.notify_all()
            return
        self.created += 1
        async with self._cond:
            self._starting -= 1
            if self._closed:
                self._spawn(self._destroy(_Slot(sandbox, key)))
            else:
                self._idle[key].append(_Slot(sandbox, key))
            self._cond.notify_all()

    async def _git_reset(self, slot: _Slot) -> None:
        """Reset a repository workspace in place; hand it out again only if proven clean."""
        clean = False
        try:
            result = await slot.sandbox.exec(GIT_RESET, timeout=self.config.health_timeout_s * 6)
            clean = result.exit_code == 0 and result.stdout == ""
            if clean:  # a fresh session shell: no variables, no background jobs of the agent
                await slot.sandbox.exec(END_SESSION, timeout=self.config.health_timeout_s)
                clean = (await slot.sandbox.exec("true")).exit_code == 0
        except Exception as exc:
            log.warning("git reset of a sandbox failed: %s", exc)
        async with self._cond:
            self._starting -= 1
            if clean and not self._closed:
                slot.idle_since = slot.checked = time.monotonic()
                self._idle[slot.key].append(slot)
            self._cond.notify_all()
        if not clean or self._closed:
            await self._destroy(slot)

    def _evict_other(self, key: str) -> bool:
        """At max_size, make room by destroying the oldest idle sandbox of another key."""
        oldest: _Slot | None = None
        for other, queue in self._idle.items():
            if (
                other != key
                and queue
                and (oldest is None or queue[0].idle_since < oldest.idle_since)
            ):
                oldest = queue[0]
        if oldest is None:
            return False
        self._idle[oldest.key].popleft()
        self._spawn(self._destroy(oldest))
        return True

    async def _healthy(self, slot: _Slot) -> bool:
        if time.monotonic() - slot.checked < self.config.health_interval_s:
            return True
        try:
            result = await slot.sandbox.exec("true", timeout=self.config.health_timeout_s)
        except Exception:
            return False
        slot.checked = time.monotonic()
        return result.exit_code == 0

    async def _destroy(self, slot: _Slot) -> None:
        try:
            await slot.sandbox.close()
        except Exception as exc:
            log.warning("closing a sandbox failed: %s", exc)
        self.destroyed += 1

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _maintain(self) -> None:
        """Retire idle sandboxes past the idle timeout or the max lifetime; check health."""
        while True:
            await asyncio.sleep(min(5.0, self.config.idle_timeout_s / 2))
            now = time.monotonic()
            expired: list[_Slot] = []
            async with self._cond:
                for queue in self._idle.values():
                    for slot in list(queue):
                        if (
                            now - slot.idle_since > self.config.idle_timeout_s
                            or now - slot.created > self.config.max_lifetime_s
                        ):
                            queue.remove(slot)
                            expired.append(slot)
                if expired:
                    self._cond.notify_all()
            for slot in expired:
                self._spawn(self._destroy(slot))

    def stats(self) -> dict[str, int]:
        return {
            "in_use": len(self._in_use),
            "idle": sum(len(q) for q in self._idle.values()),
            "starting": self._starting,
            "created": self.created,
            "destroyed": self.destroyed,
        }
