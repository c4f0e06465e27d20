"""What every backend driving a `PersistentShell` shares: exec and an idempotent close."""

from __future__ import annotations

import abc

from clotho.sandbox.base import ExecResult, Sandbox
from clotho.sandbox.shell import PersistentShell


class ShellBackedSandbox(Sandbox):
    _shell: PersistentShell
    _closed: bool = False

    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        return await self._shell.run(
            cmd, timeout=timeout, cwd=self.resolve(cwd or self.workdir), env=env, user=user
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._shell.close()
        finally:
            await self._release()

    @abc.abstractmethod
    async def _release(self) -> None:
        """Remove what the backend holds besides the shell (folders, containers)."""
