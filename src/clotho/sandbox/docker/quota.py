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

It is off unless `CLOTHO_DOCKER_QUOTA=1`: on this machine, while many confined containers
came and went, `docker exec` into some containers failed for minutes with runc's "error
starting setns process: fork/exec /proc/self/exe: no such file or directory" (a verification
that cannot start is infra, but it is lost work). What is known: runc starts an exec's process
in the container's root folder on the host (the overlay at `<layer>/merged`), and that error is
its chdir failing. Reproduced once more (29 failed execs in 20 s, while two full test suites
and other tests ran beside the Docker tests; never with the Docker tests alone): a watcher saw
a running, confined container lose both mounts, the ext4 on its layer folder and the overlay
under it, 13 s before the first failed exec and 22 s before the container stopped; dockerd
only unmounts a container's overlay when it stops. So something detached the layer's file
system from the host's mount namespace while the container ran; what, is not found yet.
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
    if os.environ.get("CLOTHO_DOCKER_QUOTA") != "1":
        reason = "off by default (CLOTHO_DOCKER_QUOTA=1 turns it on; see the module docstring)"
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
