"""Sandbox configuration: one model per backend, chosen by the `backend` field."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_LOCAL_MEMORY_MB = 4096
DEFAULT_LOCAL_STORAGE_MB = 10240


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workdir: str = "/app"
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    max_output_bytes: int = Field(8 << 20, description="per stream; the middle is dropped beyond")
    shell: Literal["session", "isolated"] = Field(
        "session",
        description="session: commands run in one long-lived shell (variables persist, no fork); "
        "isolated: each command in its own subshell (a fork per command)",
    )
    state_dir: str | None = Field(
        None, description="host folder for sandbox state (default: TMPDIR)"
    )


class LocalSandboxConfig(_Common):
    """bubblewrap: namespaces, host root read-only or as a throw-away overlay."""

    backend: Literal["local"] = "local"
    root: Literal["auto", "overlay", "ro"] = Field(
        "auto", description="overlay needs root; auto picks overlay as root, else ro"
    )
    network: bool = False
    # Limits (sandbox/limits.py). None takes the task's value (`SlotPool.prepare`), else the
    # default: every local sandbox is bounded.
    memory_mb: int | None = Field(
        None,
        gt=0,
        description=f"memory and swap (cgroup); None: the task's, else {DEFAULT_LOCAL_MEMORY_MB}",
    )
    pids_limit: int = Field(4096, gt=0, description="processes and threads at once (cgroup)")
    storage_mb: int | None = Field(
        None,
        gt=0,
        description="disk written (overlay upper layer, workspace, transfers) and largest "
        f"file; beyond it the sandbox is killed; None: the task's, else {DEFAULT_LOCAL_STORAGE_MB}",
    )
    cpus: float | None = Field(None, gt=0, description="CPU quota; None: the task's, else none")
    cgroup_limits: bool = Field(
        True,
        description="enforce memory, process and CPU limits in cgroups (needs root on a cgroup "
        "v1 host); off: only storage is watched",
    )


class UnsafeLocalSandboxConfig(_Common):
    """Plain processes in a temporary directory on the host. No isolation at all."""

    backend: Literal["unsafe-local"] = "unsafe-local"


DEFAULT_DOCKER_MEMORY_MB = 4096
DEFAULT_DOCKER_STORAGE_MB = 10240


class DockerSandboxConfig(_Common):
    """A container per sandbox, driven through the Docker Engine API (extra `docker`)."""

    backend: Literal["docker"] = "docker"
    image: str = "clotho/base:bookworm"
    network: bool = False
    host_network: bool = Field(
        False,
        description="what `network` means on Docker here: the host's own network, its "
        "loopback services (the trajectory API, model servers) included, with no guard; "
        "`network` is refused unless this says so",
    )
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(
        None,
        gt=0,
        description=f"memory (cgroup; swap none); None: the task's, else {DEFAULT_DOCKER_MEMORY_MB}",
    )
    pids_limit: int | None = Field(4096, gt=0)
    storage_mb: int | None = Field(
        None,
        gt=0,
        description="the container's writable layer, watched (no storage driver quota here): "
        f"past it the container is killed; None: the task's, else {DEFAULT_DOCKER_STORAGE_MB}",
    )
    storage_check_s: float = Field(
        2.0, gt=0, description="how often the writable layer's size is checked while commands run"
    )
    docker_url: str | None = Field(
        None, description="Engine API address (default: DOCKER_HOST or the unix socket)"
    )
    init: bool = Field(
        True, description="run docker-init as pid 1 so signals and zombies are handled"
    )
    stdio: Literal["fifo", "attach"] = Field(
        "fifo",
        description="fifo: the shell's pipes are FIFOs in a bind-mounted host folder (a local "
        "daemon only; no copying through dockerd); attach: over the Engine API socket",
    )
    slots_per_container: int = Field(
        1,
        ge=1,
        le=256,
        description="sandboxes (slots) one container hosts, each with its own workspace and "
        "shell; 1: a container per sandbox. Limits (cpus, memory, pids) are per container",
    )
    slot_isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="with several slots per container: bwrap runs each slot in bubblewrap "
        "under its own uid (its workdir, /tmp and HOME private; needs bwrap and setpriv in "
        "the image and a relaxed seccomp profile on the container); none: slots are "
        "directories under /slots that can see each other; auto: bwrap when it works",
    )

    @model_validator(mode="after")
    def _network_is_the_hosts(self) -> DockerSandboxConfig:
        """Fail closed: a container with a network shares the host's (no bridge here), so an
        agent would reach what listens on the host's loopback. Asked for explicitly, or not."""
        if self.network and not self.host_network:
            raise ValueError(
                "network on the docker backend is the host's own network (its loopback "
                "services, such as the trajectory API and model servers, included, unguarded): "
                "set sandbox.host_network=true to accept that, or use the local backend, whose "
                "network guard keeps the host out"
            )
        return self


# Backends that place sandboxes beyond this host: their configs (remote_config.py) name a
# cluster and wrap the models above, so they are imported once those exist.
from clotho.sandbox.remote_config import (  # noqa: E402
    ModalSandboxConfig,
    NomadSandboxConfig,
    RaySandboxConfig,
)

SandboxConfig = Annotated[
    LocalSandboxConfig
    | UnsafeLocalSandboxConfig
    | DockerSandboxConfig
    | RaySandboxConfig
    | ModalSandboxConfig
    | NomadSandboxConfig,
    Field(discriminator="backend"),
]


def base_env(home: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a sandbox shell: nothing leaks in from the host process."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    env.update(extra)
    return env
