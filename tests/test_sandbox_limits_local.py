"""Limits of local sandboxes (sandbox/local/limits.py) with real bubblewrap sandboxes and cgroups:
memory, processes, storage, CPU quota, defaults, the task's values, and no cgroup left over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tests.sandbox_fixtures import image_blocks, loop_backing, mounts_at, requires_bwrap
from tests.support import PATIENCE_S, wait_until

from clotho.errors import LimitExceeded
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.backends import EnvironmentSpec
from clotho.sandbox.host import quota
from clotho.sandbox.host.cgroups import available
from clotho.sandbox.host.state import make_state_dir, remove_state_dir
from clotho.sandbox.local import limits
from clotho.sandbox.local.backend import LocalBackend
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.local.config import DEFAULT_LOCAL_MEMORY_MB, DEFAULT_LOCAL_STORAGE_MB
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import load_task

CGROUPS = Path("/sys/fs/cgroup")

pytestmark = [
    pytest.mark.bwrap,
    requires_bwrap,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(available(c) for c in ("memory", "pids", "cpu", "freezer")),
        reason="cgroup limits need root and cgroup v1 memory, pids, cpu and freezer hierarchies",
    ),
]


def cgroup(controller: str, name: str) -> Path:
    return CGROUPS / controller / "clotho" / name


def leftover_cgroups(name: str) -> list[Path]:
    return [p for p in CGROUPS.glob(f"*/clotho/{name}") if p.exists()]


async def until_raises(call: Callable[[], Awaitable[object]]) -> None:
    """Call `call` again and again until it raises (a watcher's verdict reaching the next
    command); returns without raising only if it never did within the tests' patience."""

    async def raised() -> bool:
        await call()
        return False

    await wait_until(raised)


