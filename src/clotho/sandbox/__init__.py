"""Sandboxes: where agent commands and files live (bubblewrap locally, more backends later)."""

from clotho.sandbox.base import ExecResult, Sandbox
from clotho.sandbox.config import LocalSandboxConfig, SandboxConfig, UnsafeLocalSandboxConfig
from clotho.sandbox.factory import open_sandbox

__all__ = [
    "ExecResult",
    "LocalSandboxConfig",
    "Sandbox",
    "SandboxConfig",
    "UnsafeLocalSandboxConfig",
    "open_sandbox",
]
