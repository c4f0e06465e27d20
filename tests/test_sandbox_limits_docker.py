"""Docker sandboxes' limits against a real engine: memory, processes and disk past their
limits are the agent's failures (`LimitExceeded`, kind `limit`), not infrastructure.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true) its absence
fails the tests instead.
"""

from __future__ import annotations

import asyncio

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.support import PATIENCE_S

from clotho.errors import LimitExceeded
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.backend import DockerSandbox
from clotho.sandbox.docker.slots import SlotHost

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = requires_docker

ALLOCATE = "python3 -c 'x = bytearray({mb} << 20); print(len(x))'"
# A fork bomb, and a wait (in builtins: no fork is left) until the kernel refused a fork.
FORK_BOMB = (
    "f=/sys/fs/cgroup/pids/pids.events; [ -e $f ] || f=/sys/fs/cgroup/pids.events; "
    "b() { b | b & }; b; "
    'until read -r _ refused < $f && [ "$refused" -gt 0 ]; do :; done'
)


@pytest.fixture(autouse=True)
def _daemon() -> None:
    fail_without_docker_in_ci()


async def test_memory_past_the_limit_is_a_limit_failure() -> None:
    async with await open_sandbox(DockerSandboxConfig(memory_mb=128)) as sb:
        assert isinstance(sb, DockerSandbox)
        ok = await sb.exec(ALLOCATE.format(mb=32))
        assert ok.exit_code == 0, ok.stderr  # under the limit: fine
        with pytest.raises(LimitExceeded, match="memory"):
            await sb.exec(ALLOCATE.format(mb=300))
        with pytest.raises(LimitExceeded):  # the sandbox stays failed
            await sb.exec("true")
    async with await open_sandbox(DockerSandboxConfig(memory_mb=128)) as sb:
        with pytest.raises(LimitExceeded, match="memory"):
            await sb.exec_fresh(ALLOCATE.format(mb=300), timeout=60)


async def test_a_fork_bomb_is_contained() -> None:
    async with await open_sandbox(DockerSandboxConfig(pids_limit=64)) as sb:
        with pytest.raises(LimitExceeded, match="process limit"):
            await sb.exec(FORK_BOMB, timeout=PATIENCE_S * 2)
        assert isinstance(sb, DockerSandbox)
        with pytest.raises(LimitExceeded):  # failed for good, whoever asks
            await sb.exec_fresh("true", timeout=PATIENCE_S)
        top = await sb.container.top(ps_args="-o pid")
        assert len(top["Processes"]) <= 64  # contained by the container's cgroup


async def test_disk_past_the_limit_is_a_limit_failure() -> None:
    config = DockerSandboxConfig(storage_mb=40, storage_check_s=0.3)
    async with await open_sandbox(config) as sb:
        assert (await sb.exec("head -c 10000000 /dev/urandom > /tmp/small")).exit_code == 0
        # Past the quota while the command runs: the container is killed mid-way.
        with pytest.raises(LimitExceeded, match="disk"):
            await sb.exec(
                "for i in $(seq 40); do head -c 10000000 /dev/urandom > /tmp/f$i; sleep 0.1; done",
                timeout=60,
            )
        assert isinstance(sb, DockerSandbox)
        with pytest.raises(LimitExceeded):  # verification learns why, not "infra"
            await sb.stop_agent()


async def test_a_slots_memory_failure_is_its_own(slot_host: SlotHost) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="none", memory_mb=192)
    a, b = await asyncio.gather(slot_host.open(config), slot_host.open(config))
    with pytest.raises(LimitExceeded, match="memory"):
        await a.exec(ALLOCATE.format(mb=400))
    assert (await b.exec("echo fine")).stdout == "fine\n"  # the neighbour is not charged
    await a.close()
    await b.close()


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_slot_that_fills_the_disk_fails_alone_as_limit(
    slot_host: SlotHost, isolation: str
) -> None:
    """The quota is the container's: the slot whose files passed it fails as `limit`; its
    neighbour, killed with the container, is infrastructure (retried), not charged."""
    from clotho.errors import SandboxError

    config = DockerSandboxConfig(
        slots_per_container=2, slot_isolation=isolation, storage_mb=40, storage_check_s=0.3
    )
    a, b = await asyncio.gather(slot_host.open(config), slot_host.open(config))
    with pytest.raises(LimitExceeded, match="disk"):
        await a.exec(
            "for i in $(seq 40); do head -c 10000000 /dev/urandom > f$i; sleep 0.1; done",
            timeout=60,
        )
    with pytest.raises(SandboxError, match=f"slot {a.slot} filled"):
        await b.exec("echo hi")
    await a.close()
    await b.close()
