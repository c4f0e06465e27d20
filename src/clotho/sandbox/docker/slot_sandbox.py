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
import errno
import io
import posixpath
import shlex
import shutil
import tarfile
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from clotho.errors import LimitExceeded, SandboxError, TamperError
from clotho.sandbox.base import ExecResult
from clotho.sandbox.config import base_env
from clotho.sandbox.docker.archive import (
    download_tree,
    put_archive,
    read_file_from_archive,
)
from clotho.sandbox.docker.fresh import STOP_UID, fresh_exec, run_exec
from clotho.sandbox.docker.limits import LimitWatch, SlotCgroup
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.docker.slot_layout import (
    COUNT_UID_SCRIPT,
    REAP_SCRIPT,
    SlotLayout,
    container_path,
)
from clotho.sandbox.transfer import (
    BIG_FILE,
    IS_DIR_EXIT,
    NOT_FOUND_EXIT,
    read_host_file,
    unpack_tar,
)

# Exit codes of the read check: the path is not a regular file; it is over the size cap.
_NOT_REGULAR_EXIT, _TOO_BIG_EXIT = 82, 83


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
        (Path(tmp) / "u").mkdir()
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            unpack_tar(tar, tar.getmembers(), Path(tmp) / "u")  # linear in the tree's depth
        shutil.move(Path(tmp) / "u" / top, local)


