"""Docker sandboxes' limits against a real engine: memory, processes and disk past their
limits are the agent's failures (`LimitExceeded`, kind `limit`), not infrastructure.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true) its absence
fails the tests instead.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.sandbox_fixtures import image_blocks, requires_quota
from tests.support import PATIENCE_S

from clotho.errors import LimitExceeded
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.docker.slots import SlotHost
from clotho.sandbox.host import quota

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures, docker_quota_on


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


@pytest.mark.usefixtures("docker_quota_on")
async def test_disk_past_the_limit_is_a_limit_failure() -> None:
    config = DockerSandboxConfig(storage_mb=40, storage_check_s=0.3)
    async with await open_sandbox(config) as sb:
        assert isinstance(sb, DockerSandbox)
        assert sb.limits.disk is not None  # the kernel holds it (docker/quota.py)
        assert (await sb.exec("head -c 10000000 /dev/urandom > /tmp/small")).exit_code == 0
        # Past the quota: the writes are refused, and the command that met it is the limit.
        with pytest.raises(LimitExceeded, match="disk"):
            await sb.exec(
                "for i in $(seq 40); do head -c 10000000 /dev/urandom > /tmp/f$i; done",
                timeout=60,
            )
        with pytest.raises(LimitExceeded):  # verification learns why, not "infra"
            await sb.stop_agent()


@pytest.mark.usefixtures("docker_quota_on")
@requires_quota
async def test_fallocate_past_the_quota_is_refused_and_the_host_gives_no_more() -> None:
    """Six 400 MB `fallocate`s against 500 MB: the second is refused in the container, the
    command is a limit, and the host disk holds no more than the layer's image."""
    async with await open_sandbox(DockerSandboxConfig(storage_mb=500)) as sb:
        assert isinstance(sb, DockerSandbox) and sb.limits.disk is not None
        fill = "for i in 1 2 3 4 5 6; do fallocate -l 400M /f$i; echo $? >> /rc; done"
        with pytest.raises(LimitExceeded, match="filled its disk limit of 500 MB"):
            await sb.exec(fill, timeout=120)
        layer = sb.limits.disk.path
        assert (layer / "diff" / "rc").read_text().split() == ["0", "1", "1", "1", "1", "1"]
        size = quota.image_bytes(500 << 20, quota.inodes_for(500 << 20))
        assert image_blocks(layer) <= size


@pytest.mark.usefixtures("docker_quota_on")
@requires_quota
async def test_empty_files_past_the_inode_limit_are_a_limit_failure() -> None:
    """200,000 empty files against 500 MB (32,000 inodes): refused, and a limit."""
    async with await open_sandbox(DockerSandboxConfig(storage_mb=500)) as sb:
        assert isinstance(sb, DockerSandbox) and sb.limits.disk is not None
        assert sb.limits.disk.inodes == 32000
        make = "mkdir /many && cd /many && seq -f e%g 200000 | xargs touch 2>/dev/null; ls | wc -l"
        with pytest.raises(LimitExceeded, match="inode limit of 32000 files"):
            await sb.exec(make, timeout=300)
        made = len(os.listdir(sb.limits.disk.path / "diff" / "many"))
        assert 31000 < made <= 32000


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
    slot_host: SlotHost, isolation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the quota is watched (`CLOTHO_DOCKER_QUOTA=0`; enforced, see
    test_slot_quota_docker.py), it is the container's: the slot whose files passed it fails as
    `limit`; its neighbour, killed with the container, is infrastructure (retried), not
    charged."""
    from clotho.errors import SandboxError

    monkeypatch.setenv("CLOTHO_DOCKER_QUOTA", "0")

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
