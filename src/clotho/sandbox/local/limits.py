"""Resource limits of local sandboxes: memory, processes and CPU in cgroups, a watched
storage quota, and the counters that tell a limit was hit.

Cgroups: the sandbox's cgroups of `cgroups.py` (`/sys/fs/cgroup/<controller>/clotho/<name>`,
its processes in `<name>/agent`, verification in `<name>/fresh-*`) in the memory, pids and
(with `cpus`) cpu controllers; the limits are set on `<name>`, so they bound the agent and
the verifier together. The processes join at start: the `/bin/sh` of `enter_argv` in front of
the sandbox's argv writes its own pid into each `cgroup.procs` (and here also sets
RLIMIT_FSIZE) before it execs, so everything the sandbox forks inherits both. cgroup v1 only,
like `cgroups.py`: this host and CI mount every controller on v1 and leave the v2 mount
empty; a host with no writable v1 hierarchy gets a `SandboxError` unless
`cgroup_limits` is off.

Storage is enforced by the kernel where it can be (`quota.py`): the state folder (the
overlay's upper layer, the workspace, the transfer folder) is a file system of its own, as
large as the byte limit with `quota.BYTES_PER_INODE` per inode, loop-mounted from a sparse
image. A write past either fails inside with ENOSPC and the host disk never gives more; the
next command (or transfer) that finds it full ends the sandbox with `LimitExceeded`, a
failure of kind `limit`, as the kernel's other limits do. Where no loop device can be
mounted (not root), the limit is watched instead, and said so once at run time: a thread
sums the blocks allocated under the state folder, again before the headroom could be used
up at `WRITE_RATE` (and never more than 5% of a core), and kills the sandbox when it is past
the limit; inodes are not limited then. RLIMIT_FSIZE stops a single file beyond the limit at
once (EFBIG, SIGXFSZ) either way, wherever it is written (/tmp too, a tmpfs in memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clotho.errors import LimitExceeded, SandboxError
from clotho.sandbox.base import ExecResult
from clotho.sandbox.host import cgroups, quota
from clotho.sandbox.host.cgroups import kill_named, procs, remove_named
from clotho.sandbox.host.leases import STATE_PREFIX
from clotho.sandbox.local.config import (
    DEFAULT_LOCAL_MEMORY_MB,
    DEFAULT_LOCAL_STORAGE_MB,
    LocalSandboxConfig,
)

log = logging.getLogger(__name__)

CPU_PERIOD_US = 100_000
# A bound on how fast a sandbox can fill its disk (page cache included): the storage
# watcher looks again before the headroom could be used up at this rate.
WRITE_RATE = 2 << 30
_MIN_INTERVAL_S = 0.2
_MAX_INTERVAL_S = 10.0
_WALK_SHARE = 20  # wait at least this many times as long as the last walk took
_reported: set[str] = set()  # why storage is only watched, said once per process


def _report_watched(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log.warning(
            "local sandboxes' storage limit is watched, not enforced, and inodes are not "
            "limited: %s",
            reason,
        )


def controllers(config: LocalSandboxConfig) -> tuple[str, ...]:
    """The cgroup controllers the limits of `config` need."""
    if not config.cgroup_limits:
        return ()
    return ("memory", "pids", *(("cpu",) if config.cpus else ()))


def _open_counter(path: Path) -> int:
    """An fd on a cgroup file, read again with `pread` on every exec (about 1 us here,
    against 8-18 us to open and read it each time); -1 if it cannot be opened."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def _read_counter(fd: int, key: str) -> int:
    """The `key value` line of a flat-keyed cgroup file open as `fd`; 0 when it is gone."""
    if fd < 0:
        return 0
    try:
        text = os.pread(fd, 4096, 0)
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == key.encode():
            return int(value)
    return 0


def sweep_empty(min_age_s: float = 60.0) -> list[str]:
    """Remove clotho's sandbox cgroups that hold no process and are older than `min_age_s`
    (a live sandbox always has its shell in them, from a few ms after they are made): what
    a cleanup that removed the state folder but not the cgroups left. Returns their names."""
    now = time.time()
    swept = []
    for controller_dir in cgroups.CGROUP_ROOT.glob(f"*/{cgroups.PARENT}"):
        try:
            candidates = [p for p in controller_dir.iterdir() if p.name.startswith(STATE_PREFIX)]
        except OSError:
            continue
        for group in candidates:
            with contextlib.suppress(OSError):
                if now - group.stat().st_mtime < min_age_s or group.name in swept:
                    continue
                subs = [group, *(p for p in group.iterdir() if p.is_dir())]
                if not any(procs(sub) for sub in subs):
                    cgroups.destroy_named(group.name)
                    swept.append(group.name)
    return swept


# -- storage ------------------------------------------------------------------------------


