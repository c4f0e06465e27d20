"""Sandboxes: where agent commands and files live. One folder per backend: `local/`
(bubblewrap, unsafe-local), `docker/`, `ssh/`, `ray/`, `remote/` (Modal, Nomad); `host/` is
the bookkeeping they share (state folders, leases, exit cleanup, cgroups).

Callers see only what is exported here: a `Sandbox`, its configuration, the pool, and the
backend-neutral `EnvironmentSpec` -> `PreparedEnvironment` step; which backend runs is
known only inside this package (each config names its backend: `config.py`; every kind is
registered by an entry point, read when kinds are first listed).
"""

from clotho.sandbox.backends import EnvironmentSpec, PreparedEnvironment, SandboxBackend
from clotho.sandbox.base import ExecResult, Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.factory import open_sandbox
from clotho.sandbox.local.config import LocalSandboxConfig, UnsafeLocalSandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool

__all__ = [
    "DockerSandboxConfig",
    "EnvironmentSpec",
    "ExecResult",
    "LocalSandboxConfig",
    "PoolConfig",
    "PreparedEnvironment",
    "Sandbox",
    "SandboxBackend",
    "SandboxConfig",
    "SlotPool",
    "UnsafeLocalSandboxConfig",
    "open_sandbox",
]
