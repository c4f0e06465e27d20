"""`SlotPool` (sandbox/pool.py) with real sandboxes: bubblewrap ones (fast) and, where the
Docker side matters, containers (skipped with the reason shown when no Docker daemon
answers; in CI, CI=true, their absence fails the test instead)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.sandbox_fixtures import alive, dead_pid, processes_mentioning, requires_bwrap
from tests.support import PATIENCE_S, wait_until

from clotho.errors import SandboxError
from clotho.sandbox import LocalSandboxConfig, Sandbox, open_sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.host.leases import LEASE_EXPIRES, LEASE_FILE, OWNER, STATE_PREFIX
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.pool import PoolConfig, SlotPool


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def config(state: Path) -> LocalSandboxConfig:
    return LocalSandboxConfig(state_dir=str(state))


class CountingOpener:
    """Opens real sandboxes and remembers how many it was asked for."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, config: SandboxConfig, labels: dict[str, str]) -> Sandbox:
        self.calls += 1
        return await open_sandbox(config, labels)


@pytest.fixture
async def opener() -> CountingOpener:
    return CountingOpener()


def make_pool(opener: CountingOpener, **settings: Any) -> SlotPool:
    return SlotPool(PoolConfig(**settings), labels={"clotho.run": "pool-test"}, opener=opener)


@pytest.fixture
async def pool(opener: CountingOpener) -> AsyncIterator[SlotPool]:
    async with make_pool(opener) as p:
        yield p


def state_dir(sandbox: Sandbox) -> Path:
    assert isinstance(sandbox, BwrapSandbox)
    return sandbox.state


# --- acquire / release -----------------------------------------------------------------------


@requires_bwrap
async def test_acquire_and_release(pool: SlotPool, config: LocalSandboxConfig) -> None:
    sb = await pool.acquire(config, labels={"clotho.task": "t1"})
    assert (await sb.exec("echo hi")).stdout == "hi\n"
    lease = json.loads((state_dir(sb) / LEASE_FILE).read_text())
    assert lease["labels"]["clotho.run"] == "pool-test"
    assert lease["labels"]["clotho.task"] == "t1"
    assert pool.stats() == {"in_use": 1, "idle": 0, "starting": 0, "created": 1, "destroyed": 0}
    await pool.release(sb)
    assert pool.stats()["in_use"] == 0
    assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
    assert not state_dir(sb).exists()

    async with pool.lease(config) as leased:
        assert (await leased.exec("pwd")).stdout == "/app\n"
        assert pool.stats()["in_use"] == 1
    assert pool.stats()["in_use"] == 0
    assert await wait_until(lambda: not state_dir(leased).exists())


@requires_bwrap
async def test_a_used_sandbox_is_never_handed_out_again(
    pool: SlotPool, config: LocalSandboxConfig
) -> None:
    first = await pool.acquire(config)
    await first.write_file("marker.txt", b"used")
    await pool.release(first)
    second = await pool.acquire(config)
    assert second is not first
    assert state_dir(second) != state_dir(first)
    with pytest.raises(FileNotFoundError):
        await second.read_file("marker.txt")
    assert (await second.exec("ls -A /app")).stdout == ""
    assert await wait_until(lambda: not state_dir(first).exists())
    with pytest.raises(SandboxError):
        await first.exec("true")  # closed
    # Giving one back unused (reset=False) keeps it for the next acquire of that config.
    await second.write_file("kept.txt", b"kept")
    await pool.release(second, reset=False)
    assert pool.stats()["idle"] == 1
    third = await pool.acquire(config)
    assert third is second
    assert await third.read_file("kept.txt") == b"kept"
    await pool.release(third)


