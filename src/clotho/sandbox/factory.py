"""Open a sandbox from its configuration."""

from __future__ import annotations

from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import (
    DockerSandboxConfig,
    LocalSandboxConfig,
    SandboxConfig,
    UnsafeLocalSandboxConfig,
)


async def open_sandbox(config: SandboxConfig, labels: dict[str, str] | None = None) -> Sandbox:
    if isinstance(config, LocalSandboxConfig):
        from clotho.sandbox.bwrap import BwrapSandbox

        return await BwrapSandbox.create(config, labels)
    if isinstance(config, UnsafeLocalSandboxConfig):
        from clotho.sandbox.unsafe_local import UnsafeLocalSandbox

        return await UnsafeLocalSandbox.create(config, labels)
    if isinstance(config, DockerSandboxConfig):
        from clotho.sandbox.docker.backend import DockerSandbox

        return await DockerSandbox.create(config, labels)
    raise TypeError(f"unknown sandbox config: {type(config).__name__}")
