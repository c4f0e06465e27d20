"""The local kinds' configs: bubblewrap (`local`) and plain host processes (`unsafe-local`).

Registered by their entry points (pyproject.toml, `clotho.sandbox_kinds`); their backends
(`backend.py`) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from clotho.sandbox.config import (
    NETWORK_ASKED,
    HostSandboxConfig,
    ReadOnlyMount,
    SandboxConfigBase,
)

if TYPE_CHECKING:
    from clotho.sandbox.backends import SandboxBackend

DEFAULT_LOCAL_MEMORY_MB = 4096
DEFAULT_LOCAL_STORAGE_MB = 10240


class LocalSandboxConfig(HostSandboxConfig):
    """bubblewrap: namespaces, host root read-only or as a throw-away overlay."""

    backend: Literal["local"] = "local"
    backend_class: ClassVar[str] = "clotho.sandbox.local.backend:LocalBackend"
    no_network_hint: ClassVar[str] = (
        NETWORK_ASKED + "its sandboxes none: run with --network (as root, the local backend's "
        "network is guarded: the host's own services stay out of reach)"
    )
    root: Literal["auto", "overlay", "ro"] = Field(
        "auto", description="overlay needs root; auto picks overlay as root, else ro"
    )
    network: bool = False
    # Limits (sandbox/local/limits.py). None takes the task's value (`SlotPool.prepare`), else the
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
        description="disk written (overlay upper layer, workspace, transfers), its files "
        "(one inode per 16 KB) and the largest file: the state folder is a file system of "
        "this size, so a write past it fails with ENOSPC and a command after which it is full "
        "ends the sandbox as `limit`; where loop devices cannot be used (not root) the size "
        "is watched, the sandbox killed past it, and files are not counted (said at run "
        f"time); None: the task's, else {DEFAULT_LOCAL_STORAGE_MB}",
    )
    cpus: float | None = Field(None, gt=0, description="CPU quota; None: the task's, else none")
    ro_mounts: list[ReadOnlyMount] = Field(
        default_factory=list,
        description="host folders bound read-only into each sandbox (installed agents' packages)",
    )
    cgroup_limits: bool = Field(
        True,
        description="enforce memory, process and CPU limits in cgroups (needs root on a cgroup "
        "v1 host); off: only storage is limited",
    )

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        return self.backend_type()(self.state_dir)

    def install_facts(self) -> dict[str, Any]:
        return {**super().install_facts(), "root": self.root}


class UnsafeLocalSandboxConfig(HostSandboxConfig):
    """Plain processes in a temporary directory on the host. No isolation at all."""

    backend: Literal["unsafe-local"] = "unsafe-local"
    backend_class: ClassVar[str] = "clotho.sandbox.local.backend:UnsafeLocalBackend"
    isolated: ClassVar[bool] = False

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        return self.backend_type()(self.state_dir)

    @classmethod
    def listing(cls, state_dir: str | None) -> SandboxConfigBase | None:
        return None  # its folders look like bubblewrap's: the local backend lists both

    def with_task_network(self, wants: bool, task: str) -> UnsafeLocalSandboxConfig:
        return self  # the host's own network, whatever anyone says
