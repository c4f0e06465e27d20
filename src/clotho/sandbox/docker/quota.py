"""A disk limit the kernel enforces on a container's writable layer.

Docker's own (`--storage-opt size=`) needs overlay2 on XFS with project quotas, which this
kernel lacks (no CONFIG_XFS_QUOTA; ext4 has no quota format either), so the writable layer
gets what a local sandbox's state folder gets (`clotho.sandbox.host.quota`): between `docker
create` and `start`, the layer's folder (`GraphDriver.Data.UpperDir`'s parent, holding
`diff` and `work`, which overlayfs needs on one file system) becomes a loop-mounted ext4 of
the limit's size and inode count, with what `create` put there carried over. A write past it
fails in the container with ENOSPC. `docker rm` empties the folder, meets the mount
(EBUSY), unmounts it and removes the rest; the loop device clears itself.

This needs the daemon's files on this host (a local daemon), the overlay2 driver and root;
where any is missing, `confine` says once why and returns None, and the caller watches the
layer's size instead.

It is on unless `CLOTHO_DOCKER_QUOTA=0`. It was off for a while because `docker exec` into
confined containers failed in bursts with runc's "error starting setns process: fork/exec
/proc/self/exe: no such file or directory": runc starts an exec's process in the container's
root folder on the host, and that folder was gone. The cause: slirp4netns' sandbox (the
local backend's networking) made only `/` private in its new mount namespace and then
detached its old root, and dockerd's root is a shared mount, so each networked local sandbox
unmounted every container's root on the host (with this file system, the folder under it
too). slirp4netns now runs in a mount namespace made private throughout, and the file system
here is made private when mounted, so no other process's detach reaches it
(`tests/test_slirp_host_mounts.py` fails without either).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.host import quota

log = logging.getLogger(__name__)

_reported: set[str] = set()  # why a container's disk is only watched, said once per process


def _report(reason: str) -> None:
    if reason not in _reported:
        _reported.add(reason)
        log.warning(
            "containers' disk limit is watched, not enforced, and inodes are not limited: %s",
            reason,
        )


def _daemon_sees_our_mounts(pid_file: Path = Path("/var/run/docker.pid")) -> bool:
    """False when the daemon runs in another mount namespace (it would mount the overlay
    over the folder under our file system, and the limit would hold nothing); True when it
    shares ours or cannot be told."""
    try:
        pid = int(pid_file.read_text().strip())
        return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except (OSError, ValueError):
        return True


def layer_dir(info: dict[str, Any]) -> tuple[Path | None, str | None]:
    """The folder of a container's writable layer on this host (from `docker inspect`), or
    None and why not."""
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None, f"the storage driver is {driver.get('Name')!r}, not overlay2"
    upper = (driver.get("Data") or {}).get("UpperDir")
    if not upper:
        return None, "the daemon names no writable layer"
    layer = Path(upper).parent
    if not os.path.isdir(upper):
        return None, "the daemon's files are not on this host"
    return layer, None


async def confine(container: Any, storage_mb: int) -> quota.Disk | None:
    """Make the created (not yet started) container's writable layer a file system of
    `storage_mb`, its inode limit to match; None (said once) where that cannot be done, a
    SandboxError where it should work and failed (the limit is not silently weakened)."""
    reason = quota.unavailable()
    if os.environ.get("CLOTHO_DOCKER_QUOTA") == "0":
        reason = "turned off (CLOTHO_DOCKER_QUOTA=0)"
    layer: Path | None = None
    if reason is None:
        layer, reason = layer_dir(await container.show())
    if layer is not None and not await asyncio.to_thread(_daemon_sees_our_mounts):
        layer, reason = None, "the daemon runs in another mount namespace"
    if layer is None:
        _report(reason or "unknown")
        return None
    try:
        return await asyncio.to_thread(quota.Disk.mount_over, layer, storage_mb << 20)
    except OSError as exc:
        raise SandboxError(f"cannot make the container's disk: {exc}") from exc


def disk_in(info: dict[str, Any], storage_mb: int) -> quota.Disk | None:
    """The file system `confine` made for the container `docker inspect` describes in
    `info`, if it made one."""
    layer, _ = layer_dir(info)
    return None if layer is None else quota.Disk.at(layer, storage_mb << 20)
