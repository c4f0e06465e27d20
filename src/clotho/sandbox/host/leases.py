"""Who owns a sandbox, and finding the ones whose owner is gone (for `clotho sandbox gc`).

Every sandbox carries labels: `clotho.owner` (host:pid of the process that made it), the run,
and `clotho.lease-expires` (unix time). A sandbox is an orphan when its owner process is dead
on this host, or its lease ran out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clotho.sandbox.host import proctree
from clotho.sandbox.host.cgroups import remove_named
from clotho.sandbox.host.trees import remove_tree

# A sandbox's state folder (`state.py`) is named with this prefix and holds its lease.
STATE_PREFIX = "clotho-sbx-"
LEASE_FILE = "lease.json"

OWNER = "clotho.owner"
LEASE_EXPIRES = "clotho.lease-expires"
SLOTS = "clotho.slots"  # sandboxes a shared container hosts (absent: one)
DOCKER_IO = "clotho.docker-io"  # a host folder holding a container's stdio FIFOs
SLOT_ISOLATION = "clotho.slot-isolation"  # bwrap | none, as chosen when it started
SIDECAR = "clotho.sidecar"  # a compose service beside a sandbox: its name


def owner_label() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_labels(lease_s: float) -> dict[str, str]:
    return {OWNER: owner_label(), LEASE_EXPIRES: str(int(time.time() + lease_s))}


def owner_alive(owner: str | None) -> bool | None:
    """True/False for an owner on this host; None when it lives elsewhere (cannot tell)."""
    if not owner or ":" not in owner:
        return None
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class SandboxRecord:
    backend: str
    id: str
    labels: dict[str, str] = field(default_factory=dict)
    created: float | None = None
    path: Path | None = None

    @property
    def owner(self) -> str | None:
        return self.labels.get(OWNER)

    @property
    def expires(self) -> float | None:
        value = self.labels.get(LEASE_EXPIRES)
        return float(value) if value else None

    @property
    def slots(self) -> int:
        """How many sandboxes (slots) the container hosts at most; 1 for a plain sandbox."""
        value = self.labels.get(SLOTS, "1")
        return int(value) if value.isdigit() else 1

    @property
    def slot_isolation(self) -> str | None:
        return self.labels.get(SLOT_ISOLATION)

    def orphaned(self, now: float | None = None) -> bool:
        now = now or time.time()
        if self.expires is not None and self.expires < now:
            return True
        return owner_alive(self.owner) is False


def local_records(state_dir: str | None = None) -> list[SandboxRecord]:
    parent = Path(state_dir or tempfile.gettempdir())
    records = []
    for path in sorted(parent.glob(f"{STATE_PREFIX}*")):
        labels: dict[str, str] = {}
        created = None
        with contextlib.suppress(OSError, ValueError):
            lease = json.loads((path / LEASE_FILE).read_text())
            labels = {k: str(v) for k, v in lease.get("labels", {}).items()}
            labels.setdefault(OWNER, f"{socket.gethostname()}:{lease.get('owner_pid')}")
            created = lease.get("created")
        # A Docker container's stdio FIFOs live in such a folder too (docker/fifo.py).
        kind = "docker-io" if labels.get(DOCKER_IO) else "local"
        records.append(SandboxRecord(kind, path.name, labels, created, path))
    return records


def remove_local(record: SandboxRecord) -> None:
    """Kill processes still using the sandbox folder (bwrap's argv names it), end its cgroups
    (a frozen process ignores SIGKILL until its group is thawed or removed) and delete it
    with `remove_tree`, as closing the sandbox does; raises OSError if something stays."""
    assert record.path is not None
    remove_named(record.path.name)
    needle = str(record.path).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            proctree.kill_descendants(int(entry))
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
    remove_tree(record.path)


async def docker_records(docker: Any) -> list[SandboxRecord]:
    containers = await docker.containers.list(all=True, filters={"label": ["clotho=1"]})
    records = []
    for container in containers:
        info = container._container
        labels = dict(info.get("Labels") or {})
        records.append(
            SandboxRecord(
                # A compose task's service beside a sandbox (docker/sidecars.py).
                "docker-sidecar" if SIDECAR in labels else "docker",
                str(info.get("Id", ""))[:12],
                labels,
                info.get("Created"),
            )
        )
    return records


async def remove_docker(docker: Any, record: SandboxRecord) -> None:
    """Force-remove a container; one that is already gone is not an error. A verification
    twin's snapshot image (`docker/twin.py`, its label) goes with it."""
    from aiodocker.exceptions import DockerError

    container = docker.containers.container(record.id)
    image = None
    if record.labels.get("clotho.snapshot") == "1":
        with contextlib.suppress(DockerError):
            image = (await container.show()).get("Image")
    try:
        await container.delete(force=True)
    except DockerError as exc:
        if exc.status != 404:
            raise
    if image:
        with contextlib.suppress(DockerError):
            await docker.images.delete(image, force=True)