@requires_bwrap
async def test_warm_replacement_is_ready_for_the_next_acquire(
    opener: CountingOpener, config: LocalSandboxConfig
) -> None:
    async with make_pool(opener, warm=1) as pool:
        first = await pool.acquire(config)
        await first.write_file("marker.txt", b"used")
        assert pool.stats()["created"] == 1
        await pool.release(first)
        # The replacement starts in the background, not in a later acquire.
        assert await wait_until(lambda: pool.stats()["idle"] == 1)
        assert pool.stats()["created"] == 2 and opener.calls == 2
        second = await pool.acquire(config)
        assert opener.calls == 2  # taken from the warm slot: nothing created synchronously
        assert second is not first
        with pytest.raises(FileNotFoundError):
            await second.read_file("marker.txt")
        await pool.release(second)
        assert await wait_until(lambda: pool.stats()["idle"] == 1 and pool.stats()["created"] == 3)


@requires_bwrap
async def test_prewarm_respects_max_size(
    opener: CountingOpener, config: LocalSandboxConfig
) -> None:
    async with make_pool(opener, max_size=2) as pool:
        pool.prewarm(config, 5)
        assert pool.stats()["starting"] == 2  # prewarm stops at max_size when it is called
        assert await wait_until(lambda: pool.stats()["idle"] == 2)
        assert pool.stats()["starting"] == 0 and opener.calls == 2  # nothing else on the way
        a = await pool.acquire(config)
        b = await pool.acquire(config)
        assert opener.calls == 2 and a is not b
        await pool.release(a)
        await pool.release(b)


# --- limits ----------------------------------------------------------------------------------


@requires_bwrap
async def test_max_size_makes_acquire_wait_then_time_out(
    opener: CountingOpener, config: LocalSandboxConfig
) -> None:
    async with make_pool(opener, max_size=1) as pool:
        first = await pool.acquire(config)
        waiting = asyncio.create_task(pool.acquire(config))
        # Another acquire waits with it, and gives up at its timeout: the loop ran the
        # waiting one meanwhile, and neither opened a sandbox while the pool was full.
        with pytest.raises(SandboxError, match="max_size 1"):
            await pool.acquire(config, timeout=0.3)
        assert not waiting.done()
        assert opener.calls == 1
        assert pool.stats()["in_use"] == 1 and pool.stats()["starting"] == 0
        await pool.release(first)  # what the waiting acquire was waiting for
        second = await asyncio.wait_for(waiting, PATIENCE_S)
        assert second is not first and opener.calls == 2
        assert (await second.exec("echo ok")).stdout == "ok\n"
        await pool.release(second)


@requires_bwrap
async def test_idle_sandbox_of_another_config_is_evicted_at_max_size(
    opener: CountingOpener, state: Path
) -> None:
    config_a = LocalSandboxConfig(state_dir=str(state), env={"WHICH": "a"})
    config_b = LocalSandboxConfig(state_dir=str(state), env={"WHICH": "b"})
    async with make_pool(opener, max_size=1) as pool:
        a = await pool.acquire(config_a)
        # In use: never evicted, so b has to wait.
        with pytest.raises(SandboxError, match="max_size"):
            await pool.acquire(config_b, timeout=0.2)
        await pool.release(a, reset=False)
        assert pool.stats()["idle"] == 1
        b = await asyncio.wait_for(pool.acquire(config_b), PATIENCE_S)
        assert (await b.exec('echo "$WHICH"')).stdout == "b\n"
        assert await wait_until(lambda: not state_dir(a).exists())
        # close() removes the state folder before it returns and the count goes up.
        assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
        assert pool.stats()["idle"] == 0 and pool.stats()["in_use"] == 1
        await pool.release(b)


@requires_bwrap
async def test_unhealthy_idle_sandbox_is_replaced(
    opener: CountingOpener, config: LocalSandboxConfig
) -> None:
    # health_interval_s=0: check every time (by default a freshly verified one is trusted).
    async with make_pool(opener, health_interval_s=0) as pool:
        first = await pool.acquire(config)
        await pool.release(first, reset=False)
        assert pool.stats()["idle"] == 1
        assert isinstance(first, BwrapSandbox)
        outer = first._shell.pid
        assert outer is not None
        os.killpg(outer, signal.SIGKILL)  # from outside, as the OOM killer would
        assert await wait_until(lambda: not alive(outer))
        second = await pool.acquire(config)
        assert second is not first
        assert (await second.exec("echo fresh")).stdout == "fresh\n"
        assert opener.calls == 2
        assert await wait_until(lambda: not state_dir(first).exists())
        assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
        assert pool.stats()["in_use"] == 1
        await pool.release(second)


