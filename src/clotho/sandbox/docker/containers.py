"""Containers on the Engine API: the client, the create request, start and removal.

What every kind of Docker sandbox does with its container (`sandbox.py`: one per sandbox;
`slots.py`: one shared by slots; `sidecars.py`: a compose task's services beside one): the
create request with clotho's labels and limits, a start with the disk limit set in between
(`quota.confine`), a removal that a cancelled caller cannot cut short, and what in the
task's image kept clotho's shell from starting.
"""

from __future__ import annotations

import asyncio
import io
import logging
import posixpath
import secrets
import tarfile
from collections.abc import Sequence
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.config import (
    DEFAULT_DOCKER_MEMORY_MB,
    DEFAULT_DOCKER_STORAGE_MB,
    DockerSandboxConfig,
    base_env,
)
from clotho.sandbox.docker.archive import put_archive
from clotho.sandbox.docker.limits import LimitWatch
from clotho.sandbox.docker.quota import confine
from clotho.sandbox.host.leases import lease_labels

log = logging.getLogger(__name__)

LABEL = "clotho"
INSTALL_HINT = "the docker backend needs the extra: pip install 'clotho-rl[docker]'"


def docker_client(url: str | None = None) -> Any:
    try:
        import aiodocker
    except ImportError as exc:
        raise SandboxError(INSTALL_HINT) from exc
    return aiodocker.Docker(url=url)


def client_url(docker: Any) -> str | None:
    """The address a client really talks to (a configured url, DOCKER_HOST or the socket)."""
    path = getattr(getattr(docker, "connector", None), "path", None)
    if path:  # aiodocker keeps "unix://localhost" as the host of a unix socket
        return f"unix://{path}"
    url = getattr(docker, "docker_host", None)
    return str(url) if url else None


async def delete_container(container: Any) -> None:
    """Force-remove a container, shielded from the caller's cancellation; a failure is
    logged (the reaper and `clotho sandbox gc` find what is left by its labels)."""
    try:
        await asyncio.shield(container.delete(force=True))
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("removing container %s failed: %s", getattr(container, "id", "?"), exc)


def sidecar_hosts(config: DockerSandboxConfig) -> list[str]:
    """The sandbox's hosts entries: each service name is its own loopback (`sidecars.py`)."""
    return [f"{side.name}:127.0.0.1" for side in config.sidecars]


def container_body(
    config: DockerSandboxConfig,
    labels: dict[str, str],
    lease_s: float,
    network_of: str | None = None,
    binds: list[str] | None = None,
) -> dict[str, Any]:
    """The create request; `network_of`: share that container's network namespace (a
    verification twin reaching the agent's services), nothing else of it, and run none of the
    image's entrypoint; `binds`: host folders to mount."""
    network = "host" if config.network and config.host_network else "none"
    host: dict[str, Any] = {
        # The host's network only when accepted by name (a config copied without validation
        # included): nothing else keeps a container off the host's loopback services.
        "NetworkMode": f"container:{network_of}" if network_of else network,
        "Init": config.init,
    }
    if config.sidecars and not network_of:  # service names resolve to its loopback
        host["ExtraHosts"] = sidecar_hosts(config)
    # `ro_mounts` (installed agents' packages): read-only binds, never copied in.
    binds = [*(binds or []), *(f"{m.source}:{m.target}:ro" for m in config.ro_mounts)]
    if binds:
        host["Binds"] = binds
    if config.cpus:
        host["NanoCpus"] = int(config.cpus * 1e9)
    memory = (config.memory_mb or DEFAULT_DOCKER_MEMORY_MB) * 1024 * 1024
    host["Memory"] = host["MemorySwap"] = memory  # no swap: past the limit is an OOM kill
    if config.pids_limit:
        host["PidsLimit"] = config.pids_limit
    body: dict[str, Any] = {
        "Image": config.image,
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": config.workdir,
        "Labels": {LABEL: "1", **lease_labels(lease_s), **labels},
        "HostConfig": host,
    }
    if network_of:  # a twin runs nothing of the snapshot's own that the checks did not cover:
        body["Entrypoint"] = [""]  # no entrypoint, no health check (files the agent could edit),
        body["Healthcheck"] = {"Test": ["NONE"]}
        # and its first program is found on the harness's PATH (whose programs were digested),
        # not on the image's.
        body["Env"] = [f"{k}={v}" for k, v in base_env("/root", config.env).items()]
    return body


def container_limits(container: Any, config: DockerSandboxConfig) -> LimitWatch:
    """The watch of a container's limits: the config's, else the defaults (4 GB, 10 GB)."""
    return LimitWatch(
        container,
        memory_mb=config.memory_mb or DEFAULT_DOCKER_MEMORY_MB,
        pids_limit=config.pids_limit,
        storage_mb=config.storage_mb or DEFAULT_DOCKER_STORAGE_MB,
        check_interval_s=config.storage_check_s,
    )


async def create_container(
    docker: Any, body: dict[str, Any], image: str, empty: Sequence[str] = ()
) -> Any:
    """A new container named `clotho-<random>`, not started; the daemon's refusal is a
    `SandboxError`. `empty`: files made empty before anything runs in it (what its image
    holds there is not to be used: a verification twin's loader cache)."""
    from aiodocker.exceptions import DockerError

    try:
        container = await docker.containers.create(body, name=f"clotho-{secrets.token_hex(6)}")
    except DockerError as exc:
        raise SandboxError(f"cannot start a container from {image}: {exc}") from exc
    try:
        for path in empty:
            folder, name = posixpath.split(path)
            await put_archive(container, folder, _empty_file_tar(name))
    except BaseException:
        await delete_container(container)
        raise
    return container


def _empty_file_tar(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(b""))
    return buffer.getvalue()


async def start_container(
    docker: Any, body: dict[str, Any], config: DockerSandboxConfig, empty: Sequence[str] = ()
) -> Any:
    """Create, confine the writable layer to the disk limit (`quota.py`) and start; the
    container is removed when any of it fails or the caller is cancelled."""
    from aiodocker.exceptions import DockerError

    container = await create_container(docker, body, config.image, empty)
    try:
        await confine(container, config.storage_mb or DEFAULT_DOCKER_STORAGE_MB)  # quota.py
        await container.start()
    except BaseException as exc:
        await delete_container(container)
        if isinstance(exc, DockerError):
            raise SandboxError(f"cannot start a container from {config.image}: {exc}") from exc
        raise
    return container


async def image_at_fault(docker: Any, container: Any, image: str) -> str | None:
    """Why the task's image, not the harness, kept clotho's shell from starting, if it did:
    a container its own ENTRYPOINT/CMD ended at once (not an OOM kill), or an image whose
    USER is not root (the shell's FIFOs are root's). None when it does not look that way."""
    from aiodocker.exceptions import DockerError

    try:
        state = (await container.show()).get("State") or {}
        user = str(((await docker.images.inspect(image)).get("Config") or {}).get("User") or "")
    except DockerError:
        return None
    if not state.get("Running") and not state.get("OOMKilled") and state.get("ExitCode"):
        return (
            f"the container of {image} exited at once (exit code {state.get('ExitCode')}): "
            "its ENTRYPOINT or command does not keep running clotho's shell"
        )
    if user and user.split(":")[0] not in ("root", "0"):
        return f"{image} runs as USER {user}: clotho's shell needs the image's root user"
    return None
