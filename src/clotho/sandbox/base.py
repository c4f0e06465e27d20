"""The sandbox interface every backend implements, and the result of a command."""

from __future__ import annotations

import abc
import posixpath
from pathlib import Path
from typing import TypedDict

from pydantic import BaseModel


class ExecResult(BaseModel):
    """What one command did. `exit_code` is -9 style negative only for signals we sent."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class ExecOptions(TypedDict, total=False):
    """The keyword options of `Sandbox.exec`, for implementations that pass them on."""

    timeout: float | None
    cwd: str | None
    env: dict[str, str] | None
    user: str | None


class Sandbox(abc.ABC):
    """An isolated place where an agent's commands and files live.

    All paths are paths inside the sandbox. Relative paths are resolved against `workdir`.
    """

    workdir: str = "/app"
    labels: dict[str, str]

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        """Run `cmd` with bash; never raises for a failing command, only for a broken sandbox."""

    @abc.abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Return a file's bytes; FileNotFoundError / IsADirectoryError for the obvious cases."""

    @abc.abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file, creating parent directories."""

    @abc.abstractmethod
    async def upload(self, local: Path, remote: str) -> None:
        """Copy a host file or directory into the sandbox (a directory's contents go into `remote`)."""

    @abc.abstractmethod
    async def download(self, remote: str, local: Path) -> None:
        """Copy a sandbox file or directory to the host path `local`, which must not exist."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill every process of the sandbox and remove its host-side state. Idempotent."""

    def resolve(self, path: str) -> str:
        """Absolute sandbox path for `path`, relative ones taken from the workdir."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
