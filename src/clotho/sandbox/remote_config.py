"""Configs of the backends that place sandboxes beyond this host: Ray, Modal, Nomad.

Kinds like the host ones (`config.py`), kept apart because each names a cluster rather than
a host. Registered by their entry points (pyproject.toml, `clotho.sandbox_kinds`): the
registry loads this module the first time kinds are listed, so its kinds are read wherever
a `SandboxConfig` is. This module imports `config.py`, never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field

from clotho.sandbox.config import Kinds, Place, SandboxConfigBase, config_type

if TYPE_CHECKING:
    from clotho.sandbox.backends import SandboxBackend

# Sandboxes (Modal sandboxes, Nomad allocations) a run creates at once on a cluster backend.
DEFAULT_CREATE_CONCURRENCY = 8
# The cluster kinds that have `create_concurrency`.
CREATE_CAPPED = ("ray", "modal", "nomad")

# What a Ray node runs: any kind whose sandboxes live on one host.
InnerConfig = Annotated[SandboxConfigBase, Kinds(place="host")]


def _default_inner() -> SandboxConfigBase:
    """A node's sandbox unless told otherwise: the `local` kind (bubblewrap), as registered."""
    return config_type("local")()


class RaySandboxConfig(SandboxConfigBase):
    """Sandboxes spread over a Ray cluster: one host actor per node runs `inner` sandboxes
    (bubblewrap, Docker) on its node; commands and files go through the actor."""

    backend: Literal["ray"] = "ray"
    backend_class: ClassVar[str] = "clotho.sandbox.ray.backend:RayBackend"
    sdk: ClassVar[tuple[str, str] | None] = ("ray", "ray")
    place: ClassVar[Place] = "cluster"
    address: str = Field(
        "auto", description="Ray cluster address (`auto`: the cluster this host belongs to)"
    )
    namespace: str = Field("clotho", description="Ray namespace of the host actors")
    inner: InnerConfig = Field(
        default_factory=_default_inner,
        description="the sandbox each node runs, as on one machine",
    )
    node_resource: str | None = Field(
        None,
        description="only nodes offering this custom resource host sandboxes (default: every "
        "alive node)",
    )
    max_per_node: int | None = Field(
        None, ge=1, description="sandboxes open at once on one node (default: no limit)"
    )
    channel: bool = Field(
        True,
        description="commands over a TCP stream the host actor serves (token-admitted; "
        "~0.3 ms a call) rather than a Ray call each (~1.2 ms)",
    )
    call_timeout_s: float = Field(
        60.0,
        gt=0,
        description="limit on a host call beyond the command's own timeout (a lost node is "
        "noticed by Ray at once; this bounds a hung one)",
    )
    create_concurrency: int = Field(
        DEFAULT_CREATE_CONCURRENCY,
        ge=1,
        description="sandboxes being created at once, run-wide (`clotho eval --create-concurrency`): "
        "a burst of rollouts waits its turn rather than hitting the cluster's rate limits all at "
        "once; only creation is capped, never the rollouts that use them",
    )

    # The pool and the sandboxes read these like any config's.
    @property
    def workdir(self) -> str:
        return self.inner.workdir

    @property
    def state_dir(self) -> str | None:
        return self.inner.state_dir

    def backend_key(self, *, docker_url: str | None = None) -> str:
        return f"ray {self.address} {self.namespace} {self.inner.backend_key()}"

    def parts(self) -> tuple[SandboxConfigBase, ...]:
        return (self, *self.inner.parts())

    @property
    def own_root(self) -> bool:
        return self.inner.own_root

    def install_facts(self) -> dict[str, Any]:
        return {**super().install_facts(), "inner": self.inner.backend}

    def with_task_network(self, wants: bool, task: str) -> RaySandboxConfig:
        return self.model_copy(update={"inner": self.inner.with_task_network(wants, task)})


