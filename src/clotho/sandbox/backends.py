"""The backend contract: what a sandbox backend implements, and what callers ask of it.

A backend is the one place that knows how its sandboxes are made: it opens them, prepares
the environment a task asks for (for Docker: its image), lists and removes what it left
behind (by labels), and holds whatever it shares between its sandboxes (a client, shared
containers, what it learnt about images). The pool (`pool.py`) keeps one backend per kind
and place (`backend_key`) and does everything else: leases and labels, warm sandboxes,
health checks, reset, maintenance, reaping. Nothing outside `sandbox/` knows which backend
runs: callers hand an `EnvironmentSpec` to `SlotPool.prepare` and acquire with the config
they get back. See "The backend contract" in docs/architecture.md.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from clotho.errors import TaskError
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import (
    SandboxConfig,
    SandboxConfigBase,
    config_type,
)
from clotho.sandbox.host.leases import SandboxRecord
from clotho.sandbox.sidecar_spec import SidecarSpec

DEFAULT_LEASE_S = 6 * 3600.0

ConfigT = TypeVar("ConfigT", bound=BaseModel)


class EnvironmentSpec(BaseModel):
    """What a task asks of its sandbox, backend-neutral: the backend decides what it means."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="task name: image tag and labels")
    context: Path | None = Field(None, description="folder holding the Dockerfile to build")
    dockerfile: str = Field("Dockerfile", description="file name inside context")
    image: str | None = Field(None, description="a prebuilt image reference")
    build_timeout_s: float | None = Field(None, gt=0)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(
        None, gt=0, description="enforced by the local backend; recorded by docker"
    )
    network: bool | None = Field(
        None,
        description="the task's own say: True, it needs a network (refused when the run "
        "gives its sandboxes none); False, it gets none even when the run does; None: the "
        "run's setting",
    )
    build_hint: str | None = Field(
        None, description="how to build or get `image` when it is missing: told to the user"
    )
    sidecars: list[SidecarSpec] = Field(
        default_factory=list,
        description="services beside the sandbox (a compose file's other services): run by "
        "a kind that `runs_sidecars` (Docker), refused as the task's error by the others",
    )


def with_task_network(base: SandboxConfig, spec: EnvironmentSpec) -> SandboxConfig:
    """The run's sandbox config for a task that has its say on the network: a network only
    for a task that asks for one and a run that gives one (`network`, which on Docker also
    needs `host_network`: the run's consent), none for a task that says no. A task that asks
    in a run that gives none is a `TaskError` before any sandbox starts, never run offline
    (each kind's `with_task_network`)."""
    if spec.network is None:
        return base
    return base.with_task_network(spec.network, spec.name)


def check_sidecars(base: SandboxConfig, spec: EnvironmentSpec) -> None:
    """A task with sidecars on a kind that cannot run them is the task's error before any
    sandbox starts, never a run without its services."""
    if spec.sidecars and not type(base).runs_sidecars:
        names = ", ".join(s.name for s in spec.sidecars)
        raise TaskError(
            f"{spec.name}: the task runs services beside its sandbox ({names}, from its "
            f"compose file), which needs the docker backend (this run's is {base.backend}): "
            "run it with --sandbox docker"
        )


class PreparedEnvironment(BaseModel):
    """What to acquire with, and whether the workspace is already in place."""

    config: SandboxConfig
    workspace_in_image: bool = Field(
        description="the image already holds the task's workspace (built from its "
        "Dockerfile): do not upload environment/"
    )


@dataclass(frozen=True)
class OpenRequest(Generic[ConfigT]):
    """One `SandboxBackend.open` call, as the backend's `_open` receives it: its config
    already checked to be the backend's `config_type`."""

    config: ConfigT
    labels: dict[str, str]
    lease_s: float = DEFAULT_LEASE_S


