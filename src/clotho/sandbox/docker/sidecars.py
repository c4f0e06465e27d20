"""Sidecars: a compose task's other services, started beside each Docker sandbox.

Each sidecar is a container of its own (its image built from its context or a named one,
its command, entrypoint, environment, user and working directory as compose gives them)
that joins the sandbox container's network namespace, like the containers of a pod: the
sandbox's network stays what it was (`none`: its own loopback only), the sidecars listen on
that loopback, and the sandbox resolves each service name to it (`ExtraHosts`, in the hosts
file the sidecars share). So a sidecar reaches nothing the sandbox could not: no internet,
no host service, no other sandbox. A Docker bridge would not hold that here: this daemon
runs without iptables (`--iptables=false`), so an `internal` bridge still routes to the
host's own addresses.

Every sidecar has the limits a sandbox container has (memory without swap, pids, CPUs:
the service's own `mem_limit`/`cpus`, else the sandbox's; the sandbox's `storage_mb` for its
writable layer, a file system where `confine` can make one, else measured for the sandbox's
life and the sidecar killed past it), docker-init, and the sandbox's
labels plus `clotho.sidecar` (its service) and `clotho.sidecar-of` (the sandbox's
container): `clotho sandbox ls/gc`, the pool's reaper and the exit cleanup find it by its
owner and lease as they find the sandbox. They start in dependency order, each waited for
(its health check, when it or its image has one; exit code 0 for one others wait for with
`service_completed_successfully`), within `sidecar_timeout_s`; one that exits, turns
unhealthy or is not ready in time is the task's error, naming it. Closing the sandbox
removes them with it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from clotho.errors import SandboxError, TaskError
from clotho.sandbox.backends import EnvironmentSpec
from clotho.sandbox.config import (
    DEFAULT_DOCKER_MEMORY_MB,
    DEFAULT_DOCKER_STORAGE_MB,
    DockerSandboxConfig,
)
from clotho.sandbox.docker.containers import LABEL, delete_container
from clotho.sandbox.docker.images import ImageFactsCache
from clotho.sandbox.docker.quota import confine
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.host.leases import SIDECAR, lease_labels
from clotho.sandbox.sidecar_spec import SidecarSpec

log = logging.getLogger(__name__)

SIDECAR_OF = "clotho.sidecar-of"  # the sandbox container it serves
_NS = 1_000_000_000
_POLL_S = 0.2


# The backend's image lookup: (spec, default image, force_build) -> (image, in image).
ImageFor = Callable[[EnvironmentSpec, str, bool], Awaitable[tuple[str, bool]]]


async def prepare_sidecars(
    image_for: ImageFor,
    base: DockerSandboxConfig,
    spec: EnvironmentSpec,
    force_build: bool,
) -> list[SidecarSpec]:
    """Each sidecar with its image ready: built from its context once per content (as the
    task's own image is, by `image_for`: `DockerBackend._image_for`), or a named image
    present here; either failing is the task's error. Sidecars need a container per
    sandbox: shared containers refuse them."""
    if base.slots_per_container > 1:
        raise TaskError(
            f"{spec.name}: the task runs services beside its sandbox, which needs a container "
            f"per sandbox (this run has slots_per_container = {base.slots_per_container})"
        )
    if base.network:
        raise TaskError(
            f"{spec.name}: the task runs services beside its sandbox and asks for a network: "
            "on Docker here that network is the host's own, shared by every sandbox and the "
            "host's services, so its services could not be private to it (not supported)"
        )
    ready = []
    for side in spec.sidecars:
        own = EnvironmentSpec(
            name=f"{spec.name}-{side.name}",
            context=side.context,
            dockerfile=side.dockerfile,
            image=side.image,
            build_timeout_s=spec.build_timeout_s,
            build_hint=f"the image of service {side.name!r}: docker pull {side.image}, or "
            "docker load -i <an archive of it>"
            if side.image
            else None,
        )
        image, _ = await image_for(own, base.image, force_build)
        ready.append(side.model_copy(update={"image": image, "context": None}))
    return ready


def sidecar_body(
    config: DockerSandboxConfig,
    side: SidecarSpec,
    labels: dict[str, str],
    lease_s: float,
    main_id: str,
) -> dict[str, Any]:
    """The create request of one sidecar: the sandbox's network namespace, its limits."""
    host: dict[str, Any] = {
        "NetworkMode": f"container:{main_id}",
        "Init": True,
        # What it prints is kept on the host by the daemon: bounded, whatever it prints.
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
    }
    cpus = side.cpus or config.cpus
    if cpus:
        host["NanoCpus"] = int(cpus * 1e9)
    memory = (side.memory_mb or config.memory_mb or DEFAULT_DOCKER_MEMORY_MB) * 1024 * 1024
    host["Memory"] = host["MemorySwap"] = memory  # no swap, as the sandbox's
    if config.pids_limit:
        host["PidsLimit"] = config.pids_limit
    body: dict[str, Any] = {
        "Image": side.image,
        "Env": [f"{k}={v}" for k, v in side.env.items()],
        "Labels": {
            LABEL: "1",
            **lease_labels(lease_s),
            **labels,
            SIDECAR: side.name,
            SIDECAR_OF: main_id[:12],
        },
        "HostConfig": host,
    }
    if side.command is not None:
        body["Cmd"] = side.command
    if side.entrypoint is not None:
        body["Entrypoint"] = side.entrypoint
    if side.working_dir:
        body["WorkingDir"] = side.working_dir
    if side.user:
        body["User"] = side.user
    if side.healthcheck is not None:
        check = side.healthcheck
        body["Healthcheck"] = {
            "Test": check.test,
            "Interval": int(check.interval_s * _NS),
            "Timeout": int(check.timeout_s * _NS),
            "Retries": check.retries,
            "StartPeriod": int(check.start_period_s * _NS),
        }
    elif side.healthcheck_disabled:
        body["Healthcheck"] = {"Test": ["NONE"]}
    return body


class SidecarSandbox(DockerSandbox):
    """A Docker sandbox with its task's services beside it, removed with it."""

    _sidecars: list[Any] | None = None
    _disk_watch: asyncio.Task[None] | None = None
    sidecar_over_disk: str | None = None  # the sidecar killed past the disk limit, if one was

    @classmethod
    async def create_with_sidecars(
        cls,
        config: DockerSandboxConfig,
        labels: dict[str, str],
        *,
        docker: Any,
        images: ImageFactsCache,
        lease_s: float,
    ) -> SidecarSandbox:
        """The sandbox, then its sidecars in order, each ready before the next starts;
        everything is removed when one fails or the caller is cancelled."""
        sandbox = await cls.create(config, labels, docker=docker, images=images, lease_s=lease_s)
        assert isinstance(sandbox, SidecarSandbox)
        try:
            watched = await sandbox._start_sidecars(docker, labels, lease_s)
            if watched:
                sandbox._disk_watch = asyncio.ensure_future(sandbox._watch_disks(watched))
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def _start_sidecars(
        self, docker: Any, labels: dict[str, str], lease_s: float
    ) -> list[tuple[str, Any]]:
        """Start each sidecar and wait until it is ready; the ones whose disk limit is
        watched rather than enforced (no `confine`)."""
        from aiodocker.exceptions import DockerError

        self._sidecars = []
        watched: list[tuple[str, Any]] = []
        timeout = self.config.sidecar_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        for side in self.config.sidecars:
            body = sidecar_body(self.config, side, labels, lease_s, self.id)
            name = f"clotho-{secrets.token_hex(6)}-{side.name}"
            try:
                container = await docker.containers.create(body, name=name)
            except DockerError as exc:
                raise SandboxError(f"cannot create sidecar {side.name!r}: {exc}") from exc
            self._sidecars.append(container)
            try:
                disk = await confine(container, self.config.storage_mb or DEFAULT_DOCKER_STORAGE_MB)
                await container.start()
            except DockerError as exc:
                raise TaskError(f"sidecar {side.name!r} did not start: {exc}") from exc
            if disk is None:
                watched.append((side.name, container))
            await _ready(container, side, deadline, timeout)
        return watched

    async def _watch_disks(self, watched: list[tuple[str, Any]]) -> None:
        """Where the disk limit cannot be a file system (`confine`), each sidecar's writable
        layer is measured every 5 x `storage_check_s` (the daemon walks the layer to answer)
        for the sandbox's life, and one past `storage_mb` is killed: what the agent makes a
        service store is bounded like what it stores itself."""
        from aiodocker.exceptions import DockerError

        limit = (self.config.storage_mb or DEFAULT_DOCKER_STORAGE_MB) << 20
        every = self.config.storage_check_s * 5
        while watched:
            await asyncio.sleep(every)
            for name, container in list(watched):
                try:
                    info = await container.docker._query_json(
                        f"containers/{container.id}/json", params={"size": "1"}
                    )
                    if int(info.get("SizeRw") or 0) <= limit:
                        continue
                    await container.kill(signal="SIGKILL")
                except DockerError:
                    continue
                log.warning("sidecar %s passed its disk limit (%d MB): killed", name, limit >> 20)
                self.sidecar_over_disk = name
                watched.remove((name, container))

    async def _release(self) -> None:
        if self._disk_watch is not None:
            self._disk_watch.cancel()
        try:
            if self._sidecars:
                await asyncio.gather(*(delete_container(c) for c in self._sidecars))
        finally:
            await super()._release()


async def _ready(container: Any, side: SidecarSpec, deadline: float, timeout: float) -> None:
    """Wait until `side` is ready: exited with 0 (a service others wait for to complete),
    healthy (it or its image has a health check), else started. Exiting otherwise, turning
    unhealthy or missing the deadline is the task's error, with the end of its log."""
    loop = asyncio.get_running_loop()
    while True:
        state = (await container.show()).get("State") or {}
        running = bool(state.get("Running"))
        code = state.get("ExitCode")
        health = (state.get("Health") or {}).get("Status")
        if side.completes and not running and state.get("Status") in ("exited", "dead"):
            if code == 0:
                return
            raise TaskError(
                f"sidecar {side.name!r} exited with code {code}: {await _tail(container)}"
            )
        if not side.completes:
            if not running:
                raise TaskError(
                    f"sidecar {side.name!r} exited at once (exit code {code}): "
                    f"{await _tail(container)}"
                )
            if health in (None, "healthy"):
                return
            if health == "unhealthy":
                raise TaskError(
                    f"sidecar {side.name!r} is unhealthy: {_health_output(state)}"
                    f"{await _tail(container)}"
                )
        if loop.time() >= deadline:
            what = "did not complete" if side.completes else "did not become healthy"
            raise TaskError(
                f"sidecar {side.name!r} {what} within {timeout:g} s (sidecar_timeout_s): "
                f"{_health_output(state)}{await _tail(container)}"
            )
        await asyncio.sleep(_POLL_S)


def _health_output(state: dict[str, Any]) -> str:
    log = (state.get("Health") or {}).get("Log") or []
    if not log:
        return ""
    last = log[-1]
    return f"its last health check exited {last.get('ExitCode')}: {str(last.get('Output', ''))[-300:].strip()}; "


async def _tail(container: Any) -> str:
    """The end of a sidecar's log, for the error that names it."""
    try:
        lines = await container.log(stdout=True, stderr=True, tail=20)
    except Exception as exc:  # the log is a courtesy: never the error itself
        return f"(its log could not be read: {exc})"
    text = "".join(lines).strip()[-600:]
    return f"its log ends: {text}" if text else "its log is empty"
