"""Whether a container hit one of its limits: memory, processes, disk.

Exceeding a limit is the agent's failure (`LimitExceeded`, kind `limit`), not infrastructure,
so a sandbox that broke because of one must say so. Memory and pids are kernel limits on
the container's cgroup; the kernel counts what they refused: `oom_kill` in
`memory.oom_control` (cgroup v1) or `memory.events` (v2), `max` in `pids.events`. Those
files are read on the host (the daemon is local: the cgroup path comes from
`/proc/<docker-init pid>/cgroup`), so nothing in the container is asked; without them
Docker's `State.OOMKilled` still tells an out-of-memory kill. Disk: the writable layer is a
file system of the limit's size and inode count (`docker/quota.py`), so the kernel refuses
a write past either; a command after which it is full is the limit. Where that cannot be
made (`confine` said why), a watched quota stands in: the writable layer's size (`SizeRw` of
`GET /containers/{id}/json?size=1`) is checked while commands run and after them, and a
container past it is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clotho.errors import LimitExceeded, SandboxError
from clotho.sandbox.host import quota

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


# Processes a container keeps beyond its slots' shares: the harness's own execs (slot shells
# starting, clean-up, fresh verifier processes), so a slot at its limit never starves them.
SLOT_PIDS_RESERVE = 64
MIN_SLOT_PIDS = 32


def slot_pids(pids_limit: int | None, slots: int) -> int | None:
    """One slot's share of a container's processes (None: no limit configured)."""
    if pids_limit is None:
        return None
    return max(MIN_SLOT_PIDS, (pids_limit - SLOT_PIDS_RESERVE) // slots)


def container_pids(pids_limit: int | None, slots: int) -> int | None:
    """The container's pids limit with `slots` slots: the configured one, raised when the
    slots' shares and the reserve need more (a share never reaches the container's limit)."""
    share = slot_pids(pids_limit, slots)
    if pids_limit is None or share is None:
        return pids_limit
    return max(pids_limit, share * slots + SLOT_PIDS_RESERVE)


class SlotCgroup:
    """A slot's own memory and pids cgroups, children of its container's (cgroup v1, a local
    daemon, a harness allowed to write the host's cgroup tree).

    The slot's shell is moved in once started (idle: nothing of it forks meanwhile), so
    everything it starts is counted here and nowhere else: its own pids limit (a fork bomb
    starves only itself) and, v1 counting an OOM kill in the victim's cgroup only, an OOM
    kill of one of its processes is its own, whatever the command's exit code hid. Inside,
    the container's /sys/fs/cgroup is read-only, so nothing the slot does moves it out.
    runc removes these folders with the container; `remove` does it for a slot closed before.
    """

    def __init__(
        self, dirs: dict[str, Path], name: str, pids_max: int | None, memory_mb: int | None
    ) -> None:
        self.memory = dirs["memory"] / name
        self.pids = dirs["pids"] / name
        self.pids_max = pids_max
        self.memory_mb = memory_mb  # the container's, shared with the neighbours
        self._container = ""
        self._fds: dict[str, int | None] = {}
        self._base = (0, 0)

    @classmethod
    def create(
        cls,
        dirs: dict[str, Path] | None,
        container_id: str,
        name: str,
        pids_max: int | None,
        memory_mb: int | None = None,
    ) -> SlotCgroup | None:
        """The slot's cgroups, or None where they cannot be made (no host cgroup folders,
        cgroup v2, no right to write them): the slot then shares its container's counters."""
        if not dirs or "memory" not in dirs or "pids" not in dirs:
            return None
        if not (dirs["memory"] / "memory.oom_control").exists():  # v2: one tree, see above
            return None
        group = cls(dirs, name, pids_max, memory_mb)
        group._container = container_id
        try:
            for folder in (group.memory, group.pids):
                folder.mkdir()
            if pids_max is not None:
                (group.pids / "pids.max").write_text(str(pids_max))
        except OSError as exc:
            log.info("slot cgroups under %s unavailable (%s): counters are shared", dirs, exc)
            group.remove()
            return None
        group._fds = {
            "oom": _open(group.memory / "memory.oom_control"),
            "pids": _open(group.pids / "pids.events"),
        }
        group._base = group.counters()
        return group

    def counters(self) -> tuple[int, int]:
        return _read_counter(self._fds.get("oom"), "oom_kill"), _read_counter(
            self._fds.get("pids"), "max"
        )

    def adopt(self, pids: list[int]) -> None:
        """Move these host processes (the slot's idle shell and its parents) in; only
        processes of this container are ever moved."""
        for pid in pids:
            try:
                if self._container not in Path(f"/proc/{pid}/cgroup").read_text():
                    continue
                (self.memory / "cgroup.procs").write_text(str(pid))
                (self.pids / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue
            except OSError as exc:
                if not Path(f"/proc/{pid}").exists():
                    continue
                raise SandboxError(f"cannot move process {pid} into {self.pids}: {exc}") from exc

    def hit(self) -> str | None:
        """What the slot's own limits refused since it started, if anything."""
        oom, pids = self.counters()
        if oom > self._base[0]:
            return (
                f"the sandbox ran out of memory (limit {self.memory_mb} MB, shared with the "
                "container's other slots): the kernel killed one of its processes"
            )
        if pids > self._base[1]:
            return f"the sandbox hit its process limit ({self.pids_max}): a fork was refused"
        return None

    def members(self) -> list[int]:
        try:
            text = (self.pids / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(line) for line in text.split()]

    def kill_all(self, timeout: float = 30.0) -> list[int]:
        """SIGKILL every process in the slot's cgroup, whatever its uid or environment says;
        forks are refused first (pids.max 0), so one pass reaches them all; then wait (a
        kill takes a moment to land) until none is alive. Blocking. Returns what is left."""
        with contextlib.suppress(OSError):
            (self.pids / "pids.max").write_text("0")
        deadline = time.monotonic() + timeout
        pause = 0.002
        while left := [p for p in self.members() if not _dead(p)]:
            if time.monotonic() > deadline:
                return left
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(pause)  # a thread polling: no event says a process has exited
            pause = min(pause * 2, 0.1)
        return []

    def remove(self) -> None:
        """Close the counters and remove the folders (empty by now); idempotent."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        for folder in (self.memory, self.pids):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _dead(pid: int) -> bool:
    """Gone or a zombie (killed, waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2 :][:1] in (b"Z", b"X")


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
        self.disk: quota.Disk | None = None  # the writable layer's own file system

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
        if self.storage_bytes is not None:
            from clotho.sandbox.docker.quota import disk_in

            self.disk = await asyncio.to_thread(disk_in, info, self.storage_bytes >> 20)

    def pids_current(self) -> int | None:
        """Tasks in the container now (its pids cgroup, readable by anyone; None for a
        remote daemon)."""
        pids = (self._dirs or {}).get("pids")
        if pids is None:
            return None
        try:
            return int((pids / "pids.current").read_text())
        except (OSError, ValueError):
            return None

    def slot_cgroups_possible(self) -> bool:
        """Whether slots can get cgroups of their own here (see `SlotCgroup.create`)."""
        dirs = self._dirs or {}
        return (
            "memory" in dirs
            and "pids" in dirs
            and (dirs["memory"] / "memory.oom_control").exists()
            and all(os.access(dirs[k], os.W_OK) for k in ("memory", "pids"))
        )

    def slot_cgroup(self, name: str, pids_max: int | None) -> SlotCgroup | None:
        """A slot's own cgroups under this container's (see `SlotCgroup`), or None."""
        return SlotCgroup.create(self._dirs, str(self.container.id), name, pids_max, self.memory_mb)

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
        if self.hit is None and (disk or self.disk is not None):
            await self._check_disk()
        self.raise_if_hit(who)

    async def _check_disk(self) -> None:
        if self.storage_bytes is None:
            return
        self._last_disk = time.monotonic()
        if self.disk is not None:  # enforced: full is the limit (statvfs, a few us)
            full = self.disk.full()
            if full is not None:
                await self._over(
                    f"the sandbox used its disk's inode limit of {self.disk.inodes} files"
                    if full == "inodes"
                    else f"the sandbox filled its disk limit of {self.storage_bytes >> 20} MB"
                )
            return
        used = await self.disk_used()
        if used > self.storage_bytes:
            await self._over(
                f"the sandbox wrote {used >> 20} MB, past its disk limit of "
                f"{self.storage_bytes >> 20} MB"
            )

    async def _over(self, hit: str) -> None:
        """The disk limit broke the container: name whose files they are, and kill it."""
        if self.culprit is not None:  # shared by slots: whose files are they?
            try:
                self.hit_by = await self.culprit()
            except Exception as exc:
                log.warning("finding the slot that filled %s failed: %s", self.container.id, exc)
        self.hit = hit
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
        if self.storage_bytes is None or self.hit is not None or self.disk is not None:
            return None  # nothing to watch, or the kernel enforces it
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
