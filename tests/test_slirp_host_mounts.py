"""A networked local sandbox leaves the host's mounts alone.

slirp4netns' `--enable-sandbox` makes only `/` private in its new mount namespace, pivots into
a tmpfs and detaches the old root. dockerd makes its own root a shared mount, so run as it
was, every detach below it came back to the host: each running container's root (its
overlay at `<layer>/merged`) was unmounted on the host, and with the layer's own file system
(`CLOTHO_DOCKER_QUOTA=1`) that folder was gone, so `docker exec` failed with runc's "error
starting setns process". Real bubblewrap, slirp4netns and Docker."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from typing import Any

import pytest
from tests.docker_probe import fail_without_docker_in_ci, requires_docker

from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.config import DockerSandboxConfig

pytestmark = [
    requires_docker,
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slirp4netns' sandbox mode runs as root"),
]
BASE_IMAGE = "clotho/base:bookworm"


def mounted(path: str) -> bool:
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == path for line in f)


def merged_dir(sandbox: Any) -> str:
    """The container's root on the host (`docker inspect`: no backend internals)."""
    argv = ["docker", "inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", sandbox.id]
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("quota", ["watched", "layer file system"])
async def test_a_networked_local_sandbox_leaves_containers_roots_mounted(
    quota: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    fail_without_docker_in_ci()
    assert shutil.which("slirp4netns"), "make system-deps installs slirp4netns"
    monkeypatch.setenv("CLOTHO_DOCKER_QUOTA", "1" if quota == "layer file system" else "0")
    async with await open_sandbox(DockerSandboxConfig(image=BASE_IMAGE)) as container:
        merged = merged_dir(container)
        assert mounted(merged), "the container's root is mounted on the host"
        assert mounted(os.path.dirname(merged)) == (quota == "layer file system")
        config = LocalSandboxConfig(state_dir=str(tmp_path / "state"), network=True)
        async with await open_sandbox(config) as networked:
            r = await networked.exec("ip -4 addr show tap0")
            assert "10.0.2.100" in r.stdout, "slirp4netns brought the network up"
            assert mounted(merged), "slirp4netns' sandbox unmounted a container's root"
            r = await container.exec("echo still here")
            assert (r.exit_code, r.stdout.strip()) == (0, "still here")
        assert mounted(merged)


async def test_a_detach_in_another_namespace_leaves_a_confined_layer_mounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whoever else copies the host's mount namespace and detaches what it copied (as
    slirp4netns did): the layer's own file system is private, so nothing comes back."""
    fail_without_docker_in_ci()
    monkeypatch.setenv("CLOTHO_DOCKER_QUOTA", "1")
    async with await open_sandbox(DockerSandboxConfig(image=BASE_IMAGE)) as container:
        merged = merged_dir(container)
        layer = os.path.dirname(merged)
        assert mounted(layer) and mounted(merged)
        detach = ["unshare", "--mount", "--propagation", "unchanged", "--", "umount", "-l", layer]
        await asyncio.to_thread(subprocess.run, detach, check=True, capture_output=True)
        assert mounted(layer) and mounted(merged), "a detach elsewhere came back to the host"
        r = await container.exec("echo still here")
        assert (r.exit_code, r.stdout.strip()) == (0, "still here")
