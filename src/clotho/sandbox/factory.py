"""Open a lone sandbox from its configuration, outside any pool.

A lone sandbox gets a backend of its own (a Docker client, for instance), closed with it:
nothing stays open after `close()`. A pool shares one backend between its sandboxes.
"""

from __future__ import annotations

from clotho.sandbox.backends import DEFAULT_LEASE_S, SandboxBackend, make_backend
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig


async def open_sandbox(
    config: SandboxConfig,
    labels: dict[str, str] | None = None,
    *,
    lease_s: float = DEFAULT_LEASE_S,
) -> Sandbox:
    backend = make_backend(config)
    try:
        sandbox = await backend.open(config, dict(labels or {}), lease_s=lease_s)
    except BaseException:
        await backend.aclose()
        raise
    _close_backend_with(sandbox, backend)
    return sandbox


def _close_backend_with(sandbox: Sandbox, backend: SandboxBackend) -> None:
    """Make the sandbox's `close()` close its private backend afterwards (idempotent)."""
    close_sandbox = sandbox.close

    async def close() -> None:
        try:
            await close_sandbox()
        finally:
            await backend.aclose()

    sandbox.close = close  # type: ignore[method-assign]
