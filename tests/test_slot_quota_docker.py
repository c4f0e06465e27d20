"""Docker slot containers' disk as a file system of its own (sandbox/docker/quota.py via
`SlotHost._create`), on the real daemon: the kernel refuses a slot's write past the
container's limit (ENOSPC inside), and a command after which the disk is full ends the
slot as `limit`.

The limit is the container's, shared by its slots (one writable layer). Skipped with the
reason shown when no Docker daemon answers or loop-mounted file systems cannot be made
here; in CI a missing daemon fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import requires_quota

from clotho.errors import ErrorInfo, LimitExceeded
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker import quota as docker_quota
from clotho.sandbox.docker.slots import SlotHost

pytest_plugins = ("tests.sandbox_fixtures",)  # slot_host, docker_quota_on


# The containers' own file systems are opt-in (docker/quota.py): these tests judge them.
pytestmark = [requires_docker, requires_quota, pytest.mark.usefixtures("docker_quota_on")]

# Its error goes to the output: a file for it could not be written on the full disk.
FILL = "for i in 1 2 3 4; do fallocate -l 30M big$i 2>&1 || break; done"


def mounts_at(path: Path) -> list[str]:
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p == str(path)]


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_slot_containers_disk_refuses_writes_past_its_limit_and_full_is_limit(
    slot_host: SlotHost, isolation: str
) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation, storage_mb=64)
    slot = await slot_host.open(config)
    try:
        layer, why = docker_quota.layer_dir(await slot.container.show())
        assert layer is not None, why
        assert mounts_at(layer) == [str(layer)]  # the layer is a file system of its own
        assert shutil.disk_usage(layer).total < 96 << 20  # well below the 120 MB FILL asks
        # Past the limit the kernel refuses the write inside; the space freed again, the
        # command ends normally (a full disk after it would be the limit).
        result = await slot.exec(f"{FILL}; rm -f big*")
        assert "No space left on device" in result.stdout
        assert (await slot.exec("echo still")).stdout == "still\n"
        with pytest.raises(LimitExceeded, match="disk limit of 64 MB") as caught:
            await slot.exec(FILL)
        assert ErrorInfo.of(caught.value).kind == "limit"
    finally:
        await slot.close()