@requires_bwrap
async def test_idle_timeout_retires_idle_sandboxes_only(
    opener: CountingOpener, config: LocalSandboxConfig
) -> None:
    async with make_pool(opener, idle_timeout_s=0.3) as pool:
        busy = await pool.acquire(config)
        idle = await pool.acquire(config)
        await pool.release(idle, reset=False)
        assert pool.stats()["idle"] == 1
        assert await wait_until(lambda: pool.stats()["idle"] == 0)
        assert await wait_until(lambda: not state_dir(idle).exists())
        assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
        # The round that retired `idle` saw `busy` too, in use for longer than the timeout.
        assert (await busy.exec("echo still here")).stdout == "still here\n"
        assert pool.stats()["in_use"] == 1
        await pool.release(busy)


# --- shutdown and leftovers ------------------------------------------------------------------


@requires_bwrap
async def test_close_destroys_in_use_idle_and_starting_sandboxes(
    opener: CountingOpener, config: LocalSandboxConfig, state: Path
) -> None:
    pool = make_pool(opener)
    pool.start()
    in_use = await pool.acquire(config)
    idle = await pool.acquire(config)
    await pool.release(idle, reset=False)
    await in_use.exec("sleep 300 >/dev/null 2>&1 &")
    assert len(processes_mentioning(str(state))) >= 2
    pool.prewarm(config, 1)  # still starting when close() begins
    await pool.close()
    assert processes_mentioning(str(state)) == []
    assert list(state.iterdir()) == []
    assert pool.stats()["in_use"] == 0 and pool.stats()["idle"] == 0
    assert pool.stats()["destroyed"] == pool.stats()["created"] == 3
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire(config)
    await pool.release(in_use)  # after close: harmless
    with pytest.raises(SandboxError):
        await in_use.exec("true")


