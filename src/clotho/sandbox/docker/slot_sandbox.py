"""A sandbox that is one slot of a shared container (see `slots.py` for who hands them out).

Without isolation a slot is a `DockerSandbox` whose workdir is its own folder: paths are plain
container paths and files move through the Engine API as usual. An isolated slot sees a
different filesystem than the Engine API does (its `/app` is `/slots/k/app`, its `/tmp` is
private), and a path it controls may be a symlink into a neighbour, so its files move
through its own shell instead, as the local backend's do through its host folder: the API
puts one regular file (the bytes, or a tar of a tree) into the slot's transfer folder and
the slot's shell copies or unpacks it into place with the slot's own rights; the other way,
the shell leaves one file there for the API to fetch. Docker never walks a directory the
slot controls, and the slot never reaches a path it could not reach itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.archive import put_archive, read_file_from_archive
from clotho.sandbox.docker.backend import DockerSandbox
from clotho.sandbox.docker.slot_layout import SlotLayout
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.transfer import BIG_FILE, IS_DIR_EXIT, NOT_FOUND_EXIT, read_host_file


def _tree_tar(local: Path, name: str, uid: int) -> bytes:
    """A host tree as a tar file `name` inside a tar: Docker writes one file into the slot,
    and the slot unpacks it itself (Docker never walks directories the slot controls)."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w") as tar:
        for child in sorted(local.iterdir()):
            tar.add(child, arcname=child.name)
    return _bytes_tar(name, inner.getvalue(), uid)


def _extract_one(archive: bytes, top: str, local: Path) -> None:
    """Unpack the slot's tar of `top` and move it to `local` (nothing else lands there)."""
    with tempfile.TemporaryDirectory(dir=local.parent) as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        shutil.move(Path(tmp) / top, local)


def _bytes_tar(name: str, data: bytes, uid: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o600
        info.uid = info.gid = uid
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class SlotSandbox(DockerSandbox):
    """Slot `slot` of a container shared with other sandboxes; its workdir is its own folder."""

    isolation = "none"

    def __init__(
        self,
        config: DockerSandboxConfig,
        docker: Any,
        container: Any,
        shell: PersistentShell,
        labels: dict[str, str],
        *,
        layout: SlotLayout,
        slot: int,
        retire: Callable[[SlotSandbox], Awaitable[None]],
    ) -> None:
        super().__init__(config, docker, container, shell, labels)
        self.layout = layout
        self.slot = slot
        self.workdir = layout.sandbox_workdir
        self._retire = retire

    @property
    def id(self) -> str:
        return f"{self.container.id}#{self.slot}"

    @property
    def container_id(self) -> str:
        return str(self.container.id)

    async def close(self) -> None:
        """Kill every process of the slot, wipe its folder; the last slot removes the container."""
        if self._closed:
            return
        self._closed = True
        try:
            # Shielded: a cancelled caller must not leave the slot half cleaned (and taken).
            await asyncio.shield(self._retire(self))  # kills the shell before its pipes close
        finally:
            await self._shell.close()

    async def _release(self) -> None:
        """Unused: `close` hands the slot back to its host."""


class IsolatedSlotSandbox(SlotSandbox):
    """A slot inside bubblewrap: files move through its own shell (its view, its rights)."""

    isolation = "bwrap"

    async def read_file(self, path: str) -> bytes:
        path = self.resolve(path)
        q = shlex.quote(path)
        return await self._through_xfer(
            f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; [ -d {q} ] && exit {IS_DIR_EXIT}; cat -- {q}",
            path,
        )

    async def write_file(self, path: str, data: bytes) -> None:
        path = self.resolve(path)
        q = shlex.quote(path)
        name = uuid.uuid4().hex
        if len(data) > BIG_FILE:
            archive = await asyncio.to_thread(_bytes_tar, name, data, self.layout.uid)
        else:
            archive = _bytes_tar(name, data, self.layout.uid)
        await self._from_xfer(
            name,
            archive,
            f'[ -d {q} ] && exit {IS_DIR_EXIT}; mkdir -p -- "$(dirname -- {q})" && cat -- "$x" > {q}',
            path,
        )

    async def upload(self, local: Path, remote: str) -> None:
        remote = self.resolve(remote)
        if local.is_file():
            await self.write_file(remote, await read_host_file(local))
            return
        if not local.is_dir():
            raise FileNotFoundError(f"no such file or directory on the host: {local}")
        name = uuid.uuid4().hex
        archive = await asyncio.to_thread(_tree_tar, local, name, self.layout.uid)
        q = shlex.quote(remote)
        await self._from_xfer(
            name, archive, f'mkdir -p -- {q} && tar -xf "$x" -C {q} --no-same-owner', remote
        )

    async def download(self, remote: str, local: Path) -> None:
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        q = shlex.quote(remote)
        archive = await self._through_xfer(
            f'[ -e {q} ] || exit {NOT_FOUND_EXIT}; tar -cf - -C "$(dirname -- {q})" -- '
            f'"$(basename -- {q})"',
            remote,
        )
        local.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(_extract_one, archive, posixpath.basename(remote), local)

    async def _from_xfer(self, name: str, archive: bytes, script: str, what: str) -> None:
        """Put `archive` (a tar of the one file `name`) into the transfer folder, then run
        `script` in the slot, where "$x" is that file (removed at the end)."""
        await put_archive(self.container, self.layout.xfer_dir, archive)
        inner = shlex.quote(self.layout.resolve_xfer(name)[1])
        await self._transfer(f"x={inner}; trap 'rm -f -- \"$x\"' EXIT; {script}", what)

    async def _through_xfer(self, script: str, what: str) -> bytes:
        """Run `script` in the slot with its stdout going to a fresh transfer file, and return
        that file's bytes (fetched through the Engine API); the file is removed after."""
        outer, inner = self.layout.resolve_xfer(uuid.uuid4().hex)
        inner = shlex.quote(inner)
        try:
            await self._transfer(f"{{ {script}\n}} > {inner}", what)
            return await read_file_from_archive(self.container, outer, what)
        finally:
            with contextlib.suppress(Exception):
                await self._shell.run(f"rm -f -- {inner}")
