"""What every backend driving a `PersistentShell` shares: construction, exec, file-transfer
scripts whose exit codes become file errors, the stopped state after `stop_agent`, and an
idempotent close."""

from __future__ import annotations

import abc
import errno
from typing import Unpack

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecOptions, ExecResult, Sandbox
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.transfer import (
    IS_DIR_EXIT,
    NOT_FOUND_EXIT,
    NOT_REGULAR_EXIT,
    TOO_BIG_EXIT,
    too_big,
)


class ShellBackedSandbox(Sandbox):
    _shell: PersistentShell
    _closed: bool = False
    _stopped: bool = False

    def __init__(self, shell: PersistentShell, workdir: str, labels: dict[str, str]) -> None:
        self._shell = shell
        self.workdir = workdir
        self.labels = labels

    @property
    def stopped(self) -> bool:
        """True once `stop_agent` ran: the agent's channel is gone for good, and the pool
        destroys the sandbox on release whatever its reset mode."""
        return self._stopped

    def _check_live(self) -> None:
        if self._stopped:
            raise SandboxError("the sandbox's agent was stopped: only exec_fresh and digests work")
        if self._closed:
            raise SandboxError("the sandbox is closed")

    async def _transfer(self, script: str, what: str, limit: int = 0) -> ExecResult:
        """Run a file-transfer script; its exit codes become Python's file errors."""
        self._check_live()
        # A subshell: the script's `exit` must not end the session shell (and its state).
        result = await self._shell.run(f"( {script}\n)")
        if result.exit_code == NOT_FOUND_EXIT:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {what}")
        if result.exit_code == IS_DIR_EXIT:
            raise IsADirectoryError(f"is a directory: {what}")
        if result.exit_code == NOT_REGULAR_EXIT:
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)", what)
        if result.exit_code == TOO_BIG_EXIT:
            raise too_big(what, limit)
        if result.exit_code != 0:
            raise OSError(f"file transfer failed for {what}: {result.stderr.strip()}")
        return result

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        self._check_live()
        options["cwd"] = self.resolve(options.get("cwd") or self.workdir)
        return await self._shell.run(cmd, **options)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._end_processes()
            await self._shell.close()
        finally:
            await self._release()

    async def _end_processes(self) -> None:
        """Kill what the shell's own close cannot reach (a backend with a cgroup uses it)."""

    @abc.abstractmethod
    async def _release(self) -> None:
        """Remove what the backend holds besides the shell (folders, containers)."""
