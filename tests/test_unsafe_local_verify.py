"""unsafe-local verification: each sandbox has its own /tests, /logs and /solution.

The host's own /tests and /logs are never written: two trials verifying at once would
overwrite each other's reward, and a root-owned leftover there breaks every later local
(bubblewrap) trial's verifier on the host.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid
from pathlib import Path

import pytest
from tests.support import wait_until

from clotho.agent.reference import OracleAgent
from clotho.sandbox import UnsafeLocalSandboxConfig, open_sandbox
from clotho.sandbox.local import unsafe_local
from clotho.sandbox.local.unsafe_local import UnsafeLocalSandbox, private_mounts_available
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial
from clotho.tasks.verify import run_verifier

needs_private_mounts = pytest.mark.skipif(
    not private_mounts_available(), reason="private mount namespaces need root and unshare"
)

# Each test script writes its reward, then waits (bounded) until both scripts have written
# theirs: the two verifications overlap for certain, whatever the machine's load.
BARRIER_TEST = """\
mkdir -p /logs/verifier
echo {value} > /logs/verifier/reward.txt
: > /logs/verifier/{marker}
ls /tests > /logs/verifier/listing
: > {barrier}/{name}
n=0
while [ ! -e {barrier}/a ] || [ ! -e {barrier}/b ]; do
  n=$((n + 1)); [ "$n" -lt 6000 ] || exit 3
  sleep 0.01
done
"""


@needs_private_mounts
async def test_concurrent_verifications_keep_their_own_rewards(make_task, tmp_path: Path) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    marker = f"clotho-test-{uuid.uuid4().hex}"
    tasks = {}
    for name, value in (("a", 1), ("b", 0)):
        folder = make_task(
            name,
            test_sh=BARRIER_TEST.format(value=value, marker=marker, barrier=barrier, name=name),
        )
        (folder / "tests" / marker).write_text(name)
        tasks[name] = load_task(folder)
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"))
    a = await open_sandbox(config)
    b = await open_sandbox(config)
    try:
        assert isinstance(a, UnsafeLocalSandbox) and a.private
        got = await asyncio.gather(run_verifier(tasks["a"], a), run_verifier(tasks["b"], b))
        # Each verifier saw its own tests, and the reward it wrote (not the other's).
        for sandbox in (a, b):
            listing = Path(sandbox.resolve("/logs/verifier/listing")).read_text().split()
            assert sorted(listing) == sorted([marker, "test.sh"])
    finally:
        await a.close()
        await b.close()
    assert [outcome.reward for outcome in got] == [1.0, 0.0]
    assert sorted(p.name for p in barrier.iterdir()) == ["a", "b"]  # they did overlap
    # Nothing reached the host's own folders.
    assert not Path("/tests", marker).exists()
    assert not Path("/logs/verifier", marker).exists()


@needs_private_mounts
async def test_oracle_solution_and_tests_stay_in_the_sandbox(make_task, tmp_path: Path) -> None:
    marker = f"clotho-test-{uuid.uuid4().hex}"
    folder = make_task(
        "oracle",
        solve_sh=f"test -f /solution/{marker} && echo ok > done.txt\n",
        test_sh=(
            "mkdir -p /logs/verifier\n"
            'if [ "$(cat done.txt)" = ok ]; then echo 1; else echo 0; fi'
            " > /logs/verifier/reward.txt\n"
        ),
    )
    (folder / "solution" / marker).write_text("x")
    (folder / "tests" / marker).write_text("x")
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"))
    async with SlotPool() as pool:
        outcomes = await asyncio.gather(
            *(run_trial(HarborTrial(load_task(folder)), OracleAgent(), config, pool)
              for _ in range(2))
        )  # fmt: skip
    assert [(o.error, o.reward) for o in outcomes] == [(None, 1.0), (None, 1.0)]
    assert not Path("/solution", marker).exists()
    assert not Path("/tests", marker).exists()


@needs_private_mounts
async def test_private_folders_are_the_sandboxs_and_go_with_it(tmp_path: Path) -> None:
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"))
    sandbox = await open_sandbox(config)
    assert isinstance(sandbox, UnsafeLocalSandbox)
    try:
        await sandbox.write_file("/logs/agent/note.txt", b"mine\n")
        host_file = tmp_path / "host-visible"
        seen = await sandbox.exec(f"cat /logs/agent/note.txt; ls /; echo x > {host_file}")
        assert seen.stdout.startswith("mine\n")
        assert "usr" in seen.stdout.split()  # the host's root, not an empty one
        fresh = await sandbox.exec_fresh("cat /logs/agent/note.txt", timeout=30)
        assert fresh.stdout == "mine\n"
        # The agent still changes the real host (unsafe-local), only the harness folders move.
        assert host_file.read_text() == "x\n"
        assert not Path("/logs/agent/note.txt").exists()
        state = sandbox.state
    finally:
        await sandbox.close()
    assert not state.exists()


class _CountingFcntl:
    """fcntl as unsafe_local uses it, counting the lock attempts (how a waiter is seen)."""

    LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

    def __init__(self) -> None:
        self.attempts = 0

    def flock(self, fd: int, op: int) -> None:
        self.attempts += 1
        fcntl.flock(fd, op)


async def test_without_private_folders_verifications_take_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No mounts (not root): the host's /tests and /logs are shared, so from `stop_agent`
    (the start of verification) to `close` one sandbox at a time holds the host's turn."""
    lock = tmp_path / "verify.lock"
    counting = _CountingFcntl()
    monkeypatch.setattr(unsafe_local, "HOST_LOCK", lock)
    monkeypatch.setattr(unsafe_local, "private_mounts_available", lambda: False)
    monkeypatch.setattr(unsafe_local, "fcntl", counting)
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"))
    a = await open_sandbox(config)
    b = await open_sandbox(config)
    waiting: asyncio.Task[None] | None = None
    try:
        assert isinstance(a, UnsafeLocalSandbox) and not a.private
        await a.stop_agent()  # a verifies now
        tried = counting.attempts
        waiting = asyncio.create_task(b.stop_agent())
        assert await wait_until(lambda: counting.attempts >= tried + 3)  # b tried, in vain
        assert not waiting.done()
        await a.close()  # a's turn ends...
        await asyncio.wait_for(waiting, timeout=30)  # ...and b's begins
        probe = os.open(lock, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # b holds it now
        finally:
            os.close(probe)
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()
        await a.close()
        await b.close()
    probe = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once b closed
    finally:
        os.close(probe)
