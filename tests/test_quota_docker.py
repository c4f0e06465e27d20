"""A container's writable layer as a file system of its own (sandbox/docker/quota.py), on
the real daemon: made between `create` and `start`, it refuses writes past the byte and
inode limits inside the container (ENOSPC), the limit watch reads a full disk as the
limit, and `docker rm` takes the mount and its loop device along.

Skipped with the reason shown when no Docker daemon answers; in CI its absence fails.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.sandbox_fixtures import loop_backing, mounts_at, requires_quota
from tests.support import wait_until

from clotho.errors import LimitExceeded
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker import quota as docker_quota
from clotho.sandbox.docker.limits import LimitWatch
from clotho.sandbox.host import quota

pytest_plugins = ("tests.sandbox_fixtures",)  # docker_quota_on

# The containers' own file systems are opt-in (docker/quota.py): these tests judge them.
pytestmark = [requires_docker, requires_quota, pytest.mark.usefixtures("docker_quota_on")]

IMAGE = DockerSandboxConfig().image


@pytest.fixture(autouse=True)
def _daemon() -> None:
    fail_without_docker_in_ci()


@pytest.fixture
async def created() -> AsyncIterator[Any]:
    """A created, not yet started container (removed after the test, as the backend
    removes its containers)."""
    import aiodocker

    docker = aiodocker.Docker()
    body = {
        "Image": IMAGE,
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": "/work-made-by-create",  # not in the image: `create` makes it
        "Labels": {"clotho.test": "quota"},
        "HostConfig": {"NetworkMode": "none"},
    }
    container = await docker.containers.create(body, name=f"clotho-q-{secrets.token_hex(4)}")
    try:
        yield container
    finally:
        await container.delete(force=True)
        await docker.close()


async def run(container: Any, cmd: str) -> tuple[int, str]:
    exe = await container.exec(["sh", "-c", cmd], stdout=True, stderr=True)
    async with exe.start(detach=False) as stream:
        out = b""
        while (msg := await stream.read_out()) is not None:
            out += msg.data
    return int((await exe.inspect())["ExitCode"]), out.decode(errors="replace")


async def test_the_writable_layer_refuses_bytes_and_inodes_past_its_limit(created) -> None:
    disk = await docker_quota.confine(created, 64)
    assert disk is not None
    layer, _ = docker_quota.layer_dir(await created.show())
    assert layer is not None and mounts_at(layer) == [str(layer)]
    await created.start()
    code, out = await run(created, "pwd; ls -d /work-made-by-create && echo kept")
    assert code == 0 and "kept" in out  # what `create` put in the layer was carried over
    watch = LimitWatch(created, memory_mb=None, pids_limit=None, storage_mb=64)
    await watch.start()
    assert watch.disk == disk and watch.watch_disk() is None  # enforced: nothing to poll
    code, out = await run(created, "head -c 30M /dev/zero > /a && echo ok")
    assert (code, out.strip()) == (0, "ok")
    await watch.check()  # below the limit: fine
    code, out = await run(
        created, "for i in 1 2 3 4; do fallocate -l 30M /f$i || exit 7; done; echo all"
    )
    assert code == 7 and "No space left on device" in out
    with pytest.raises(LimitExceeded, match="filled its disk limit of 64 MB"):
        await watch.check()
    watch.close()


async def test_empty_files_stop_at_the_inode_limit(created) -> None:
    disk = await docker_quota.confine(created, 64)
    assert disk is not None and disk.inodes == 4096
    await created.start()
    code, out = await run(created, "mkdir /many && cd /many && seq -f e%g 200000 | xargs touch")
    assert code != 0 and "No space left on device" in out
    code, out = await run(created, "ls /many | wc -l")
    assert 4000 < int(out) <= 4096
    watch = LimitWatch(created, memory_mb=None, pids_limit=None, storage_mb=64)
    await watch.start()
    with pytest.raises(LimitExceeded, match="inode limit of"):
        await watch.check()
    watch.close()


async def test_docker_rm_takes_the_mount_and_the_loop_device_along() -> None:
    import aiodocker

    docker = aiodocker.Docker()
    try:
        body = {"Image": IMAGE, "Cmd": ["sleep", "infinity"], "HostConfig": {"NetworkMode": "none"}}
        container = await docker.containers.create(body, name=f"clotho-q-{secrets.token_hex(4)}")
        disk = await docker_quota.confine(container, 32)
        assert disk is not None
        layer, _ = docker_quota.layer_dir(await container.show())
        assert layer is not None
        await container.start()
        assert (await run(container, "head -c 1M /dev/zero > /x && echo ok"))[1].strip() == "ok"
        await container.delete(force=True)
        assert not os.path.lexists(layer) and mounts_at(layer) == []
        assert await wait_until(lambda: str(layer) not in loop_backing(disk.device))
    finally:
        await docker.close()


async def test_a_watch_without_a_disk_of_its_own_still_polls(created) -> None:
    """A container `confine` did not reach (e.g. a remote daemon's) keeps the watched size."""
    await created.start()
    watch = LimitWatch(created, memory_mb=None, pids_limit=None, storage_mb=64)
    await watch.start()
    assert watch.disk is None
    poll = watch.watch_disk()
    assert poll is not None
    poll.cancel()
    watch.close()


async def test_without_loop_devices_the_reason_is_said_once(
    created, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A double for a host where loop devices cannot be used (this one can)."""
    monkeypatch.setattr(quota, "unavailable", lambda: "no loop devices (test double)")
    monkeypatch.setattr(docker_quota, "_reported", set())
    assert await docker_quota.confine(created, 64) is None
    assert await docker_quota.confine(created, 64) is None
    said = [r.getMessage() for r in caplog.records if "watched, not enforced" in r.message]
    assert said == [
        "containers' disk limit is watched, not enforced, and inodes are not limited: "
        "no loop devices (test double)"
    ]


async def test_a_daemon_in_another_mount_namespace_is_not_confined(tmp_path: Path) -> None:
    """Its overlay would be mounted over the folder beneath ours, holding nothing: watched."""
    other = await asyncio.create_subprocess_exec("unshare", "--mount", "sleep", "300")
    try:
        pid_file = tmp_path / "docker.pid"
        assert await wait_until(
            lambda: os.readlink(f"/proc/{other.pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        )
        pid_file.write_text(f"{other.pid}\n")
        assert not docker_quota._daemon_sees_our_mounts(pid_file)
        pid_file.write_text(f"{os.getpid()}\n")
        assert docker_quota._daemon_sees_our_mounts(pid_file)
        assert docker_quota._daemon_sees_our_mounts(tmp_path / "absent.pid")  # cannot tell
    finally:
        other.kill()
        await other.wait()
