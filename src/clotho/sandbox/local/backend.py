"""The bubblewrap and unsafe-local backends: sandboxes that are a labelled host folder plus
processes on this host (`bwrap.py`, `unsafe_local.py`), registered by their configs
(`LocalSandboxConfig.backend_class`, `UnsafeLocalSandboxConfig.backend_class`)."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from clotho.sandbox.backends import (
    ConfigT,
    EnvironmentSpec,
    OpenRequest,
    PreparedEnvironment,
    SandboxBackend,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig
from clotho.sandbox.host.leases import SandboxRecord, local_records, remove_local
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.local.config import LocalSandboxConfig, UnsafeLocalSandboxConfig
from clotho.sandbox.local.unsafe_local import UnsafeLocalSandbox


class FolderBackend(SandboxBackend[ConfigT]):
    """Sandboxes that are a labelled host folder plus processes (`host/state.py`).

    The folders of bubblewrap and unsafe-local sandboxes look alike, so both backends list
    every sandbox folder in their state folder (as records of backend "local").
    """

    sandbox_type: ClassVar[Any]  # its `create(config, labels)` makes the sandbox

    def __init__(self, state_dir: str | None = None) -> None:
        self.state_dir = state_dir

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """The task's limits on a bubblewrap config, as Docker applies them: the base config's
        own values win, the task's fill what it leaves unset (then the defaults do)."""
        if isinstance(base, LocalSandboxConfig):
            base = base.model_copy(
                update={
                    "cpus": base.cpus or spec.cpus,
                    "memory_mb": base.memory_mb or spec.memory_mb,
                    "storage_mb": base.storage_mb or spec.storage_mb,
                }
            )
        return PreparedEnvironment(config=base, workspace_in_image=False)

    async def records(self) -> list[SandboxRecord]:
        """The sandbox folders; listing also drops empty sandbox cgroups whose folder is
        gone (`limits.sweep_empty`: an exit cleanup removes folders only)."""
        from clotho.sandbox.local.limits import sweep_empty

        await asyncio.to_thread(sweep_empty)
        found = await asyncio.to_thread(local_records, self.state_dir)
        return [r for r in found if r.backend == "local"]

    async def remove(self, record: SandboxRecord) -> None:
        """Kill the leftover's processes (its cgroups first: they hold every process however
        it was forked) and remove its folder and cgroups."""
        if record.path is not None:  # remove_local ends its cgroups before the folder
            await asyncio.to_thread(remove_local, record)

    async def _open(self, request: OpenRequest[ConfigT]) -> Sandbox:
        """A sandbox of `sandbox_type`; the lease is not passed on (`create` writes the
        default one)."""
        sandbox: Sandbox = await self.sandbox_type.create(request.config, request.labels)
        return sandbox


class LocalBackend(FolderBackend[LocalSandboxConfig]):
    """bubblewrap on this host (`bwrap.py`)."""

    kind = "local"
    config_type = LocalSandboxConfig
    sandbox_type = BwrapSandbox


class UnsafeLocalBackend(FolderBackend[UnsafeLocalSandboxConfig]):
    """Plain processes in a host folder (`unsafe_local.py`): no isolation."""

    kind = "unsafe-local"
    config_type = UnsafeLocalSandboxConfig
    sandbox_type = UnsafeLocalSandbox
