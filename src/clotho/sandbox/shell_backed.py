"""What every backend driving a `PersistentShell` shares: construction, exec, file-transfer
scripts whose exit codes become file errors, the stopped state after `stop_agent`, and an
idempotent close; and, for those whose files cross a transfer folder (bubblewrap, ssh), the
file methods themselves (`FolderTransferSandbox`)."""

from __future__ import annotations

import abc
import errno
import os
import shlex
import uuid
from pathlib import Path
from typing import Unpack

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecOptions, ExecResult, Sandbox
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.transfer import (
    DEFAULT_DOWNLOAD_LIMIT,
    IS_DIR_EXIT,
    NOT_FOUND_EXIT,
    NOT_REGULAR_EXIT,
    TOO_BIG_EXIT,
    TransferFolder,
    remove_host_tree,
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


class FolderTransferSandbox(ShellBackedSandbox):
    """A shell-backed sandbox whose files cross one transfer folder: the host puts or takes
    one file there by name (`_xfer`) and the sandbox's own shell copies it into place or out
    (the scripts here, whose exit codes `_transfer` reads), so the host never walks a path
    the agent could have replaced. Whole trees cross as one tar file."""

    _xfer: TransferFolder
    _xfer_inner: str  # the transfer folder as the sandbox sees it

    def _xfer_name(self) -> tuple[str, str]:
        """A new transfer file's name, and its path inside the sandbox."""
        name = uuid.uuid4().hex
        return name, f"{self._xfer_inner}/{name}"

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        self._check_live()
        path = self.resolve(path)
        name, inner = self._xfer_name()
        try:
            await self._transfer(_regular_to(path, inner, max_bytes), path, max_bytes)
            return await self._xfer.read(name, max_bytes, path)
        finally:
            await self._xfer.remove(name)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_live()
        path = self.resolve(path)
        name, inner = self._xfer_name()
        try:
            await self._xfer.write(name, data)
            await self._put_from_xfer(inner, path)
        finally:
            await self._xfer.remove(name)

    async def _put_from_xfer(self, inner: str, path: str) -> None:
        """Have the shell copy the transfer file `inner` to `path`."""
        q = shlex.quote(path)
        await self._transfer(
            f'[ -d {q} ] && exit {IS_DIR_EXIT}; mkdir -p -- "$(dirname -- {q})" && '
            f"cat -- {inner} > {q}",
            path,
        )

    async def upload(self, local: Path, remote: str) -> None:
        self._check_live()
        remote = self.resolve(remote)
        name, inner = self._xfer_name()
        try:
            if local.is_file():  # copied, not read: a big file never sits in memory
                await self._xfer.copy_in(local, name)
                await self._put_from_xfer(inner, remote)
                return
            if not local.is_dir():
                raise FileNotFoundError(f"no such file or directory on the host: {local}")
            await self._xfer.tar_in(local, name)
            q = shlex.quote(remote)
            await self._transfer(
                f"mkdir -p -- {q} && tar -x --no-same-owner -f {inner} -C {q}", remote
            )
        finally:
            await self._xfer.remove(name)

    async def download(
        self, remote: str, local: Path, *, max_bytes: int = DEFAULT_DOWNLOAD_LIMIT
    ) -> None:
        """A file, or a tree (as a tar made inside, unpacked on the host with no link leading
        out of `local`); at most `max_bytes` in all, else OSError(EFBIG)."""
        self._check_live()
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        name, inner = self._xfer_name()
        q = shlex.quote(remote)
        script = (
            f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; if [ -d {q} ]; then echo d; "
            f"{{ tar -c -f - -C {q} . 2>/dev/null; }} | head -c {max_bytes + 1} > {inner}; "
            f"else stat -L -c %a -- {q} && {_regular_to(remote, inner, max_bytes)}; fi"
        )
        try:
            result = await self._transfer(script, remote, max_bytes)
            local.parent.mkdir(parents=True, exist_ok=True)
            try:
                if result.stdout.startswith("d"):
                    await self._xfer.untar_out(name, local, max_bytes, remote)
                else:
                    await self._xfer.copy_out(name, local, max_bytes, remote)
                    os.chmod(local, int(result.stdout.split()[0], 8) & 0o777)
            except BaseException:
                if local.is_dir() and not local.is_symlink():
                    await remove_host_tree(local)
                else:
                    local.unlink(missing_ok=True)
                raise
        finally:
            await self._xfer.remove(name)


def _regular_to(path: str, inner: str, max_bytes: int) -> str:
    """Shell: copy the regular file `path` (links followed inside the sandbox) to `inner`, or
    exit with the code for missing, directory, not regular, or bigger than `max_bytes`. `head`
    bounds the copy even if the file changes between the checks and the read."""
    q = shlex.quote(path)
    return (
        f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; [ -d {q} ] && exit {IS_DIR_EXIT}; "
        f"[ -f {q} ] || exit {NOT_REGULAR_EXIT}; "
        f'[ "$(stat -L -c %s -- {q})" -le {max_bytes} ] || exit {TOO_BIG_EXIT}; '
        f"head -c {max_bytes + 1} -- {q} > {inner}"
    )
