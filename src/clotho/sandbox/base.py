"""The sandbox interface every backend implements, and the result of a command."""

from __future__ import annotations

import abc
import dataclasses
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

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


# Without SHELL, bash looks its user up at start-up, and a lookup loads the name-service
# modules `nsswitch.conf` names, which are the agent's to write: the harness's own shells
# (the checks among them) look nobody up.
FRESH_ENV = {"SHELL": "/bin/sh"}


@dataclass(frozen=True)
class FreshCall:
    """One `Sandbox.exec_fresh` call, as the backend's `_exec_fresh` receives it."""

    cmd: str
    timeout: float
    env: dict[str, str] | None = None
    cwd: str | None = None
    stdin: bytes | None = None
    max_output_bytes: int = 1 << 20

    def options(self) -> dict[str, Any]:
        """The keyword arguments of `exec_fresh` (all but `cmd`), to pass the call on."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "cmd"}


@dataclass(frozen=True)
class PathChange:
    """One path where the sandbox's file system differs from how it started (the image, the
    empty private folders): what verification judges instead of samples of it. `link` is
    True or False where the backend saw the file's type, None where it cannot tell."""

    path: str
    kind: Literal["added", "changed", "removed"]
    link: bool | None = None


@dataclass(frozen=True)
class SocketPlace:
    """Where a sandbox without network reaches a unix socket the host binds (the model
    gateway's, the browser's): a host folder the sandbox sees at `inner_dir`."""

    host_dir: Path
    inner_dir: str
    owner_uid: int | None = None  # give the socket to this uid (the sandbox's own)
    mode: int | None = None  # set where the folder is the host's alone


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
    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        """Return a regular file's bytes; FileNotFoundError / IsADirectoryError for the obvious
        cases, OSError for a FIFO, device or socket (never opened for reading whole), and
        OSError(errno.EFBIG) naming the limit for a file above `max_bytes`: the host's memory
        and disk stay bounded whatever the agent left at the path."""

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

    # -- verification: nothing the agent controls -----------------------------------------

    async def exec_fresh(
        self,
        cmd: str,
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int = 1 << 20,
    ) -> ExecResult:
        """Run `cmd` with `bash --noprofile --norc -c` in a new process that shares nothing with
        the agent's session: started from outside the sandbox (not through its shell), with a
        clean environment (the sandbox's base environment plus `env`; no BASH_ENV, functions,
        aliases or traps of the agent), as the sandbox's root, on the sandbox's file system.
        Verification runs this way after `stop_agent`. Each output stream is cut at
        `max_output_bytes`, so the harness's memory stays bounded whatever is printed.

        Backends implement `_exec_fresh`, which receives the call whole."""
        call = FreshCall(cmd, timeout, {**FRESH_ENV, **(env or {})}, cwd, stdin, max_output_bytes)
        return await self._exec_fresh(call)

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """The backend's fresh process for `call` (see `exec_fresh`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot run fresh processes")

    async def stop_agent(self) -> None:
        """Stop every process the agent (or code it left) could be running, so nothing keeps
        acting while the task is verified; call it again to end what verification started.
        Afterwards only `exec_fresh` and `digests` may be used, and the pool destroys the
        sandbox on release. Idempotent."""
        raise NotImplementedError(f"{type(self).__name__} cannot stop the agent")

    async def hold_agent(self) -> int | None:
        """Freeze, without ending them, the processes the agent left (its services), so that
        nothing acts while verification is checked and prepared; returns how many it left.
        None: this backend cannot keep them for the tests (verification ends them with
        `stop_agent`, as it does when none were left). Afterwards only `exec_fresh`,
        `digests`, `changed_paths`, `verification_twin` and `release_agent` may be used."""
        return None

    async def release_agent(self) -> None:
        """Continue what `hold_agent` froze, once the tests run in `verification_twin`."""
        raise NotImplementedError(f"{type(self).__name__} cannot keep the agent's processes")

    async def verification_twin(self, *, empty: Sequence[str] = ()) -> Sandbox:
        """A sandbox whose file system is a snapshot of this held one and which shares only
        its network: the tests run there, reaching the agent's services, while nothing of
        the agent's can see or touch the tests, their runner or the reward. `empty`: files
        of the snapshot made empty before anything runs there (the loader's cache). Closing
        it removes it."""
        raise NotImplementedError(f"{type(self).__name__} cannot make a verification twin")

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        """The sha256 of each path as the sandbox sees it, computed without running anything
        inside the sandbox (from the host or the container engine); a symlink's digest is that
        of its target text, prefixed `link:`; None where nothing exists. Detects replaced
        programs (`python3`, `bash`) between the agent's start and the tests."""
        raise NotImplementedError(f"{type(self).__name__} cannot take digests")

    def socket_place(self) -> SocketPlace | None:
        """Where a unix socket the host binds can be reached from inside; None: nowhere (a
        backend without a folder shared with the host)."""
        return None

    async def changed_paths(self) -> list[PathChange] | None:
        """Every path created, changed or removed since the sandbox started, seen from outside
        (nothing run inside); a folder whose entries changed may be listed besides them. Files
        the harness put there before the agent (the task's workspace) are listed too: the
        list says what differs, not who did it. None: this backend cannot tell (verification
        then searches the writable places itself). Call it after `stop_agent`."""
        return None

    def resolve(self, path: str) -> str:
        """Absolute sandbox path for `path`, relative ones taken from the workdir."""
        return posixpath.normpath(posixpath.join(self.workdir, path))

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
