"""Whether a container hit one of its limits: memory, processes, disk.

Exceeding a limit is the agent's failure (`LimitExceeded`, kind `limit`), not infrastructure,
so a sandbox that broke because of one must say so. Memory and pids are kernel limits on
the container's cgroup; the kernel counts what they refused: `oom_kill` in
`memory.oom_control` (cgroup v1) or `memory.events` (v2), `max` in `pids.events`. Those
files are read on the host (the daemon is local: the cgroup path comes from
`/proc/<docker-init pid>/cgroup`), so nothing in the container is asked; without them
Docker's `State.OOMKilled` still tells an out-of-memory kill. Disk has no kernel limit here
(`StorageOpt size` needs overlay2 on xfs with pquota; this host has ext4), so a watched quota
stands in: the writable layer's size (`SizeRw` of `GET /containers/{id}/json?size=1`) is
checked while commands run and after them, and a container past it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clotho.errors import LimitExceeded, SandboxError

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read_counter(fd: int | None, key: str) -> int:
    """The value of `key` in a flat-keyed cgroup file kept open (`pread` at 0 renders it
    afresh: 1 us, where opening it each time costs 60-140 us), 0 when absent."""
    if fd is None:
        return 0
    try:
        text = os.pread(fd, 4096, 0).decode()
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            with contextlib.suppress(ValueError):
                return int(value)
    return 0


def _open(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def cgroup_dirs(pid: int, container_id: str) -> dict[str, Path]:
    """The host folders of the memory and pids cgroups of a container's process (none
    when the pid is not that container's: a remote daemon's pids are not ours)."""
    found: dict[str, Path] = {}
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text() if pid > 0 else ""
    except OSError:
        return found
    if container_id not in text:
        return found
    lines = text.splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2: one tree
            for name in ("memory", "pids"):
                found.setdefault(name, CGROUP_ROOT / rel)
        for name in controllers.split(","):
            if name in ("memory", "pids"):
                found[name] = CGROUP_ROOT / name / rel
    return {k: v for k, v in found.items() if v.is_dir()}


class LimitWatch:
    """Counts what a container's limits refused, and watches its disk use."""

    def __init__(
        self,
        container: Any,
        *,
        memory_mb: int | None,
        pids_limit: int | None,
        storage_mb: int | None,
        check_interval_s: float = 2.0,
    ) -> None:
        self.container = container
        self.memory_mb = memory_mb
        self.pids_limit = pids_limit
        self.storage_bytes = storage_mb * (1 << 20) if storage_mb else None
        self.check_interval_s = check_interval_s
        self.hit: str | None = None  # what broke the sandbox, once known
        self.hit_by: str | None = None  # the slot whose files passed the disk quota
        # Shared by slots: names the slot with the most disk (its folder holds its files).
        self.culprit: Callable[[], Awaitable[str | None]] | None = None
        self._dirs: dict[str, Path] | None = None
        self._fds: dict[str, int | None] = {}
        self._checks: set[asyncio.Task[None]] = set()
        self._base = (0, 0)
        self._last_disk = 0.0

    async def start(self) -> None:
        """Find the cgroup folders and take the counters' starting values."""
        info = await self.container.show()
        pid = int((info.get("State") or {}).get("Pid") or 0)
        self._dirs = await asyncio.to_thread(cgroup_dirs, pid, str(self.container.id))
        memory, pids = self._dirs.get("memory"), self._dirs.get("pids")
        if memory is not None:
            self._fds["oom"] = _open(memory / "memory.oom_control") or _open(
                memory / "memory.events"
            )
        if pids is not None:
            self._fds["pids"] = _open(pids / "pids.events")
        self._base = self._counters()

    def close(self) -> None:
        """Close the counter files. Idempotent."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _counters(self) -> tuple[int, int]:
        return _read_counter(self._fds.get("oom"), "oom_kill"), _read_counter(
            self._fds.get("pids"), "max"
        )

    def raise_if_hit(self, who: str | None = None) -> None:
        """`LimitExceeded` once a limit broke the container; for a slot (`who`) whose
        neighbour filled the shared disk, a `SandboxError` instead: not its failure."""
        if self.hit is None:
            return
        if who is not None and self.hit_by is not None and who != self.hit_by:
            raise SandboxError(
                f"the container was killed: slot {self.hit_by} filled its disk ({self.hit})"
            )
        raise LimitExceeded(self.hit)

    def snapshot(self) -> tuple[int, int]:
        """The counters now: a slot's check compares against the value before its command."""
        return self._counters()

    async def check(
        self,
        *,
        disk: bool = False,
        since: tuple[int, int] | None = None,
        killed: bool = True,
        who: str | None = None,
    ) -> None:
        """Raise `LimitExceeded` if a limit refused something: for a whole container, since
        its start; for a slot (`since`: the counters before its command, `killed`: its
        command died by SIGKILL or its shell is gone), only then, since neighbours share the
        cgroup. `disk`: check the writable layer's size too."""
        self.raise_if_hit(who)
        oom, pids = self._counters()
        base = since if since is not None else self._base
        killed = killed or since is None  # a whole container: any refusal is its agent's
        hit: str | None = None
        if oom > base[0] and killed:
            hit = f"the sandbox ran out of memory (limit {self.memory_mb} MB): a process was killed"
        elif pids > base[1] and killed:
            hit = f"the sandbox hit its process limit ({self.pids_limit}): a fork was refused"
        elif self._dirs is not None and "memory" not in self._dirs and since is None:
            info = await self.container.show()
            if (info.get("State") or {}).get("OOMKilled"):
                hit = f"the sandbox ran out of memory (limit {self.memory_mb} MB)"
        if hit is not None:
            if since is not None:
                raise LimitExceeded(hit)  # this slot's; its neighbours go on
            self.hit = hit
        if self.hit is None and disk:
            await self._check_disk()
        self.raise_if_hit(who)

    async def _check_disk(self) -> None:
        if self.storage_bytes is None:
            return
        self._last_disk = time.monotonic()
        used = await self.disk_used()
        if used > self.storage_bytes:
            if self.culprit is not None:  # shared by slots: whose files are they?
                try:
                    self.hit_by = await self.culprit()
                except Exception as exc:
                    log.warning(
                        "finding the slot that filled %s failed: %s", self.container.id, exc
                    )
            self.hit = (
                f"the sandbox wrote {used >> 20} MB, past its disk limit of "
                f"{self.storage_bytes >> 20} MB"
            )
            await self._kill()

    async def disk_used(self) -> int:
        """Bytes in the container's writable layer (`SizeRw`)."""
        info = await self.container.docker._query_json(
            f"containers/{self.container.id}/json", params={"size": "1"}
        )
        return int(info.get("SizeRw") or 0)

    async def _kill(self) -> None:
        from aiodocker.exceptions import DockerError

        with contextlib.suppress(DockerError):
            await self.container.kill(signal="SIGKILL")

    def due(self) -> bool:
        return time.monotonic() - self._last_disk >= self.check_interval_s

    def watch_disk(self) -> DiskWatch | None:
        """While a command runs: check the disk every interval (a timer, cheaper than a task
        per command); a container past its quota is killed (the command then fails, and
        `check` says why). Cancel the returned watch when the command is done."""
        if self.storage_bytes is None or self.hit is not None:
            return None
        return DiskWatch(self)


class DiskWatch:
    """A timer that checks a container's disk every interval until cancelled."""

    def __init__(self, limits: LimitWatch) -> None:
        self._limits = limits
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(
            limits.check_interval_s, self._fire
        )

    def _fire(self) -> None:
        self._handle = None
        self._task = self._loop.create_task(self._check())

    async def _check(self) -> None:
        try:
            await self._limits._check_disk()
        except Exception as exc:  # the container went away: the command reports it
            log.debug("disk check of %s failed: %s", self._limits.container.id, exc)
            return
        if self._limits.hit is None:
            self._handle = self._loop.call_later(self._limits.check_interval_s, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None and not self._task.done():
            self._task.cancel()