@pytest.fixture
async def open_limited(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    """Open bwrap sandboxes with the given limits; each is closed and must leave no cgroup."""
    opened: list[BwrapSandbox] = []

    async def make(**limits: object) -> BwrapSandbox:
        config = LocalSandboxConfig(state_dir=str(tmp_path / "state"), **limits)
        sb = await open_sandbox(config, labels={"test": "limits"})
        assert isinstance(sb, BwrapSandbox)
        opened.append(sb)
        return sb

    yield make
    for sb in opened:
        await sb.close()
        assert leftover_cgroups(sb.state.name) == []
        assert not sb.state.exists()
        assert mounts_at(sb.state) == []
        if sb.limits.disk is not None:  # its loop device lets go of the image (the
            # kernel may finish that after the detach)
            device, state = sb.limits.disk.device, str(sb.state)
            assert await wait_until(lambda d=device, s=state: s not in loop_backing(d))


# --- memory --------------------------------------------------------------------------------


async def test_memory_beyond_the_limit_is_limit_exceeded(open_limited) -> None:
    """A process killed for memory is a limit exceeded, even when the shell lives through
    it: the trial fails with kind `limit`, as on Docker, and every later call says so."""
    sb = await open_limited(memory_mb=128)
    mem = cgroup("memory", sb.state.name)
    assert (mem / "memory.limit_in_bytes").read_text().strip() == str(128 << 20)
    assert (mem / "memory.memsw.limit_in_bytes").read_text().strip() == str(128 << 20)
    with pytest.raises(LimitExceeded, match="memory limit of 128 MB reached"):
        await sb.exec("head -c 300M /dev/zero | tail; echo rc=$?", timeout=PATIENCE_S * 4)
    assert int((mem / "agent" / "memory.oom_control").read_text().split()[-1]) >= 1
    with pytest.raises(LimitExceeded, match="memory limit"):
        await sb.exec("echo again")


async def test_memory_within_the_limit_is_no_limit(open_limited) -> None:
    sb = await open_limited(memory_mb=128)
    again = await sb.exec("python3 -c 'x = bytearray(32 << 20); print(len(x))'")
    assert again.ok and again.stdout == f"{32 << 20}\n" and "clotho" not in again.stderr


async def test_memory_the_shell_cannot_survive_is_limit_exceeded(open_limited) -> None:
    sb = await open_limited(memory_mb=128)
    # /tmp is a tmpfs: its pages are charged to the sandbox and no kill frees them, so the
    # shell may die too; either way the command is the limit's.
    with pytest.raises(LimitExceeded, match="memory limit of 128 MB reached"):
        await sb.exec("head -c 300M /dev/zero > /tmp/fill; echo survived", timeout=60)
    with pytest.raises(LimitExceeded, match="memory limit"):
        await sb.exec("echo again")


# --- processes -----------------------------------------------------------------------------


def processes_in(pid_ns: str) -> int:
    """Host processes in the pid namespace `pid_ns` (a sandbox's, as `readlink
    /proc/self/ns/pid` names it inside): the sandbox's own, whatever else the host runs."""
    found = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                found += os.readlink(f"/proc/{entry}/ns/pid") == pid_ns
    return found


async def test_a_fork_bomb_is_contained_and_ends_the_sandbox(open_limited) -> None:
    sb = await open_limited(pids_limit=64)
    pids = cgroup("pids", sb.state.name)
    assert (pids / "pids.max").read_text().strip() == "64"
    pid_ns = (await sb.exec("readlink /proc/self/ns/pid")).stdout.strip()
    assert pid_ns.startswith("pid:[") and pid_ns != os.readlink("/proc/self/ns/pid")
    before = processes_in(pid_ns)  # the idle sandbox: its shell and bubblewrap's init
    assert before >= 1
    peaks: list[int] = []

    async def look() -> None:
        peaks.append(int((pids / "pids.current").read_text()))
        await sb.exec("true", timeout=PATIENCE_S)

    with pytest.raises(LimitExceeded, match="process limit of 64 reached"):
        await sb.exec(":(){ :|:& };:", timeout=10)
        await until_raises(look)
    assert max(peaks, default=0) <= 64
    assert await wait_until(lambda: int((pids / "pids.current").read_text()) <= 1)
    # Nothing of the bomb is left on the host: judged by the sandbox's own pid namespace,
    # so other suites' processes on a busy machine do not count.
    assert await wait_until(lambda: processes_in(pid_ns) <= before)
    with pytest.raises(LimitExceeded, match="process limit"):
        await sb.exec("echo gone")


async def test_a_transient_burst_of_forks_is_limit_exceeded(open_limited) -> None:
    """Forks refused by the process limit are a limit exceeded, even when the burst passes."""
    sb = await open_limited(pids_limit=32)
    with pytest.raises(LimitExceeded, match="process limit of 32 reached"):
        await sb.exec("for i in $(seq 60); do sleep 1 & done; wait; echo done", timeout=30)


# --- storage -------------------------------------------------------------------------------


async def test_a_file_beyond_the_storage_limit_fails_at_once(open_limited) -> None:
    """RLIMIT_FSIZE: the write fails right away (SIGXFSZ), wherever the file is. (In /tmp, a
    tmpfs counted as memory, so the storage watch stays out of it here.)"""
    sb = await open_limited(storage_mb=64)
    result = await sb.exec("head -c 100M /dev/zero > /tmp/big; echo rc=$?; stat -c %s /tmp/big")
    assert result.stdout.split() == ["rc=153", str(64 << 20)]  # SIGXFSZ, cut at the limit
    assert "File size limit exceeded" in result.stderr
    assert (await sb.exec("rm /tmp/big && echo removed")).stdout == "removed\n"
    assert sb.limits.tripped is None


async def test_files_adding_up_beyond_the_storage_limit_end_the_sandbox(open_limited) -> None:
    """The third file does not fit: the kernel refuses it (ENOSPC), and the command that
    filled the disk ends the sandbox as a limit, every later call too."""
    sb = await open_limited(storage_mb=64)
    assert sb.limits.disk is not None
    with pytest.raises(LimitExceeded, match="storage limit of 64 MB reached"):
        await sb.exec("for i in 1 2 3; do head -c 30M /dev/urandom > /app/f$i; done", timeout=60)
    assert sb.limits.disk.free()[0] < 1 << 20
    with pytest.raises(LimitExceeded, match="storage limit"):
        await sb.exec("true")


async def test_fallocate_past_the_quota_fails_inside_and_the_host_gives_no_more(
    open_limited,
) -> None:
    """Six `fallocate`s of 400 MB against a 500 MB quota (each file under the file size
    limit): the second is refused inside, the command is a limit, and the host disk holds
    no more than the sandbox's image."""
    sb = await open_limited(storage_mb=500)
    assert sb.limits.disk is not None
    fill = "for i in 1 2 3 4 5 6; do fallocate -l 400M /app/f$i; echo $? >> /app/rc; done"
    with pytest.raises(LimitExceeded, match="storage limit of 500 MB reached"):
        await sb.exec(fill, timeout=120)
    assert (sb.state / "app" / "rc").read_text().split() == ["0", "1", "1", "1", "1", "1"]
    allocated = sum(f.stat().st_blocks * 512 for f in (sb.state / "app").glob("f*"))
    assert 400 << 20 <= allocated <= (500 + 16) << 20
    size = quota.image_bytes(500 << 20, quota.inodes_for(500 << 20))
    st = os.statvfs(sb.state)
    assert st.f_blocks * st.f_frsize <= size
    assert image_blocks(sb.state) <= size  # what the host disk gave the sandbox


async def test_empty_files_past_the_inode_limit_end_the_sandbox(open_limited) -> None:
    """200,000 empty files use almost no bytes; the sandbox's file system has 32,000
    inodes for 500 MB, so the kernel refuses the rest, and the host's inodes are not used."""
    sb = await open_limited(storage_mb=500)
    assert sb.limits.disk is not None and sb.limits.disk.inodes == 32000
    make = (
        "python3 -c 'import os\n"
        "n = 0\n"
        "try:\n"
        '    for i in range(200000): os.close(os.open(f"/app/e{i}", os.O_CREAT | os.O_WRONLY)); n += 1\n'
        "except OSError as e: print(n, e.errno)' > /app/made"
    )
    with pytest.raises(LimitExceeded, match="inode limit of 32000 files reached"):
        await sb.exec(make, timeout=300)
    made, err = (sb.state / "app" / "made").read_text().split()
    assert int(err) == 28 and 30000 < int(made) < 32000  # ENOSPC near the limit
    assert os.statvfs(sb.state).f_favail == 0
    assert os.stat(sb.state / "app").st_dev != os.stat(sb.state.parent).st_dev  # not the host's
    with pytest.raises(LimitExceeded, match="inode limit"):
        await sb.exec("true")


async def test_writes_below_the_storage_limit_are_fine(open_limited) -> None:
    sb = await open_limited(storage_mb=64)
    assert sb.limits.disk is not None
    assert (await sb.exec("head -c 40M /dev/zero > /usr/local/f && echo ok")).stdout == "ok\n"
    assert (await sb.exec("stat -c %s /usr/local/f")).stdout == f"{40 << 20}\n"
    st = os.statvfs(sb.state)
    assert (st.f_blocks - st.f_bfree) * st.f_frsize >= 40 << 20  # on the sandbox's disk
    assert (await sb.exec("rm /usr/local/f && echo removed")).stdout == "removed\n"
    assert sb.limits.tripped is None


# --- defaults, cpu, the task's values ----------------------------------------------------------


async def test_defaults_apply_when_nothing_is_set(open_limited) -> None:
    sb = await open_limited()
    name = sb.state.name
    memory = cgroup("memory", name) / "memory.limit_in_bytes"
    assert memory.read_text().strip() == str(DEFAULT_LOCAL_MEMORY_MB << 20)
    assert (cgroup("pids", name) / "pids.max").read_text().strip() == "4096"
    assert not cgroup("cpu", name).exists()  # no CPU quota unless asked for
    blocks = DEFAULT_LOCAL_STORAGE_MB << 10  # bash counts KiB
    assert (await sb.exec("ulimit -f")).stdout == f"{blocks}\n"
    # Every process of the sandbox is in its cgroups.
    agent = [int(p) for p in (cgroup("pids", name) / "agent" / "cgroup.procs").read_text().split()]
    outer = sb._shell.pid
    assert outer in agent
    assert (await sb.exec("sleep 30 & echo started")).stdout == "started\n"
    assert await wait_until(
        lambda: (
            len((cgroup("memory", name) / "agent" / "cgroup.procs").read_text().split())
            > len(agent)
        )
    )


async def test_cpus_set_a_cpu_quota(open_limited) -> None:
    sb = await open_limited(cpus=0.5)
    cpu = cgroup("cpu", sb.state.name)
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
    assert str(sb._shell.pid) in (cpu / "agent" / "cgroup.procs").read_text().split()


async def test_the_tasks_limits_reach_the_sandbox_through_prepare(
    make_task, tmp_path: Path
) -> None:
    path = make_task(toml_extra='[environment]\nmemory = "2G"\ncpus = 1.5\nstorage = "1G"\n')
    spec = environment_spec(load_task(path))
    base = LocalSandboxConfig(state_dir=str(tmp_path / "state"))
    async with SlotPool(PoolConfig()) as pool:
        prepared = await pool.prepare(base, spec)
        config = prepared.config
        assert isinstance(config, LocalSandboxConfig)
        assert (config.memory_mb, config.cpus, config.storage_mb) == (2048, 1.5, 1024)
        assert not prepared.workspace_in_image
        async with pool.lease(config) as sb:
            assert isinstance(sb, BwrapSandbox)
            name = sb.state.name
            limit = (cgroup("memory", name) / "memory.limit_in_bytes").read_text()
            assert limit.strip() == str(2048 << 20)
            quota = (cgroup("cpu", name) / "cpu.cfs_quota_us").read_text()
            assert quota.strip() == "150000"
            assert (await sb.exec("ulimit -f")).stdout == f"{1024 << 10}\n"  # bash counts KiB
        assert await wait_until(lambda: leftover_cgroups(name) == [])


async def test_the_base_configs_own_limits_win_over_the_tasks() -> None:
    spec = EnvironmentSpec(name="t", cpus=4, memory_mb=2048, storage_mb=4096)
    base = LocalSandboxConfig(memory_mb=512, cpus=1)
    async with SlotPool(PoolConfig()) as pool:
        config = (await pool.prepare(base, spec)).config
    assert isinstance(config, LocalSandboxConfig)
    assert (config.memory_mb, config.cpus, config.storage_mb) == (512, 1, 4096)


# --- no cgroup left behind -------------------------------------------------------------------


async def test_close_removes_the_cgroups(open_limited) -> None:
    sb = await open_limited(cpus=1)
    name = sb.state.name
    found = {p.parent.parent.name for p in leftover_cgroups(name)}
    assert {"memory", "pids", "cpu", "freezer"} <= found
    await sb.exec("sleep 60 >/dev/null 2>&1 &")
    await sb.close()
    assert leftover_cgroups(name) == []


_OWNER = textwrap.dedent(
    """\
    import asyncio, sys
    from clotho.sandbox import LocalSandboxConfig, open_sandbox
    from clotho.sandbox.host import quota
    from clotho.sandbox.local import limits

    async def main():
        sb = await open_sandbox(LocalSandboxConfig(state_dir=sys.argv[1]), {})
        await sb.exec("sleep 300 >/dev/null 2>&1 &")
        print(sb.state.name, flush=True)
        await asyncio.Event().wait()  # alive until killed

    asyncio.run(main())
    """
)


async def test_cgroups_of_a_killed_owner_are_reaped(tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER, str(state), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert owner.stdout is not None
        name = (await asyncio.wait_for(owner.stdout.readline(), PATIENCE_S)).decode().strip()
        assert name
    finally:
        owner.send_signal(signal.SIGKILL)
        await owner.wait()
    assert leftover_cgroups(name) and (state / name).exists()  # what the SIGKILL left
    assert mounts_at(state / name) == [str(state / name)]  # its own file system too
    pool = SlotPool(PoolConfig())
    async with pool, pool.lease(LocalSandboxConfig(state_dir=str(state))) as sb:
        assert (await sb.exec("echo in")).stdout == "in\n"
        assert await wait_until(lambda: leftover_cgroups(name) == [])
        assert await wait_until(lambda: not (state / name).exists())
        assert mounts_at(state / name) == []


async def test_listing_sweeps_empty_cgroups_whose_folder_is_gone(tmp_path: Path) -> None:
    """An exit cleanup removes the folders only; their empty cgroups go at the next listing,
    and not before they are a minute old (a sandbox being made has none of its processes)."""
    name = f"clotho-sbx-sweeptest-{os.getpid()}"
    made = [cgroup(c, name) for c in ("memory", "pids", "freezer")]
    for path in made:
        (path / "agent").mkdir(parents=True)
    try:
        await LocalBackend(str(tmp_path)).records()
        assert all(path.exists() for path in made)  # too young
        for path in made:
            os.utime(path, (time.time() - 3600, time.time() - 3600))
        await LocalBackend(str(tmp_path)).records()
        assert leftover_cgroups(name) == []
    finally:
        for path in made:
            for sub in (path / "agent", path):
                with contextlib.suppress(OSError):
                    sub.rmdir()


async def test_a_background_writer_is_refused_and_the_next_command_is_a_limit(
    open_limited,
) -> None:
    sb = await open_limited(storage_mb=64)
    assert sb.limits.disk is not None
    # The writer starts after the command that launched it has returned: at a file it makes.
    await sb.exec(
        "(until [ -e /app/go ]; do sleep 0.01; done; "
        "for i in 1 2 3; do head -c 30M /dev/zero > /app/bg$i; done; touch /app/done) "
        ">/dev/null 2>&1 &"
    )
    await sb.exec("touch /app/go")
    assert await wait_until(lambda: (sb.state / "app" / "done").exists())
    assert sb.limits.disk.full() == "bytes"  # the kernel stopped it at the limit
    with pytest.raises(LimitExceeded, match="storage limit of 64 MB reached"):
        await sb.exec("echo after")


async def test_without_cgroup_limits_storage_is_still_enforced(open_limited) -> None:
    sb = await open_limited(cgroup_limits=False, storage_mb=64)
    assert not cgroup("memory", sb.state.name).exists()
    assert not cgroup("pids", sb.state.name).exists()
    with pytest.raises(LimitExceeded, match="storage limit of 64 MB reached"):
        await sb.exec("for i in 1 2 3; do head -c 30M /dev/zero > /app/f$i; done", timeout=60)


# --- where no loop device can be mounted: the watch ------------------------------------------


@pytest.fixture
def no_loop_devices(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A double for a host where the state folder cannot be a file system of its own (this
    one can): `quota.unavailable` says why, as it would there."""
    monkeypatch.setattr(quota, "unavailable", lambda: "no loop devices (test double)")
    monkeypatch.setattr(limits, "_reported", set())
    caplog.set_level(logging.WARNING, logger="clotho.sandbox.local.limits")


async def test_without_loop_devices_storage_is_watched_and_said_once(
    open_limited, no_loop_devices: None, caplog: pytest.LogCaptureFixture
) -> None:
    first = await open_limited(storage_mb=64)
    second = await open_limited(storage_mb=64)
    assert first.limits.disk is None and second.limits.disk is None
    assert mounts_at(first.state) == []
    said = [r.getMessage() for r in caplog.records if "watched, not enforced" in r.message]
    assert said == [
        "local sandboxes' storage limit is watched, not enforced, and inodes are not "
        "limited: no loop devices (test double)"
    ]
    with pytest.raises(LimitExceeded, match="storage limit of 64 MB reached"):
        await first.exec("for i in 1 2 3; do head -c 30M /dev/zero > /app/f$i; done", timeout=60)
        await until_raises(lambda: first.exec("true"))
    assert (await second.exec("echo fine")).stdout == "fine\n"


async def test_without_loop_devices_writes_below_the_limit_are_seen_and_fine(
    open_limited, no_loop_devices: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    looks: list[int] = []
    real = limits.disk_usage

    def counted(root: Path) -> int:
        looks.append(real(root))
        return looks[-1]

    monkeypatch.setattr(limits, "disk_usage", counted)
    sb = await open_limited(storage_mb=64)
    assert (await sb.exec("head -c 40M /dev/zero > /usr/local/f && echo ok")).stdout == "ok\n"
    assert await wait_until(lambda: any(used >= 40 << 20 for used in looks))  # it was seen
    assert sb.limits.tripped is None


async def test_a_start_cancelled_while_its_disk_is_mounted_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SandboxLimits.make` mounts in a thread; cancelled meanwhile, it waits for the thread
    and removes the cgroups and the mount it made."""
    entered = threading.Event()
    cancelled = threading.Event()  # the mount goes on only once the start was cancelled
    real = quota.Disk.mount_over

    def mount_over(*args: object, **kwargs: object) -> quota.Disk:
        entered.set()
        cancelled.wait(PATIENCE_S)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(quota.Disk, "mount_over", mount_over)
    state = make_state_dir(str(tmp_path / "state"), {"test": "limits"}, claim_uid=True)
    try:
        config = LocalSandboxConfig(state_dir=str(tmp_path / "state"), storage_mb=64)
        task = asyncio.create_task(limits.SandboxLimits.make(config, state, ("freezer",)))
        assert await wait_until(entered.is_set)
        task.cancel()  # cancels the shielded wait at once; the thread goes on only after
        cancelled.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert mounts_at(state) == []
        assert leftover_cgroups(state.name) == []
    finally:
        remove_state_dir(state)