class ModalSandboxConfig(SandboxConfigBase):
    """Modal sandboxes, N slots each, through Modal's async SDK (extra `modal`)."""

    backend: Literal["modal"] = "modal"
    backend_class: ClassVar[str] = "clotho.sandbox.remote.modal_backend:ModalBackend"
    sdk: ClassVar[tuple[str, str] | None] = ("modal", "modal")
    place: ClassVar[Place] = "cluster"
    no_network_hint: ClassVar[str] = (
        "(a Harbor task's [environment] allow_internet = true) and this run gives its "
        "sandboxes none: --set sandbox.network=true"
    )
    app_name: str = Field("clotho-sandboxes", description="Modal app the sandboxes belong to")
    image: str | None = Field(
        "python:3.11-slim",
        description="registry image; a task's Dockerfile (EnvironmentSpec.context) wins",
    )
    build_context: str | None = Field(
        None, description="a folder with a Dockerfile to build the image from (set by prepare)"
    )
    dockerfile: str = "Dockerfile"
    workdir: str = "/app"
    slot_root: str = Field("/slots", description="each slot's folder is slot_root/k")
    env: dict[str, str] = Field(default_factory=dict)
    state_dir: str | None = None
    network: bool = False
    cpu: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, gt=0)
    gpu: str | None = None
    secrets: list[str] = Field(default_factory=list, description="Modal secret names")
    slots_per_sandbox: int = Field(1, ge=1, le=256)
    min_sandboxes: int = Field(0, ge=0, description="sandboxes kept warm")
    max_sandboxes: int = Field(16, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0, description="a sandbox with no slot in use")
    max_lifetime_s: float = Field(
        6 * 3600.0, gt=0, description="no new slot after half of it; never ends a used slot"
    )
    exec_timeout_s: float = Field(600.0, gt=0, description="default per-command limit")
    reuse: bool = Field(True, description="reuse a named live sandbox when its labels match")
    create_concurrency: int = Field(
        DEFAULT_CREATE_CONCURRENCY,
        ge=1,
        description="Modal sandboxes being created at once, run-wide (`clotho eval --create-concurrency`): "
        "a burst of rollouts waits its turn rather than hitting the service's rate limits all at "
        "once; only creation is capped, never the rollouts that use them",
    )

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        return self.backend_type()()

    def backend_key(self, *, docker_url: str | None = None) -> str:
        return f"modal {self.app_name}"

    def install_facts(self) -> dict[str, Any]:
        return {**super().install_facts(), "image": self.image}


class NomadSandboxConfig(SandboxConfigBase):
    """A Nomad job per pool: a sandbox server per allocation, N slots each (extra `nomad`)."""

    backend: Literal["nomad"] = "nomad"
    backend_class: ClassVar[str] = "clotho.sandbox.remote.nomad_backend:NomadBackend"
    place: ClassVar[Place] = "cluster"
    no_network_hint: ClassVar[str] = "and the nomad backend cannot give its sandboxes one"
    address: str = Field("http://127.0.0.1:4646", description="Nomad HTTP API")
    token_env: str = Field("NOMAD_TOKEN", description="environment variable with the ACL token")
    job_id: str = "clotho-sandbox"
    datacenters: list[str] = Field(default_factory=lambda: ["dc1"])
    driver: Literal["docker", "raw_exec"] = Field(
        "docker", description="raw_exec: the server runs under Singularity/Apptainer"
    )
    image: str = Field("clotho/sandbox-server:latest", description="docker image or SIF path")
    server_port: int = Field(8080, description="port inside the allocation (mapped dynamically)")
    workdir: str = Field("/app", description="inside each slot's folder")
    slot_root: str = Field("/slots", description="each slot's folder is slot_root/k")
    env: dict[str, str] = Field(default_factory=dict)
    state_dir: str | None = None
    cpu_mhz: int = Field(1000, gt=0)
    memory_mb: int = Field(2048, gt=0)
    slots_per_allocation: int = Field(8, ge=1, le=256)
    min_allocations: int = Field(1, ge=0)
    max_allocations: int = Field(16, ge=1)
    idle_timeout_s: float = Field(300.0, gt=0)
    request_timeout_s: float = Field(
        30.0, gt=0, description="per request, added to the command's own timeout"
    )
    scale_cooldown_s: float = Field(10.0, ge=0)
    create_concurrency: int = Field(
        DEFAULT_CREATE_CONCURRENCY,
        ge=1,
        description="allocations being created at once, run-wide (`clotho eval --create-concurrency`): "
        "a burst of rollouts waits its turn rather than hitting the cluster's rate limits all at "
        "once; only creation is capped, never the rollouts that use them",
    )

    def backend_key(self, *, docker_url: str | None = None) -> str:
        return f"nomad {self.address} {self.job_id}"

    def install_facts(self) -> dict[str, Any]:
        return {**super().install_facts(), "image": self.image}
