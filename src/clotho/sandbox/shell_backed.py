"""What every backend driving a `PersistentShell` shares: construction, exec, file-transfer
scripts whose exit codes become file errors, and an idempotent close."""

from __future__ import annotations

import abc
from typing import Unpack

from clotho.sandbox.base import ExecOptions, ExecResult, Sandbox
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.transfer import IS_DIR_EXIT, NOT_FOUND_EXIT


class ShellBackedSandbox(Sandbox):
    _shell: PersistentShell
    _closed: bool = False

    def __init__(self, shell: PersistentShell, workdir: str, labels: dict[str, str]) -> None:
        self._shell = shell
        self.workdir = workdir
        self.labels = labels

    async def _transfer(self, script: str, what: str) -> ExecResult:
        """Run a file-transfer script; its exit codes become Python's file errors."""
        # A subshell: the script's `exit` must not end the session shell (and its state).
        result = await self._shell.run(f"( {script}\n)")
        if result.exit_code == NOT_FOUND_EXIT:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {what}")
        if result.exit_code == IS_DIR_EXIT:
            raise IsADirectoryError(f"is a directory: {what}")
        if result.exit_code != 0:
            raise OSError(f"file transfer failed for {what}: {result.stderr.strip()}")
        return result

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        options["cwd"] = self.resolve(options.get("cwd") or self.workdir)
        return await self._shell.run(cmd, **options)

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