def _unwrap(wrapped: Path, name: str, top: str, local: Path, max_bytes: int) -> None:
    """The outer archive holds the slot's tar as the one file `name`: unpack that tar (at
    most `max_bytes`) and move its `top` to `local`."""
    with tempfile.TemporaryDirectory(dir=local.parent) as tmp:
        with tarfile.open(wrapped, mode="r:") as outer:
            member = outer.next()
            if member is None or not member.isfile() or member.name != name:
                raise OSError("file transfer failed: the slot's archive is missing")
            if member.size > max_bytes:
                raise OSError(errno.EFBIG, f"the download is larger than {max_bytes} bytes")
            source = outer.extractfile(member)
            assert source is not None
            (Path(tmp) / "u").mkdir()
            with tarfile.open(fileobj=source, mode="r:") as tree:
                unpack_tar(tree, tree.getmembers(), Path(tmp) / "u")
        shutil.move(Path(tmp) / "u" / top, local)


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
    _shared_limits = True

    def __init__(
        self,
        *sandbox: Any,
        layout: SlotLayout,
        slot: int,
        retire: Callable[[SlotSandbox], Awaitable[None]],
        hide: list[str] | None = None,
        limits: LimitWatch | None = None,
        cgroup: SlotCgroup | None = None,
    ) -> None:
        """`sandbox`: `DockerSandbox`'s arguments (config, docker, container, shell, labels);
        `hide`: container paths an isolated slot's bubblewrap covers besides /slots;
        `limits`: the container's, shared by its slots; `cgroup`: the slot's own (its pids
        limit, its OOM kills), None where the host does not allow them."""
        super().__init__(*sandbox)
        if limits is not None:
            self.limits = limits
        self.cgroup = cgroup
        self._slot_hit: str | None = None  # a limit of the slot's own cgroup broke it
        self.layout = layout
        self.slot = slot
        self.workdir = layout.sandbox_workdir
        self._limit_who = layout.name
        self.hide = list(hide or [])
        self._retire = retire

    @property
    def id(self) -> str:
        return f"{self.container.id}#{self.slot}"

    @property
    def container_id(self) -> str:
        return str(self.container.id)

    def fresh_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The slot's base environment (its token included, so `stop_agent` finds what a
        fresh process started) plus `env`."""
        return {**self.layout.env(base_env(self.layout.home, self.config.env)), **(env or {})}

    def _raise_if_slot_hit(self) -> None:
        """`LimitExceeded` once the slot's own cgroup counted an OOM kill or a refused fork:
        exact (only its processes are counted there), so whatever the exit code said."""
        if self._slot_hit is None and self.cgroup is not None:
            self._slot_hit = self.cgroup.hit()
        if self._slot_hit is not None:
            raise LimitExceeded(self._slot_hit)

    async def _limited(self, run: Coroutine[Any, Any, ExecResult]) -> ExecResult:
        """The container's checks (disk, shared counters), then the slot's own counters."""
        if self._slot_hit is not None:
            run.close()
            raise LimitExceeded(self._slot_hit)
        try:
            result = await super()._limited(run)
        except Exception:
            self._raise_if_slot_hit()  # the shell died of it: the slot's limit says why
            await self._raise_if_at_nproc()
            raise
        self._raise_if_slot_hit()
        nproc = self.layout.nproc if self.cgroup is None else None
        if nproc:
            # Counted only when it may be so: the container holds as many tasks as the
            # slot's limit (a file read), or, where that cannot be read, the command failed.
            now = self.limits.pids_current()
            if (now is not None and now >= nproc - max(2, nproc // 16)) or (
                now is None and (result.exit_code != 0 or result.timed_out)
            ):
                await self._raise_if_at_nproc()
        return result

    async def _raise_if_at_nproc(self) -> None:
        """Without a cgroup, an isolated slot's processes are limited by RLIMIT_NPROC, which
        counts no refusals: the slot's uid running (within a few tasks of) as many tasks as
        its limit, as a fork bomb holds them while its forks retry, ends the slot as
        `limit`. A workload that close to its limit is refused forks already."""
        nproc = self.layout.nproc
        if self.cgroup is not None or not nproc or not self.layout.isolated:
            return
        near = nproc - max(2, nproc // 16)
        code, output = await run_exec(
            self.container, ["sh", "-c", COUNT_UID_SCRIPT, "count", str(self.layout.uid)]
        )
        tasks = output.strip().splitlines()[-1:] if code == 0 else []
        if tasks and tasks[0].isdigit() and int(tasks[0]) >= near:
            self._slot_hit = f"the sandbox hit its process limit ({nproc}): its forks were refused"
            raise LimitExceeded(self._slot_hit)

    async def _begin_stop(self) -> None:
        """What stopping the agent starts with, isolated or not: a limit the slot or its
        container hit is raised first (that is why it stopped), then the slot is stopped and
        everything in its cgroup killed (forks refused first): nothing a process changes
        about itself takes it out of there."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self.limits.raise_if_hit(self._limit_who)  # a container killed past its disk quota
        self._raise_if_slot_hit()
        self._stopped = True
        if self.cgroup is not None:
            left = await asyncio.to_thread(self.cgroup.kill_all)
            if left:
                raise TamperError(f"processes of slot {self.slot} survived stopping: {left[:5]}")

    async def stop_agent(self) -> None:
        """Kill every process of this slot only, its neighbours untouched: everything in its
        cgroup, and everything with its token (without a slot cgroup, a process that
        cleared its environment survives without isolation)."""
        await self._begin_stop()
        code, output = await run_exec(
            self.container, ["sh", "-c", REAP_SCRIPT, "stop", self.layout.token, "", ""]
        )
        if code != 0:
            raise SandboxError(f"stopping slot {self.slot} failed: exit {code}: {output[-500:]}")

    def _container_path(self, path: str) -> str | None:
        """An isolated slot's binds mapped back to its folder (`container_path`)."""
        return container_path(self.layout, path, self.hide)

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

    def _fresh_argv(self, cmd: str, cwd: str) -> tuple[list[str], str]:
        """A fresh bubblewrap with the slot's binds, under its uid (setpriv drops root)."""
        argv = self.layout.shell_argv(
            "bash", network=self.config.network, hide=self.hide, chdir=cwd
        )
        return [*argv, "-c", cmd], "/"

    async def stop_agent(self) -> None:
        """Kill every process of the slot's uid, in or out of its bubblewrap: `kill -1` run
        as that uid reaches exactly those (`fresh.STOP_UID`); then the daemon's process list
        (nothing run in the container) must show none of them left."""
        await self._begin_stop()
        uid = self.layout.uid
        left: list[str] = []
        for _ in range(5):
            await fresh_exec(
                self.container, ["bash", "--noprofile", "--norc", "-c", STOP_UID],
                env=self.fresh_env(None), timeout=60.0, cwd="/", user=f"{uid}:{uid}",
            )  # fmt: skip
            top = await self.container.top(ps_args="-o pid,uid,stat,comm")
            rows = top.get("Processes") or []
            left = [" ".join(r) for r in rows if r[1] == str(uid) and r[2][:1] not in "ZX"]
            if not left:
                return
        raise TamperError(f"processes of slot {self.slot} survived stopping: {left[:5]}")

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        """Through the slot's shell: only a regular file (links followed with the slot's
        view), at most `max_bytes` (OSError EFBIG beyond, before anything is copied)."""
        self._usable()
        path = self.resolve(path)
        q = shlex.quote(path)
        check = await self._shell.run(
            f"( [ -e {q} ] || exit {NOT_FOUND_EXIT}; [ -d {q} ] && exit {IS_DIR_EXIT}; "
            f"[ -f {q} ] || exit {_NOT_REGULAR_EXIT}; "
            f'[ "$(stat -L -c %s -- {q})" -le {max_bytes} ] || exit {_TOO_BIG_EXIT}\n)'
        )
        if check.exit_code == _NOT_REGULAR_EXIT:
            raise OSError(f"not a regular file: {path}")
        if check.exit_code == _TOO_BIG_EXIT:
            raise OSError(errno.EFBIG, f"{path} has more than {max_bytes} bytes")
        data = await self._through_xfer(
            f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; [ -d {q} ] && exit {IS_DIR_EXIT}; "
            f"head -c {max_bytes + 1} -- {q}",
            path,
        )
        if len(data) > max_bytes:  # it grew meanwhile
            raise OSError(errno.EFBIG, f"{path} has more than {max_bytes} bytes")
        return data

    async def write_file(self, path: str, data: bytes) -> None:
        self._usable()
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
        self._usable()
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

    async def download(self, remote: str, local: Path, *, max_bytes: int = 4 << 30) -> None:
        """The slot's shell tars the tree into its transfer folder (cut past `max_bytes`);
        the host streams that one file to disk and unpacks it in a thread."""
        self._usable()
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        q = shlex.quote(remote)
        outer, inner = self.layout.resolve_xfer(uuid.uuid4().hex)
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            await self._transfer(
                f'[ -e {q} ] || exit {NOT_FOUND_EXIT}; tar -cf - -C "$(dirname -- {q})" -- '
                f'"$(basename -- {q})" | head -c {max_bytes + 1} > {shlex.quote(inner)}',
                remote,
            )
            with tempfile.TemporaryDirectory(dir=local.parent) as tmp:
                wrapped = Path(tmp) / "wrapped.tar"
                await download_tree(self.container, outer, remote, wrapped, max_bytes + (1 << 20))
                await asyncio.to_thread(
                    _unwrap, wrapped, posixpath.basename(outer), posixpath.basename(remote),
                    local, max_bytes,
                )  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                await self._shell.run(f"rm -f -- {shlex.quote(inner)}")

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
