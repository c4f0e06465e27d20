"""`SlotPool`: warm sandboxes per configuration, leases, reset by replacement, no leaks.

A sandbox an agent used is never handed out again: `release(reset=True)` destroys it in the
background and, when the key is kept warm, starts a fresh replacement off the critical path.
A fresh sandbox is clean by construction; an idle one must answer a health check before it
is handed out, or it is destroyed. `acquire` takes a warm sandbox when there is one,
otherwise creates one, and waits (up to a timeout) when the pool is at `max_size`.

Sandboxes are opened only through backends (`backends.py`): the pool keeps one per kind and
place (`backend_key`), made on first use, reaps that backend's orphans then, and closes it
in `close()`. `prepare` asks the backend what a task's environment needs (its image).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.errors import SandboxError
from clotho.sandbox.backends import (
    EnvironmentSpec,
    PreparedEnvironment,
    SandboxBackend,
    backend_key,
    check_sidecars,
    import_backend,
    make_backend,
    with_task_network,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig, config_type

log = logging.getLogger(__name__)

Opener = Callable[[SandboxConfig, dict[str, str]], Awaitable[Sandbox]]


async def wait_for_change(
    cond: asyncio.Condition, deadline: float, full: Callable[[], str]
) -> None:
    """Wait, holding `cond`, until it is notified or `deadline` (`time.monotonic`) passes; past
    the deadline, raise `SandboxError(full())`, which says what stayed full."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SandboxError(full())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(cond.wait(), remaining)


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
class _Pooled:
    """A sandbox the pool tracks: its configuration key and when it was made, idle, checked."""

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
        self._idle: dict[str, deque[_Pooled]] = defaultdict(deque)
        self._in_use: dict[int, _Pooled] = {}
        self._starting = 0
        self._wanted: dict[str, SandboxConfig] = {}
        self._cond = asyncio.Condition()
        self._background: set[asyncio.Task[Any]] = set()
        self._optional: set[asyncio.Task[Any]] = set()
        self._backends: dict[str, SandboxBackend] = {}
        self._reaped: set[str] = set()  # records already removed (backends may share some)
        self._maintenance: asyncio.Task[None] | None = None
        self._closed = False
        self.created = 0
        self.destroyed = 0

    # -- opening sandboxes -------------------------------------------------------------

    def _backend(self, config: SandboxConfig) -> SandboxBackend:
        """The backend serving `config`, made on first use (its orphans are reaped then)."""
        key = backend_key(config, docker_url=self._docker_url)
        backend = self._backends.get(key)
        if backend is None:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            backend = self._backends[key] = make_backend(config, docker_url=self._docker_url)
            self._spawn(self._reap_orphans(backend), optional=True)
        return backend

    async def backend_healthy(self, config: SandboxConfig, sandbox: Sandbox | None = None) -> bool:
        """Whether the backend serving `config` works (for `sandbox`, where it runs): what
        proves a failure the harness's."""
        await import_backend(config)
        return await self._backend(config).healthy(sandbox)

    async def _open(self, config: SandboxConfig, labels: dict[str, str]) -> Sandbox:
        await import_backend(config)
        return await self._backend(config).open(config, labels, lease_s=self.config.lease_s)

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """What to acquire with for a task's environment (its image built or found, its
        limits applied) on `base`'s backend. A failed image build is a `TaskError`."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        await import_backend(base)
        base = with_task_network(base, spec)  # the task's say on the network, on every backend
        check_sidecars(base, spec)  # a compose task's services: Docker runs them
        return await self._backend(base).prepare(base, spec, force_build=force_build)

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
            self._backend(config_type("local")())  # reaps local leftovers in TMPDIR

    async def _reap_orphans(self, backend: SandboxBackend) -> None:
        """Remove what dead runs left behind on `backend` (owner gone or lease expired)."""
        try:
            records = await backend.records()
        except Exception as exc:
            log.warning("listing %s sandboxes to reap failed: %s", backend.kind, exc)
            return
        for record in records:
            key = f"{record.backend}:{record.path or record.id}"
            if not record.orphaned() or key in self._reaped:
                continue
            self._reaped.add(key)
            try:
                await backend.remove(record)
            except Exception as exc:
                log.warning("reaping orphaned %s %s failed: %s", record.backend, record.id, exc)

    async def close(self) -> None:
        """Destroy every sandbox, idle or in use, and wait for background work."""
        self._closed = True
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.wait([self._maintenance])  # a cancel of close() itself propagates
        pooled = [s for q in self._idle.values() for s in q] + list(self._in_use.values())
        self._idle.clear()
        self._in_use.clear()
        for task in self._optional:
            task.cancel()
        await asyncio.gather(*(self._destroy(s) for s in pooled), return_exceptions=True)
        await asyncio.gather(*list(self._optional), return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        backends = list(self._backends.values())
        self._backends.clear()
        for backend in backends:
            try:
                await backend.aclose()
            except Exception as exc:
                log.warning("closing the %s backend failed: %s", backend.kind, exc)

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
            pooled: _Pooled | None = None
            async with self._cond:
                while True:
                    if self._idle[key]:
                        pooled = self._idle[key].popleft()
                        self._in_use[id(pooled.sandbox)] = pooled
                        break
                    if self._total() < self.config.max_size:
                        self._starting += 1
                        break
                    if self._evict_other(key):
                        continue
                    await wait_for_change(
                        self._cond,
                        deadline,
                        lambda: (
                            f"no sandbox available within {timeout or self.config.acquire_timeout_s:g} s: "
                            f"{len(self._in_use)} in use, pool max_size {self.config.max_size}"
                        ),
                    )
            if pooled is None:
                return await self._create_in_use(config, key, labels)
            if await self._healthy(pooled):
                self._want(key, config)
                return pooled.sandbox
            async with self._cond:
                self._in_use.pop(id(pooled.sandbox), None)
                self._cond.notify_all()
            self._spawn(self._destroy(pooled))

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
        self._in_use[id(sandbox)] = _Pooled(sandbox, key)
        self._want(key, config)
        return sandbox

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def release(self, sandbox: Sandbox, *, reset: bool = True) -> None:
        """Give a sandbox back. A used sandbox is destroyed and (if kept warm) replaced."""
        # A sandbox whose agent was stopped (verification) has no channel left: never reused.
        stopped = bool(getattr(sandbox, "stopped", False))
        async with self._cond:
            pooled = self._in_use.pop(id(sandbox), None)
            if pooled is not None and not reset and not self._closed and not stopped:
                pooled.idle_since = time.monotonic()
                self._idle[pooled.key].append(pooled)
            self._cond.notify_all()
        if pooled is None:
            await sandbox.close()
            return
        if reset and self.config.reset == "git" and not self._closed and not stopped:
            self._starting += 1  # counted while it resets, so max_size holds
            self._spawn(self._git_reset(pooled))
        elif reset or self._closed or stopped:
            self._spawn(self._destroy(pooled))
            self._refill(pooled.key)

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
                self._spawn(self._destroy(_Pooled(sandbox, key)))
            else:
                self._idle[key].append(_Pooled(sandbox, key))
            self._cond.notify_all()

    async def _git_reset(self, pooled: _Pooled) -> None:
        """Reset a repository workspace in place; hand it out again only if proven clean."""
        clean = False
        try:
            result = await pooled.sandbox.exec(GIT_RESET, timeout=self.config.health_timeout_s * 6)
            clean = result.exit_code == 0 and result.stdout == ""
            if clean:  # a fresh session shell: no variables, no background jobs of the agent
                await pooled.sandbox.exec(END_SESSION, timeout=self.config.health_timeout_s)
                clean = (await pooled.sandbox.exec("true")).exit_code == 0
        except Exception as exc:
            log.warning("git reset of a sandbox failed: %s", exc)
        async with self._cond:
            self._starting -= 1
            if clean and not self._closed:
                pooled.idle_since = pooled.checked = time.monotonic()
                self._idle[pooled.key].append(pooled)
            self._cond.notify_all()
        if not clean or self._closed:
            await self._destroy(pooled)

    def _evict_other(self, key: str) -> bool:
        """At max_size, make room by destroying the oldest idle sandbox of another key."""
        oldest: _Pooled | None = None
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

    async def _healthy(self, pooled: _Pooled) -> bool:
        """Whether an idle sandbox still answers (not asked again within health_interval_s).
        One whose backend knows its host is lost (a dead Ray node) is not, however recent
        its check: a retry must not be handed a sandbox on the node that lost its try."""
        if getattr(pooled.sandbox, "host_lost", False):
            return False
        if time.monotonic() - pooled.checked < self.config.health_interval_s:
            return True
        try:
            result = await pooled.sandbox.exec("true", timeout=self.config.health_timeout_s)
        except Exception as exc:
            log.warning("an idle sandbox failed its health check: %s", exc)
            return False
        pooled.checked = time.monotonic()
        if not result.ok:
            log.warning("an idle sandbox failed its health check: %s", result)
        return result.ok

    async def _destroy(self, pooled: _Pooled) -> None:
        try:
            await pooled.sandbox.close()
        except Exception as exc:
            log.warning("closing a sandbox failed: %s", exc)
        self.destroyed += 1

    def _spawn(self, coro: Awaitable[Any], *, optional: bool = False) -> None:
        """Run `coro` in the background; `close` waits for it, or, if `optional` (reaping a
        dead run's leftovers, which the next run does again), cancels it: a backend that
        cannot list its sandboxes (a Ray host that never started) must not hold up a stop."""
        task = asyncio.ensure_future(coro)
        (self._optional if optional else self._background).add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(self._optional.discard)

    async def _maintain(self) -> None:
        """Retire idle sandboxes past the idle timeout or the max lifetime. Health is checked
        when an idle sandbox is handed out (`_healthy`), not here."""
        while True:
            await asyncio.sleep(min(5.0, self.config.idle_timeout_s / 2))
            now = time.monotonic()
            expired: list[_Pooled] = []
            async with self._cond:
                for queue in self._idle.values():
                    for pooled in list(queue):
                        if (
                            now - pooled.idle_since > self.config.idle_timeout_s
                            or now - pooled.created > self.config.max_lifetime_s
                        ):
                            queue.remove(pooled)
                            expired.append(pooled)
                if expired:
                    self._cond.notify_all()
            for pooled in expired:
                self._spawn(self._destroy(pooled))

    def stats(self) -> dict[str, int]:
        return {
            "in_use": len(self._in_use),
            "idle": sum(len(q) for q in self._idle.values()),
            "starting": self._starting,
            "created": self.created,
            "destroyed": self.destroyed,
        }
