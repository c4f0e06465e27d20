"""`DockerSandbox`: a sandbox that is a container of its own (`backend.py` opens them).

A sandbox is a container whose own process is the persistent shell: with `stdio: fifo` (a
local daemon) the container's command is `fifo.main_shell_command`, which redirects to three
FIFOs in a bind-mounted host folder, announces `bash` or `sh` and execs it, so a sandbox
costs a create and a start and no exec, and command I/O never passes through dockerd. An
image with an ENTRYPOINT keeps it: its container runs `sleep infinity` through the
entrypoint and the shell is an exec on the FIFOs; so does an image whose container does not
announce a shell. With `stdio: attach` (or a remote daemon) the shell is an exec attached
over the Engine API socket. Containers run under docker-init, with network `none` unless
enabled, CPU / memory / pids limits, and labels naming clotho, the owner process, the run
and the lease (`containers.py`). Files travel as tar archives through the Engine API.
Closing kills the container (SIGKILL, no stop grace period) and removes it. A slot
(`slot_sandbox.py`) and a sandbox with sidecars (`sidecars.py`) are `DockerSandbox`es too.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import secrets
import shlex
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Literal, Unpack

from clotho.errors import SandboxError, TamperError, TaskError
from clotho.sandbox.backends import DEFAULT_LEASE_S
from clotho.sandbox.base import (
    ExecOptions,
    ExecResult,
    FreshCall,
    PathChange,
    Sandbox,
    SocketPlace,
)
from clotho.sandbox.config import (
    DEFAULT_DOCKER_STORAGE_MB,
    DockerSandboxConfig,
    base_env,
)
from clotho.sandbox.docker import freeze
from clotho.sandbox.docker.archive import download_tree, path_digest, put_archive, read_regular
from clotho.sandbox.docker.channel import DockerExecChannel
from clotho.sandbox.docker.containers import (
    LABEL,
    client_url,
    container_body,
    container_limits,
    create_container,
    delete_container,
    image_at_fault,
    start_container,
)
from clotho.sandbox.docker.fifo import MOUNT as FIFO_MOUNT
from clotho.sandbox.docker.fifo import DockerFifoChannel, main_shell_command, make_fifos
from clotho.sandbox.docker.fresh import STOP_CONTAINER, fresh_exec, in_container
from clotho.sandbox.docker.images import ImageFactsCache
from clotho.sandbox.docker.quota import confine
from clotho.sandbox.docker.rootfs import host_digests
from clotho.sandbox.docker.twin import VFORK_WAITS, live_binds, remove_snapshot, snapshot
from clotho.sandbox.host import exit_cleanup
from clotho.sandbox.host.leases import DOCKER_IO
from clotho.sandbox.host.state import make_state_dir, remove_state_dir
from clotho.sandbox.shell import PersistentShell, ShellChannel
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.transfer import XferDir

_CHANGE_KINDS: dict[int, Literal["added", "changed", "removed"]] = {
    0: "changed", 1: "added", 2: "removed",
}  # fmt: skip
_UPPER_MAX = 1_000_000


def _upper_changes(driver: dict[str, Any]) -> list[PathChange] | None:
    """The overlay2 upper folder of a local daemon's container, walked from the host; None
    where it is not one this host can read (another driver, a remote daemon's path)."""
    data = driver.get("Data") or {}
    upper, lowers = data.get("UpperDir"), [d for d in (data.get("LowerDir") or "").split(":") if d]
    if driver.get("Name") != "overlay2" or not upper or not os.path.isdir(upper):
        return None
    found: list[PathChange] = []
    stack = [(upper, "")]
    try:
        while stack:
            folder, inside = stack.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    path = f"{inside}/{entry.name}"
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:  # a whiteout
                        found.append(PathChange(path, "removed", False))
                        continue
                    lower = any(os.path.lexists(low + path) for low in lowers)
                    link = stat.S_ISLNK(info.st_mode)
                    found.append(PathChange(path, "changed" if lower else "added", link))
                    if stat.S_ISDIR(info.st_mode):
                        stack.append((entry.path, path))
            if len(found) > _UPPER_MAX:
                return None
    except OSError:
        return None
    return found


def _tar_of(local: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if local.is_dir():
            for child in sorted(local.iterdir()):
                tar.add(child, arcname=child.name)
        else:
            tar.add(local, arcname=arcname)
    return buffer.getvalue()


def _unpack(archive: Path, target: Path) -> None:
    with tarfile.open(archive, mode="r:") as tar:
        tar.extractall(target, filter="data")


class DockerSandbox(ShellBackedSandbox):
    _shared_limits = False  # slots share their container's cgroup with their neighbours
    _limit_who: str | None = None  # a slot's name: a neighbour's disk failure is not its own
    _snapshot: str | None = None  # a verification twin's image, removed with it
    _script_shell = "bash"  # what runs `_container_script`: sh in an image without bash
    _held = False  # frozen by `hold_agent` (the daemon's pause) until `release_agent`

    def __init__(
        self,
        config: DockerSandboxConfig,
        docker: Any,
        container: Any,
        shell: PersistentShell,
        labels: dict[str, str],
    ) -> None:
        self.config = config
        self.workdir = config.workdir
        self.labels = labels
        self.container = container
        self._docker = docker
        self._shell = shell
        self.io_dir: Path | None = None
        self._io_xfer: XferDir | None = None  # uploads through io_dir (opened on first use)
        self._closed = False
        self._stopped = False
        self.limits = container_limits(container, config)

    @property
    def id(self) -> str:
        return str(self.container.id)

    @property
    def id_of_container(self) -> str:
        """The container's id (a slot's `id` adds its number)."""
        return str(self.container.id)

    @classmethod
    async def create(
        cls,
        config: DockerSandboxConfig,
        labels: dict[str, str] | None = None,
        *,
        docker: Any,
        images: ImageFactsCache,
        lease_s: float = DEFAULT_LEASE_S,
        network_of: str | None = None,
        binds: list[str] | None = None,
        empty: Sequence[str] = (),
    ) -> DockerSandbox:
        """A container of its own (`DockerBackend.open` is the way in: it owns `docker`);
        `empty`: files made empty before anything runs in it."""
        exit_cleanup.register("docker", docker_url=client_url(docker))
        labels = dict(labels or {})
        container = None
        io_dir: Path | None = None
        try:
            body = container_body(config, labels, lease_s, network_of, binds)
            if config.stdio == "fifo" and getattr(docker.connector, "path", None):
                io_dir = make_state_dir(config.state_dir, {**labels, DOCKER_IO: "1"}, lease_s)
                make_fifos(io_dir)
                # Read-only: the shell opens its FIFOs (writable on a read-only mount) and reads uploads
                # the host puts there; it can store nothing outside its own disk quota.
                body["HostConfig"]["Binds"] = [
                    *body["HostConfig"].get("Binds", []),
                    f"{io_dir}:{FIFO_MOUNT}:ro",
                ]
                shell = None
                if network_of or not (await images.get(config.image)).entrypoint:
                    container, shell = await cls._main_shell(docker, body, config, io_dir, empty)
                if shell is not None:
                    sandbox = cls(config, docker, container, shell, labels)
                    sandbox.io_dir = io_dir
                    await sandbox.limits.start()
                    return sandbox
                make_fifos(io_dir, replace=True)  # the image cannot run it: exec a shell
            container = await start_container(docker, body, config, empty)
            try:
                shell = await cls._start_shell(container, config, "bash", io_dir)
            except SandboxError:
                # No bash in the image: a POSIX sh runs commands isolated (no session mode).
                if io_dir is not None:  # fresh FIFOs (same folder: it is bind-mounted)
                    make_fifos(io_dir, replace=True)
                shell = await cls._start_shell(container, config, "sh", io_dir)
            sandbox = cls(config, docker, container, shell, labels)
            sandbox.io_dir = io_dir
            await sandbox.limits.start()
        except BaseException as exc:
            cause = None
            if isinstance(exc, SandboxError) and container is not None:
                cause = await image_at_fault(docker, container, config.image)
            if container is not None:
                await delete_container(container)
            if io_dir is not None:
                remove_state_dir(io_dir)
            if cause is not None:
                raise TaskError(f"{cause} ({exc})") from exc
            raise
        return sandbox

    @staticmethod
    async def _main_shell(
        docker: Any,
        body: dict[str, Any],
        config: DockerSandboxConfig,
        io_dir: Path,
        empty: Sequence[str] = (),
    ) -> tuple[Any, PersistentShell | None]:
        """A container whose first process is the shell (no exec round trips). Returns no
        shell, and no container, when the image cannot run it (no `sh`, an entrypoint)."""
        env = base_env("/root", config.env)
        body = {
            **body,
            "Cmd": main_shell_command(),
            "Env": [f"{k}={v}" for k, v in env.items()],
        }
        container = await create_container(docker, body, config.image, empty)
        channel = DockerFifoChannel(
            container, io_dir, env=env, workdir=config.workdir, main_process=True
        )
        try:
            await confine(container, config.storage_mb or DEFAULT_DOCKER_STORAGE_MB)  # quota.py
            await channel.open()
            shell = PersistentShell(
                channel=channel,
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session" and channel.shell_name == "bash",
            )
            await shell.start()
        except SandboxError:
            await channel.close()
            await delete_container(container)
            return None, None
        except BaseException:
            await channel.close()
            await delete_container(container)
            raise
        return container, shell

    @staticmethod
    async def _start_shell(
        container: Any, config: DockerSandboxConfig, name: str, io_dir: Path | None
    ) -> PersistentShell:
        env = base_env("/root", config.env)
        channel: ShellChannel
        if io_dir is not None:
            channel = DockerFifoChannel(
                container, io_dir, env=env, workdir=config.workdir, shell=name
            )
        else:
            channel = DockerExecChannel(container, env=env, workdir=config.workdir, shell=name)
        shell = PersistentShell(
            channel=channel,
            max_output_bytes=config.max_output_bytes,
            session=config.shell == "session" and name == "bash",
        )
        await shell.start()
        return shell

    # -- verification: nothing the agent controls -------------------------------------------

    @property
    def stopped(self) -> bool:
        """True after `stop_agent`: only `exec_fresh` and `digests` work, and the pool
        destroys the sandbox on release."""
        return self._stopped

    def _usable(self) -> None:
        if self._stopped:
            raise SandboxError(
                "the agent's processes were stopped (verification): the sandbox runs only "
                "fresh processes now"
            )
        if self._closed:
            raise SandboxError("the sandbox is closed")

    def fresh_env(self, env: dict[str, str] | None) -> dict[str, str]:
        """The environment of a fresh process: the sandbox's base environment plus `env`."""
        return {**base_env("/root", self.config.env), **(env or {})}

    def _fresh_argv(self, cmd: str, cwd: str) -> tuple[list[str], str]:
        """(argv, the exec's working directory) of a fresh process running `cmd` in `cwd`."""
        return ["bash", "--noprofile", "--norc", "-c", cmd], cwd

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """A new root process started by the Engine API (see `fresh.py`), with the sandbox's
        view (`_fresh_argv`, `fresh_env`; a slot's own), not through its shell."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        argv, workdir = self._fresh_argv(call.cmd, self.resolve(call.cwd or self.workdir))
        running = fresh_exec(
            self.container, argv, env=self.fresh_env(call.env), timeout=call.timeout,
            cwd=workdir, stdin=call.stdin, max_output_bytes=call.max_output_bytes,
        )  # fmt: skip
        return await self._limited(running)

    async def _container_script(self, script: str) -> ExecResult:
        """`script` (one that acts on the whole container) as root in a fresh exec: by bash,
        or by sh once the image turned out to have no bash."""
        while True:
            result = await fresh_exec(
                self.container, [self._script_shell, "-c", script],
                env=self.fresh_env(None), timeout=60.0, cwd="/",
            )  # fmt: skip
            if result.exit_code not in (126, 127) or self._script_shell != "bash":
                return result
            self._script_shell = "sh"  # an image without bash

    async def stop_agent(self) -> None:
        """Kill every process but docker-init and the container's main process, which stays
        stopped: from the host while the container is frozen on a local daemon
        (`freeze.py`: no program of the container runs), else by `fresh.STOP_CONTAINER` run
        in it; then check from outside, with the daemon's process list, that nothing else
        is left."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self.limits.raise_if_hit()  # a container killed past its disk quota: that is why
        self._stopped = True
        first = await freeze.local_pid(self.container)
        if first is None:
            return await self._stop_by_script()
        left: list[str] = []
        for _ in range(5):
            await freeze.freeze(self.container)
            try:
                processes = await freeze.frozen_processes(self.container)
                main = freeze.main_process(processes, first, self.config.init)
                await asyncio.to_thread(freeze.kill_frozen, processes, first, main)
            finally:
                await freeze.thaw(self.container)
                self._held = False
            if not (left := await self._settled()):
                return
        raise TamperError(f"processes kept running after the agent was stopped: {left!r}")

    async def _settled(self) -> list[str]:
        """What still runs once the killed processes had time to end (a loaded host)."""
        left: list[str] = []
        for attempt in range(40):
            if not (left := await self._running_processes()):
                return []
            await asyncio.sleep(min(0.02 * (attempt + 1), 0.5))
        return left

    async def _stop_by_script(self) -> None:
        """A remote daemon's container: stopped by a script run as root in it (thawed first
        when a hold left it paused: nothing runs in a paused container)."""
        if self._held:
            await freeze.thaw(self.container)
            self._held = False
        left: list[str] = []
        for _ in range(5):
            result = await self._container_script(STOP_CONTAINER)
            if result.exit_code == 0 and not (left := await self._running_processes()):
                return
        raise TamperError(
            "processes kept running after the agent was stopped: "
            + repr(
                left or f"exit code {result.exit_code}: {(result.stdout + result.stderr)[-300:]}"
            )
        )

    async def hold_agent(self) -> int | None:
        """Freeze every process the agent left without ending them; their number. The
        container is paused (the daemon's cgroup freezer: nothing in it runs, whatever signal
        it is sent, and nothing is run in it to do it) and stays so while its digests and
        changes are read and its snapshot taken, until `release_agent`. None where they
        cannot be kept for the tests: a slot (its container is its neighbours' too) or a
        container without docker-init."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self.id != self.id_of_container or not self.config.init:
            return None
        self.limits.raise_if_hit()
        self._stopped = True
        first = await freeze.local_pid(self.container)
        await freeze.freeze(self.container)
        self._held = True
        try:
            if first is None:  # a remote daemon's: counted from its process list
                return await freeze.remote_agent_count(self.container)
            processes = await freeze.frozen_processes(self.container)
        except BaseException:
            await freeze.thaw(self.container)
            self._held = False
            raise
        return freeze.agent_count(
            processes, first, freeze.main_process(processes, first, self.config.init)
        )

    async def release_agent(self) -> None:
        """Thaw what `hold_agent` froze: the agent's services serve the twin's tests."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._held:
            await freeze.thaw(self.container)
            self._held = False

    async def verification_twin(self, *, empty: Sequence[str] = ()) -> Sandbox:
        """A new container from a snapshot of this (held) one, sharing only its network
        namespace (`twin.py`): the tests' world, out of the agent's processes' reach;
        `empty`: files of the snapshot made empty before anything runs in the twin."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        labels = {**self.labels, "clotho.twin-of": self.id[:12]}
        binds = await asyncio.to_thread(live_binds, await self.container.show())
        image = await snapshot(self.container, {LABEL: "1", "clotho.snapshot": "1"})
        config = self.config.model_copy(update={"image": image, "slots_per_container": 1})
        try:
            twin = await DockerSandbox.create(
                config, labels, docker=self._docker, images=ImageFactsCache(self._docker),
                network_of=self.id, binds=binds, empty=empty,
            )  # fmt: skip
        except BaseException:
            await remove_snapshot(self._docker, image)
            raise
        twin._snapshot = image
        return twin

    async def _running_processes(self) -> list[str]:
        """What the daemon lists in the container (host `ps`) besides docker-init and
        stopped or dead processes."""
        from aiodocker.exceptions import DockerError

        try:
            top = await self.container.top(ps_args="-o pid,ppid,stat,wchan:64,comm")
        except DockerError as exc:
            raise SandboxError(f"cannot list the container's processes: {exc}") from exc
        titles = [t.upper() for t in top.get("Titles") or []]
        pid, ppid, stat, wchan, comm = (
            titles.index(t) for t in ("PID", "PPID", "STAT", "WCHAN", "COMMAND")
        )
        rows = top.get("Processes") or []
        stopped_parents = {row[ppid] for row in rows if row[stat][:1] == "T"}
        left = []
        for row in rows:
            if row[stat][:1] in ("T", "Z", "X") or row[comm] in ("docker-init", "tini"):
                continue
            if row[stat][:1] == "D" and row[wchan] in VFORK_WAITS and row[pid] in stopped_parents:
                continue  # inside vfork(), its child stopped before exec: it cannot run
            left.append(" ".join(row))
        return left

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        """Each path's digest, computed on the host with nothing run in the container:
        through `/proc/<pid 1>/root` with links kept inside it (`rootfs.py`, a local daemon:
        230 programs in tens of ms), else from the Engine API's archive of each path,
        hashed as it streams (about 34 ms a path: the daemon mounts the container each
        time)."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        paths = list(paths)

        def outer(path: str) -> str | None:
            return self._container_path(self.resolve(path))

        info = await self.container.show()
        pid = int((info.get("State") or {}).get("Pid") or 0)
        if pid > 0 and await asyncio.to_thread(in_container, pid, self.id_of_container):
            found = await asyncio.to_thread(host_digests, pid, paths, outer)
            if found is not None:
                return found
        gate = asyncio.Semaphore(16)

        async def one(path: str) -> str | None:
            async with gate:
                return await path_digest(self.container, self.resolve(path), outer=outer)

        return dict(zip(paths, await asyncio.gather(*(one(p) for p in paths)), strict=True))

    def socket_place(self) -> SocketPlace | None:
        """The FIFO folder (bind-mounted read-only at `FIFO_MOUNT`: a socket there still
        accepts connections, and the sandbox cannot replace it); None without FIFOs (attach,
        a remote daemon) and for slots, whose shared folder is not theirs alone."""
        if type(self) is not DockerSandbox or self.io_dir is None:
            return None
        return SocketPlace(self.io_dir, FIFO_MOUNT, mode=0o666)

    async def changed_paths(self) -> list[PathChange] | None:
        """What the container's writable layer holds against the image. A local daemon's
        overlay2 upper folder is walked from the host (`scandir`/`lstat`, no link followed:
        whiteouts are removals, an entry an image layer has is a change, types known; a few
        ms); otherwise the Engine's `GET /containers/{id}/changes` (every entry of a new
        folder listed; seconds on a busy daemon). Each mount but the read-only FIFO folder
        is added as a folder `added` whole (a volume the image declares is in neither). A
        slot shares its container, and so its changes, with its neighbours: None."""
        from aiodocker.exceptions import DockerError

        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self.id != self.id_of_container:
            return None
        try:
            info = await self.container.show()
            pid = int((info.get("State") or {}).get("Pid") or 0)
            found = None
            if pid > 0 and await asyncio.to_thread(in_container, pid, self.id_of_container):
                found = await asyncio.to_thread(_upper_changes, info.get("GraphDriver") or {})
            if found is None:
                rows = await self.container.docker._query_json(
                    f"containers/{self.id_of_container}/changes", method="GET"
                )
                found = [
                    PathChange(str(r["Path"]), _CHANGE_KINDS.get(r.get("Kind"), "changed"))
                    for r in rows or []
                ]
        except DockerError as exc:
            raise SandboxError(f"cannot list the container's changes: {exc}") from exc
        for mount in info.get("Mounts") or []:
            destination = mount.get("Destination")
            if destination and destination != FIFO_MOUNT:
                found.append(PathChange(str(destination), "added"))
        return found

    def _container_path(self, path: str) -> str | None:
        """Where a path the sandbox sees lives in the container (a slot maps its binds)."""
        return path

    async def _mkdir(self, path: str) -> None:
        result = await self._shell.run(f"mkdir -p -- {shlex.quote(path)}")
        if result.exit_code != 0:
            raise OSError(f"cannot create {path} in the container: {result.stderr.strip()}")

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        """The shell runs it; meanwhile the disk is watched, and afterwards the counters of
        the container's limits say whether one broke the sandbox (`LimitExceeded`)."""
        self._usable()
        return await self._limited(super().exec(cmd, **options))

    async def _limited(self, run: Coroutine[Any, Any, ExecResult]) -> ExecResult:
        if self.limits.hit is not None:
            run.close()
            self.limits.raise_if_hit(self._limit_who)
        since = self.limits.snapshot() if self._shared_limits else None
        watcher = self.limits.watch_disk()
        try:
            result = await run
        except SandboxError:  # the shell or container died: was a limit the cause?
            await self.limits.check(disk=True, since=since, who=self._limit_who)
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
        killed = result.exit_code in (137, -9) or result.timed_out
        await self.limits.check(
            disk=self.limits.due(), since=since, killed=killed, who=self._limit_who
        )
        return result

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        """A regular file's bytes, streamed from the Engine API's archive: links are followed
        inside the container; a device, FIFO or socket is OSError, a file over `max_bytes`
        OSError(EFBIG) before its data is read (a 1 GB sparse file is never copied)."""
        self._usable()
        return await read_regular(self.container, self.resolve(path), path, max_bytes)

    async def _put(self, directory: str, data: bytes) -> None:
        await put_archive(self.container, directory, data)

    async def write_file(self, path: str, data: bytes) -> None:
        self._usable()
        path = self.resolve(path)
        check = await self._shell.run(f"[ -d {shlex.quote(path)} ]")
        if check.exit_code == 0:
            raise IsADirectoryError(f"is a directory: {path}")
        parent, name = posixpath.split(path)
        await self._mkdir(parent)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
        await self._put(parent, buffer.getvalue())

    async def upload(self, local: Path, remote: str) -> None:
        self._usable()
        remote = self.resolve(remote)
        if not local.exists():
            raise FileNotFoundError(f"no such file or directory on the host: {local}")
        if self.io_dir is not None and await self._upload_through_io_dir(local, remote):
            return
        if local.is_dir():
            await self._mkdir(remote)
            await self._put(remote, await asyncio.to_thread(_tar_of, local, ""))
        else:
            parent, name = posixpath.split(remote)
            await self._mkdir(parent)
            await self._put(parent, await asyncio.to_thread(_tar_of, local, name))

    async def _upload_through_io_dir(self, local: Path, remote: str) -> bool:
        """The same tar as the archive request's, put into the bind-mounted FIFO folder (a
        local daemon) through a directory fd, one new name, never following a link
        (`XferDir`), and unpacked by the shell: one shell command instead of a `mkdir` and
        an archive request, for which the daemon mounts the container (about 60 ms). False
        when the image has no `tar` (the caller uses the archive request)."""
        assert self.io_dir is not None
        if self._io_xfer is None:
            self._io_xfer = XferDir(self.io_dir)
        name = f"upload-{secrets.token_hex(8)}"
        inner = f"{FIFO_MOUNT}/{name}"
        if local.is_dir():
            target, data = remote, await asyncio.to_thread(_tar_of, local, "")
        else:
            target, base = posixpath.split(remote)
            data = await asyncio.to_thread(_tar_of, local, base)
        q = shlex.quote(target)
        try:
            await self._io_xfer.write(name, data)
            result = await self._limited(
                self._shell.run(
                    f"( command -v tar >/dev/null 2>&1 || exit 127\n"
                    f"mkdir -p -- {q} && tar -x --no-same-owner -f {inner} -C {q}\n)"
                )
            )
        finally:
            await self._io_xfer.remove(name)
        if result.exit_code == 127:
            return False
        if result.exit_code != 0:
            raise OSError(f"cannot upload to {remote} in the container: {result.stderr.strip()}")
        return True

    async def download(self, remote: str, local: Path, *, max_bytes: int = 4 << 30) -> None:
        """A file or tree from the container; the archive is written to a host file as it
        streams and refused (OSError EFBIG) once it passes `max_bytes`."""
        self._usable()
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        local.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=local.parent) as tmp:
            archive = Path(tmp) / "archive.tar"
            await download_tree(self.container, remote, remote, archive, max_bytes)
            await asyncio.to_thread(_unpack, archive, Path(tmp) / "tree")
            top = Path(tmp) / "tree" / posixpath.basename(remote.rstrip("/") or "/")
            await asyncio.to_thread(shutil.move, top, local)

    async def _release(self) -> None:
        self.limits.close()
        if self._io_xfer is not None:
            self._io_xfer.close()
        try:
            await delete_container(self.container)
        finally:
            if self.io_dir is not None:
                await asyncio.to_thread(remove_state_dir, self.io_dir)
            if self._snapshot is not None:
                await remove_snapshot(self._docker, self._snapshot)