def disk_usage(root: Path) -> int:
    """Bytes allocated under `root`, links never followed, hard links counted once."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [str(root)]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:  # removed or replaced meanwhile
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                except OSError:
                    continue
                if st.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


# -- one sandbox ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """The limits one local sandbox runs with (the config's values, defaults filled in)."""

    memory_mb: int
    pids: int
    storage_mb: int
    cpus: float | None

    @property
    def inodes(self) -> int:
        """The file limit that goes with the storage limit."""
        return quota.inodes_for(self.storage_mb << 20)

    @classmethod
    def of(cls, config: LocalSandboxConfig) -> Limits:
        return cls(
            memory_mb=config.memory_mb or DEFAULT_LOCAL_MEMORY_MB,
            pids=config.pids_limit,
            storage_mb=config.storage_mb or DEFAULT_LOCAL_STORAGE_MB,
            cpus=config.cpus,
        )


@dataclass
class _Counters:
    oom_kills: int = 0
    pids_max: int = 0


@dataclass
class SandboxLimits:
    """The limits of one local sandbox: its cgroups, its storage watch, its counters.

    `create` makes the cgroups and sets the limits, `wrap` puts the join in front of the
    sandbox's argv, `watch` starts the storage watch, `guard` turns a limit hit during `exec`
    into a note or a `LimitExceeded`, `close` stops the watch and removes the cgroups.
    """

    limits: Limits
    state: Path
    cgroups: cgroups.SandboxCgroups | None = None
    tripped: str | None = None  # why the sandbox was killed for a limit
    _seen: _Counters = field(default_factory=_Counters)
    _watch: asyncio.Task[None] | None = None
    _shell_pid: int | None = None
    _enforced: bool = False  # memory and pids limits are set on `cgroups`
    _last_hit: str | None = None  # the last limit a command hit
    _fds: dict[str, int] = field(default_factory=dict)  # open counter files
    disk: quota.Disk | None = None  # the state folder's own file system, if it has one

    @classmethod
    async def make(
        cls, config: LocalSandboxConfig, state: Path, also: Sequence[str] = ()
    ) -> SandboxLimits:
        """`create` in a thread (it mounts the state folder's file system: 5-50 ms, and a
        `mkfs` the first time), off the event loop. Cancelled meanwhile, it waits for the
        thread and undoes what it made, so no cgroup or mount outlives the cancellation."""
        made = asyncio.ensure_future(asyncio.to_thread(cls.create, config, state, also))
        try:
            return await asyncio.shield(made)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                limits = await made
                await asyncio.to_thread(limits.remove)
                if limits.disk is not None:
                    await asyncio.to_thread(quota.detach, state)
            raise

    @classmethod
    def create(
        cls, config: LocalSandboxConfig, state: Path, also: Sequence[str] = ()
    ) -> SandboxLimits:
        """The sandbox's cgroups (`cgroups.SandboxCgroups`, named after its state folder) in
        the controllers its limits need plus `also` (the caller's, e.g. the freezer), with the
        limits set. Without cgroups to write, `cgroups` is None, and a config that asks for
        cgroup limits gets a SandboxError that says how to run without them."""
        self = cls(Limits.of(config), state)
        self._mount_disk()
        needed = controllers(config)
        wanted = tuple(dict.fromkeys((*also, *needed)))
        if not wanted:
            return self
        self.cgroups = cgroups.SandboxCgroups.create(state.name, wanted)
        if self.cgroups is None:
            if not needed:
                return self
            missing = [c for c in needed if not cgroups.available(c)]
            raise SandboxError(
                "cannot enforce the local sandbox's limits: no writable cgroup v1 hierarchy "
                f"for {', '.join(missing or needed)} (run as root, or set "
                "sandbox.cgroup_limits=false to run without memory, process and CPU limits)"
            )
        try:
            if needed:
                self._configure()
        except BaseException as exc:
            self.remove()
            if isinstance(exc, OSError):
                raise SandboxError(f"cannot set the sandbox's cgroup limits: {exc}") from exc
            raise
        self._enforced = bool(needed)
        if needed:
            agent = cgroups.AGENT
            self._fds["oom"] = _open_counter(
                self.cgroups.path("memory", agent) / "memory.oom_control"
            )
            self._fds["pids"] = _open_counter(self.cgroups.path("pids", agent) / "pids.events")
        return self

    def _mount_disk(self) -> None:
        """Make the state folder a file system of the storage limit's size (or say once why
        not and leave the limit to the watch). A mount that fails where it should work is a
        SandboxError: the limit is not silently weakened."""
        reason = quota.unavailable()
        if reason is not None:
            _report_watched(reason)
            return
        try:
            self.disk = quota.Disk.mount_over(
                self.state, self.limits.storage_mb << 20, self.limits.inodes
            )
        except OSError as exc:
            raise SandboxError(f"cannot make the sandbox's file system: {exc}") from exc

    def _path(self, controller: str, file: str) -> Path:
        assert self.cgroups is not None
        return self.cgroups.path(controller) / file

    def _configure(self) -> None:
        memory = str(self.limits.memory_mb << 20)
        self._path("memory", "memory.limit_in_bytes").write_text(memory)
        swap = self._path("memory", "memory.memsw.limit_in_bytes")
        if swap.exists():  # swap accounting on: memory plus swap within the same limit
            swap.write_text(memory)
        self._path("pids", "pids.max").write_text(str(self.limits.pids))
        if self.limits.cpus:
            quota = max(1000, int(self.limits.cpus * CPU_PERIOD_US))
            self._path("cpu", "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            self._path("cpu", "cpu.cfs_quota_us").write_text(str(quota))

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """`argv` behind a /bin/sh that caps file sizes at the storage limit (RLIMIT_FSIZE,
        inherited by everything the sandbox starts) and execs it. Goes inside the cgroups'
        `enter_argv`, or outside: either way every process is born under both."""
        blocks = (self.limits.storage_mb << 20) // 512  # sh's ulimit -f counts 512 bytes
        return ["/bin/sh", "-c", f'ulimit -f {blocks} && exec "$@"', "clotho-limits", *argv]

    # -- counters -------------------------------------------------------------------------

    def _counters(self) -> _Counters:
        """The counters of the agent's cgroups: under v1 the kernel counts an OOM kill in the
        victim's cgroup and a failed fork in the forking one, not where the limit is set."""
        return _Counters(
            _read_counter(self._fds.get("oom", -1), "oom_kill"),
            _read_counter(self._fds.get("pids", -1), "max"),
        )

    def _hits(self) -> list[str]:
        """Limits hit since the last look."""
        now, before = self._counters(), self._seen
        self._seen = now
        hits: list[str] = []
        if now.oom_kills > before.oom_kills:
            hits.append(f"memory limit of {self.limits.memory_mb} MB reached")
        if now.pids_max > before.pids_max:
            hits.append(f"process limit of {self.limits.pids} reached")
        if self.disk is not None and (full := self.disk.full()) is not None:
            if full == "inodes":
                hits.append(f"inode limit of {self.disk.inodes} files reached")
            else:
                hits.append(f"storage limit of {self.limits.storage_mb} MB reached")
        self._last_hit = hits[-1] if hits else self._last_hit
        return hits

    async def guard(self, run: Awaitable[ExecResult]) -> ExecResult:
        """Await one command and account for the limits it hit.

        A limit the kernel enforced since the last command (a process killed for memory, a
        fork refused) is `LimitExceeded`, whether the shell lived through it or not: a limit
        exceeded is a failed trial of kind `limit`, on this backend as on Docker, and so is
        every later call; what still runs in the sandbox is killed."""
        try:
            result = await run
        except SandboxError as exc:
            hits = self._hits()
            # A shell killed with the limit hit earlier (a full tmpfs starves it after the
            # command that filled it was reported) died of that limit too.
            self.tripped = self.tripped or (hits[0] if hits else self._last_hit)
            if self.tripped is not None:  # and so on every later call
                raise LimitExceeded(self.tripped) from exc
            raise
        hits = self._hits()
        if self.tripped is not None:
            raise LimitExceeded(self.tripped)
        if not hits:
            return result
        # The sandbox is done with (every later call raises): end what runs in it, so a fork
        # bomb or a hog in the background stops now, not when the sandbox is closed.
        self.tripped = hits[-1]
        await asyncio.to_thread(self.kill)
        raise LimitExceeded(self.tripped)

    # -- storage watch --------------------------------------------------------------------

    def watch(self, shell_pid: int | None) -> None:
        """Watch the state folder's size (a task on the running loop) until `close`, unless
        the kernel enforces it (`disk`)."""
        self._shell_pid = shell_pid
        if self.disk is not None:
            return
        self._watch = asyncio.get_running_loop().create_task(self._watch_storage())

    async def _watch_storage(self) -> None:
        limit = self.limits.storage_mb << 20
        while True:
            started = time.monotonic()
            used = await asyncio.to_thread(disk_usage, self.state)
            took = time.monotonic() - started
            if used > limit:
                self.tripped = f"storage limit of {self.limits.storage_mb} MB reached"
                log.info("%s: %s (%d MB used)", self.state.name, self.tripped, used >> 20)
                await asyncio.to_thread(self.kill)
                return
            interval = min(max((limit - used) / WRITE_RATE, _MIN_INTERVAL_S), _MAX_INTERVAL_S)
            await asyncio.sleep(max(interval, took * _WALK_SHARE))

    # -- ending ---------------------------------------------------------------------------

    def kill(self) -> None:
        """Kill every process of the sandbox, which cannot be used afterwards (blocking).

        `pids.max` 0 first, so a fork bomb cannot refill what is being emptied."""
        if self._enforced:
            kill_named(self.state.name)
        elif self._shell_pid is not None:  # bubblewrap's pid namespace ends with it
            with contextlib.suppress(OSError):  # still ours: its argv names the state folder
                if (
                    str(self.state).encode()
                    in Path(f"/proc/{self._shell_pid}/cmdline").read_bytes()
                ):
                    os.kill(self._shell_pid, signal.SIGKILL)

    async def close(self) -> None:
        """Stop the watch and remove the cgroups, killing what is left in them."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await asyncio.to_thread(self.remove)

    def remove(self) -> None:
        """Remove the cgroups, killing what is left (blocking: call it in a thread)."""
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.cgroups is not None:
            remove_named(self.state.name)