@requires_bwrap
async def test_orphans_in_tmpdir_are_reaped_at_start(
    opener: CountingOpener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    host = socket.gethostname()

    def fake(name: str, lease: dict[str, Any]) -> Path:
        path = tmp / f"{STATE_PREFIX}{name}"
        path.mkdir()
        (path / LEASE_FILE).write_text(json.dumps(lease))
        return path

    gone = dead_pid()
    orphan = fake("deadowner-1", {"owner_pid": gone, "created": time.time() - 60})
    expired = fake(
        "expired-1",
        {
            "owner_pid": os.getpid(),
            "created": time.time() - 60,
            "labels": {OWNER: f"{host}:{os.getpid()}", LEASE_EXPIRES: str(int(time.time() - 1))},
        },
    )
    live = fake(
        "live-1",
        {
            "owner_pid": os.getpid(),
            "created": time.time(),
            "labels": {OWNER: f"{host}:{os.getpid()}", LEASE_EXPIRES: str(int(time.time() + 600))},
        },
    )
    elsewhere = fake(
        "other-host-1",
        {"owner_pid": gone, "labels": {OWNER: f"not-{host}:{gone}"}},
    )
    no_lease = tmp / f"{STATE_PREFIX}starting-1"  # being created: no lease.json yet
    no_lease.mkdir()
    # A process the dead owner left behind, running with the folder in its argv.
    straggler = await asyncio.create_subprocess_exec("bash", "-c", "sleep 300; :", str(orphan))
    try:
        assert await wait_until(lambda: len(processes_mentioning(str(orphan))) == 1)
        async with make_pool(opener):
            assert await wait_until(lambda: not orphan.exists() and not expired.exists())
            await asyncio.wait_for(straggler.wait(), PATIENCE_S)  # killed, not after 300 s
            assert processes_mentioning(str(orphan)) == []
        assert live.exists() and elsewhere.exists() and no_lease.exists()
        assert opener.calls == 0
    finally:
        if straggler.returncode is None:
            straggler.kill()
            await straggler.wait()


# --- Docker ----------------------------------------------------------------------------------


@requires_docker
async def test_docker_pool_reaps_orphaned_containers_and_labels_leases() -> None:
    fail_without_docker_in_ci()
    import aiodocker
    from aiodocker.exceptions import DockerError

    docker = aiodocker.Docker()
    host = socket.gethostname()
    orphan = await docker.containers.create(
        {
            "Image": "clotho/base:bookworm",
            "Cmd": ["sleep", "infinity"],
            "Labels": {"clotho": "1", OWNER: f"{host}:{dead_pid()}", "clotho.test": "pool"},
            "HostConfig": {"NetworkMode": "none"},
        }
    )
    sandbox: Any = None
    try:
        async with SlotPool(PoolConfig(lease_s=120), labels={"clotho.run": "pool-docker"}) as pool:
            before = time.time()
            sandbox = await pool.acquire(DockerSandboxConfig(), labels={"clotho.task": "d"})
            after = time.time()
            assert (await sandbox.exec("cat /proc/net/dev | wc -l")).stdout == "3\n"
            labels = (await docker.containers.container(sandbox.id).show())["Config"]["Labels"]
            assert labels["clotho.run"] == "pool-docker" and labels["clotho.task"] == "d"
            assert labels[OWNER] == f"{host}:{os.getpid()}"
            assert int(before) + 120 <= int(labels[LEASE_EXPIRES]) <= after + 120  # from acquire

            async def orphan_gone() -> bool:
                try:
                    await orphan.show()
                except DockerError as exc:
                    return exc.status == 404
                return False

            assert await wait_until(orphan_gone), "the orphaned container was not reaped"
            # Ours is alive and owned by a live process: not reaped.
            assert (await sandbox.exec("echo mine")).stdout == "mine\n"
            await pool.release(sandbox)
        with pytest.raises(DockerError) as info:
            await docker.containers.container(sandbox.id).show()
        assert info.value.status == 404
    finally:
        leftovers = [orphan]
        if sandbox is not None:
            leftovers.append(docker.containers.container(sandbox.id))
        for container in leftovers:
            with contextlib.suppress(DockerError):
                await container.delete(force=True)
        await docker.close()


async def test_git_reset_mode_hands_back_a_clean_repository(tmp_path: Path) -> None:
    config = LocalSandboxConfig(state_dir=str(tmp_path))
    async with SlotPool(PoolConfig(max_size=2, reset="git")) as pool:
        sandbox = await pool.acquire(config)
        setup = await sandbox.exec(
            "git init -q && echo one > a.txt && git add a.txt && "
            "git -c user.name=t -c user.email=t@x commit -qm init && echo ok"
        )
        assert setup.stdout == "ok\n", setup
        await sandbox.exec("echo dirty >> a.txt; echo new > b.txt; export LEFT=1; sleep 300 &")
        await pool.release(sandbox)
        await pool.wait_idle(config, 1, timeout=30)
        again = await pool.acquire(config)
        assert again is sandbox  # reused, not replaced
        state = await again.exec('cat a.txt; ls; echo "${LEFT-unset}"; jobs -p | wc -l')
        assert state.stdout == "one\na.txt\nunset\n0\n", state
        # A workspace that is not a repository cannot be proven clean: it is destroyed.
        await again.exec("rm -rf .git")
        await pool.release(again)
        assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
        assert pool.stats()["idle"] == 0 and pool.stats()["starting"] == 0


async def test_closing_does_not_wait_for_a_backend_that_cannot_list_its_sandboxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reaping a dead run's leftovers is optional work: a backend whose listing never answers
    (a Ray host actor that never started) is cancelled at close, not waited for."""
    from clotho.sandbox.local.backend import LocalBackend

    listing = asyncio.Event()
    never = asyncio.Event()

    async def hangs(self: LocalBackend) -> list[Any]:
        listing.set()
        await never.wait()
        return []

    monkeypatch.setattr(LocalBackend, "records", hangs)
    pool = SlotPool(PoolConfig())
    pool.start()  # makes the local backend, whose reaper starts listing
    assert await wait_until(listing.is_set)
    await asyncio.wait_for(pool.close(), PATIENCE_S)  # a bound for a stuck test, not a timing
    assert not never.is_set()