class SandboxBackend(abc.ABC, Generic[ConfigT]):
    """One kind of sandbox in one place (a daemon, a state folder), shared by its sandboxes.

    `open` returns a `Sandbox` that carries the exec channel, file transfer and `close`
    (destroy) itself. A backend owns no process-global state: two of them, even of one
    kind, live side by side, and `aclose` releases what this one holds.
    """

    kind: ClassVar[str]
    config_type: type[ConfigT]  # the one member of `SandboxConfig` that `open` accepts

    async def open(
        self,
        config: SandboxConfig,
        labels: dict[str, str],
        *,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Sandbox:
        """A fresh sandbox labelled with `labels` and a lease of `lease_s` seconds. Raises
        `SandboxError` when it cannot be made; leaves nothing behind when it fails.

        Backends implement `_open`, which receives the call whole; a config of another
        backend is a TypeError."""
        if not isinstance(config, self.config_type):
            raise TypeError(f"the {self.kind} backend cannot open {type(config).__name__}")
        return await self._open(OpenRequest(config, labels, lease_s))

    async def _open(self, request: OpenRequest[ConfigT]) -> Sandbox:
        """The backend's fresh sandbox for `request` (see `open`)."""
        raise NotImplementedError(f"{type(self).__name__} opens no sandboxes")

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """The config to acquire with for `spec` (image resolved, limits applied). The
        default knows no images: the config is unchanged and the workspace is uploaded."""
        return PreparedEnvironment(config=base, workspace_in_image=False)

    @abc.abstractmethod
    async def records(self) -> list[SandboxRecord]:
        """Every clotho sandbox this backend can see in its place, live or orphaned."""

    @abc.abstractmethod
    async def remove(self, record: SandboxRecord) -> None:
        """Remove one listed sandbox and its processes; one already gone is not an error."""

    async def aclose(self) -> None:  # a backend holding nothing has nothing to do
        """Release what the backend holds (clients, shared containers). Idempotent."""

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        """Whether the backend itself works (its daemon answers), or, given `sandbox`, the
        part of it that runs that sandbox (a cluster node). A sandbox that broke while its
        backend is healthy broke because of what ran in it: the agent's failure."""
        return True


def backend_key(config: SandboxConfig, *, docker_url: str | None = None) -> str:
    """Which backend instance serves `config`: one per kind and place (a daemon address, a
    state folder). `docker_url` is the default for configs that name none."""
    return config.backend_key(docker_url=docker_url)


def missing_extra(config: SandboxConfig) -> str | None:
    """What to install for `config`'s backend (a wrapped Ray sandbox's inner one too), when
    its SDK is not installed: said before a run starts, not as one infra error per rollout."""
    for part in config.parts():
        if part.sdk is not None and not _installed(part.sdk[0]):
            sdk, extra = part.sdk
            return (
                f"the {part.backend} sandbox backend needs its SDK ({sdk}): "
                f"pip install 'clotho-rl[{extra}]'"
            )
    return None


def _installed(module: str) -> bool:
    if module in sys.modules:  # loaded, or blocked (None: importing it raises)
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _import_all(modules: tuple[str, ...]) -> None:
    for module in modules:
        with contextlib.suppress(ImportError):  # a missing extra says so where it is used
            importlib.import_module(module)


async def import_backend(config: SandboxConfig) -> None:
    """Import `config`'s backend and its SDK off the event loop (aiodocker with aiohttp takes
    ~100 ms), so that the synchronous `make_backend` and clients find them loaded."""
    kind = type(config)
    modules = (kind.backend_class.partition(":")[0], *(kind.sdk or ())[:1])
    if any(m not in sys.modules for m in modules):
        await asyncio.to_thread(_import_all, modules)


def make_backend(config: SandboxConfig, *, docker_url: str | None = None) -> SandboxBackend:
    """A new backend for `config`'s kind and place (see `backend_key`): the kind's own
    (`new_backend`), its module imported now. A config of no registered kind is a TypeError."""
    if not isinstance(config, SandboxConfigBase) or _registered(config) is not type(config):
        raise TypeError(f"unknown sandbox config: {type(config).__name__}")
    return config.new_backend(docker_url=docker_url)


def _registered(config: SandboxConfigBase) -> type[SandboxConfigBase] | None:
    try:
        return config_type(config.backend)
    except KeyError:
        return None
