"""The Docker backend: a container per sandbox, a persistent shell attached over the API.

Containers run `sleep infinity` under docker-init, with network `none` unless enabled,
CPU / memory / pids limits, and labels naming clotho, the owner process, the run and the
lease. Files travel as tar archives through the Engine API. Closing kills the container
(SIGKILL, no stop grace period) and removes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import posixpath
import secrets
import shlex
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox import exit_cleanup
from clotho.sandbox.config import DockerSandboxConfig, base_env
from clotho.sandbox.docker.channel import DockerExecChannel
from clotho.sandbox.docker.fifo import MOUNT as FIFO_MOUNT
from clotho.sandbox.docker.fifo import DockerFifoChannel, main_shell_command, make_fifos
from clotho.sandbox.leases import DOCKER_IO, lease_labels
from clotho.sandbox.shell import PersistentShell, ShellChannel
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.state import make_state_dir, remove_state_dir

LABEL = "clotho"
INSTALL_HINT = "the docker backend needs the extra: pip install 'clotho-rl[docker]'"


def docker_client(url: str | None = None) -> Any:
    try:
        import aiodocker
    except ImportError as exc:
        raise SandboxError(INSTALL_HINT) from exc
    return aiodocker.Docker(url=url)


def container_body(
    config: DockerSandboxConfig, labels: dict[str, str], lease_s: float
) -> dict[str, Any]:
    host: dict[str, Any] = {
        "NetworkMode": "host" if config.network else "none",
        "Init": config.init,
    }
    if config.cpus:
        host["NanoCpus"] = int(config.cpus * 1e9)
    if config.memory_mb:
        host["Memory"] = config.memory_mb * 1024 * 1024
    if config.pids_limit:
        host["PidsLimit"] = config.pids_limit
    return {
        "Image": config.image,
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": config.workdir,
        "Labels": {LABEL: "1", **lease_labels(lease_s), **labels},
        "HostConfig": host,
    }


_ENTRYPOINTS: dict[str, bool] = {}  # image reference -> has an entrypoint (asked once)


async def _has_entrypoint(docker: Any, image: str) -> bool:
    """Whether the image wraps its command in an entrypoint. Such an image keeps the image's
    own start-up: its container runs `sleep infinity` through the entrypoint and the shell is
    exec'd, instead of being the container's first process."""
    from aiodocker.exceptions import DockerError

    if image not in _ENTRYPOINTS:
        try:
            info = await docker.images.inspect(image)
        except DockerError:
            return False  # creating the container reports a missing image clearly
        _ENTRYPOINTS[image] = bool((info.get("Config") or {}).get("Entrypoint"))
    return _ENTRYPOINTS[image]


def _tar_of(local: Path, arcname: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if local.is_dir():
            for child in sorted(local.iterdir()):
                tar.add(child, arcname=child.name)
        else:
            tar.add(local, arcname=arcname)
    return buffer.getvalue()


class DockerSandbox(ShellBackedSandbox):
    def __init__(
        self,
        config: DockerSandboxConfig,
        docker: Any,
        container: Any,
        shell: PersistentShell,
        labels: dict[str, str],
        owns_client: bool,
    ) -> None:
        self.config = config
        self.workdir = config.workdir
        self.labels = labels
        self.container = container
        self._docker = docker
        self._shell = shell
        self._owns_client = owns_client
        self.io_dir: Path | None = None
        self._closed = False

    @property
    def id(self) -> str:
        return str(self.container.id)

    @classmethod
    async def create(
        cls,
        config: DockerSandboxConfig,
        labels: dict[str, str] | None = None,
        *,
        docker: Any = None,
        lease_s: float = 6 * 3600,
    ) -> DockerSandbox:

        if config.slots_per_container > 1:
            return await cls._create_slot(config, labels, docker=docker, lease_s=lease_s)
        exit_cleanup.register("docker")
        owns_client = docker is None
        docker = docker or docker_client(config.docker_url)
        labels = dict(labels or {})
        container = None
        io_dir: Path | None = None
        try:
            body = container_body(config, labels, lease_s)
            if config.stdio == "fifo" and getattr(docker.connector, "path", None):
                io_dir = make_state_dir(config.state_dir, {**labels, DOCKER_IO: "1"}, lease_s)
                make_fifos(io_dir)
                body["HostConfig"]["Binds"] = [f"{io_dir}:{FIFO_MOUNT}"]
                shell = None
                if not await _has_entrypoint(docker, config.image):
                    container, shell = await cls._main_shell(docker, body, config, io_dir)
                if shell is not None:
                    sandbox = cls(config, docker, container, shell, labels, owns_client)
                    sandbox.io_dir = io_dir
                    return sandbox
                make_fifos(io_dir, replace=True)  # the image cannot run it: exec a shell
            container = await cls._start_container(docker, body, config)
            try:
                shell = await cls._start_shell(container, config, "bash", io_dir)
            except SandboxError:
                # No bash in the image: a POSIX sh runs commands isolated (no session mode).
                if io_dir is not None:  # fresh FIFOs (same folder: it is bind-mounted)
                    make_fifos(io_dir, replace=True)
                shell = await cls._start_shell(container, config, "sh", io_dir)
        except BaseException:
            if container is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(container.delete(force=True))
            if io_dir is not None:
                remove_state_dir(io_dir)
            if owns_client:
                await docker.close()
            raise
        sandbox = cls(config, docker, container, shell, labels, owns_client)
        sandbox.io_dir = io_dir
        return sandbox

    @staticmethod
    async def _start_container(
        docker: Any, body: dict[str, Any], config: DockerSandboxConfig
    ) -> Any:
        from aiodocker.exceptions import DockerError

        try:
            container = await docker.containers.create(body, name=f"clotho-{secrets.token_hex(6)}")
        except DockerError as exc:
            raise SandboxError(f"cannot start a container from {config.image}: {exc}") from exc
        try:
            await container.start()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await asyncio.shield(container.delete(force=True))
            if isinstance(exc, DockerError):
                raise SandboxError(f"cannot start a container from {config.image}: {exc}") from exc
            raise
        return container

    @staticmethod
    async def _main_shell(
        docker: Any, body: dict[str, Any], config: DockerSandboxConfig, io_dir: Path
    ) -> tuple[Any, PersistentShell | None]:
        """A container whose first process is the shell (no exec round trips). Returns no
        shell, and no container, when the image cannot run it (no `sh`, an entrypoint)."""
        from aiodocker.exceptions import DockerError

        env = base_env("/root", config.env)
        body = {
            **body,
            "Cmd": main_shell_command(),
            "Env": [f"{k}={v}" for k, v in env.items()],
        }
        try:
            container = await docker.containers.create(body, name=f"clotho-{secrets.token_hex(6)}")
        except DockerError as exc:
            raise SandboxError(f"cannot start a container from {config.image}: {exc}") from exc
        channel = DockerFifoChannel(
            container, io_dir, env=env, workdir=config.workdir, main_process=True
        )
        try:
            await channel.open()
            shell = PersistentShell(
                channel=channel,
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session" and channel.shell_name == "bash",
            )
            await shell.start()
        except SandboxError:
            await channel.close()
            with contextlib.suppress(Exception):
                await asyncio.shield(container.delete(force=True))
            return None, None
        except BaseException:
            await channel.close()
            with contextlib.suppress(Exception):
                await asyncio.shield(container.delete(force=True))
            raise
        return container, shell

    @staticmethod
    async def _create_slot(
        config: DockerSandboxConfig,
        labels: dict[str, str] | None,
        *,
        docker: Any,
        lease_s: float,
    ) -> DockerSandbox:
        """A lone slot: its own container, in the slot layout (a pool shares containers)."""
        from clotho.sandbox.docker.slots import SlotHost

        owns_client = docker is None
        docker = docker or docker_client(config.docker_url)
        host = SlotHost(docker, owns_client=owns_client, single_use=True)
        try:
            return await host.open(config, labels, lease_s=lease_s)
        except BaseException:
            await asyncio.shield(host.close())
            raise

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

    async def _mkdir(self, path: str) -> None:
        result = await self._shell.run(f"mkdir -p -- {shlex.quote(path)}")
        if result.exit_code != 0:
            raise OSError(f"cannot create {path} in the container: {result.stderr.strip()}")

    async def _get_archive(self, path: str) -> tarfile.TarFile:
        from aiodocker.exceptions import DockerError

        try:
            return await self.container.get_archive(path)
        except DockerError as exc:
            if exc.status == 404:
                raise FileNotFoundError(
                    f"no such file or directory in the sandbox: {path}"
                ) from exc
            raise SandboxError(f"reading {path} from the container: {exc}") from exc

    async def read_file(self, path: str) -> bytes:
        path = self.resolve(path)
        # Ask first: the archive of a directory is its whole tree (all of / for "/").
        check = await self._shell.run(f"[ -d {shlex.quote(path)} ]")
        if check.exit_code == 0:
            raise IsADirectoryError(f"is a directory: {path}")
        tar = await self._get_archive(path)
        member = tar.getmembers()[0]
        if member.isdir():
            raise IsADirectoryError(f"is a directory: {path}")
        if member.issym() or member.islnk():
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), member.linkname))
            return await self.read_file(target)
        extracted = tar.extractfile(member)
        if extracted is None:
            raise OSError(f"{path} is not a regular file")
        return extracted.read()

    async def _put(self, directory: str, data: bytes) -> None:
        from aiodocker.exceptions import DockerError

        try:
            await self.container.put_archive(directory, data)
        except DockerError as exc:
            raise SandboxError(f"writing into {directory} in the container: {exc}") from exc

    async def write_file(self, path: str, data: bytes) -> None:
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
        remote = self.resolve(remote)
        if not local.exists():
            raise FileNotFoundError(f"no such file or directory on the host: {local}")
        if local.is_dir():
            await self._mkdir(remote)
            await self._put(remote, await asyncio.to_thread(_tar_of, local, ""))
        else:
            parent, name = posixpath.split(remote)
            await self._mkdir(parent)
            await self._put(parent, await asyncio.to_thread(_tar_of, local, name))

    async def download(self, remote: str, local: Path) -> None:
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        tar = await self._get_archive(remote)
        local.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=local.parent) as tmp:
            await asyncio.to_thread(tar.extractall, tmp, filter="data")
            top = Path(tmp) / posixpath.basename(remote.rstrip("/") or "/")
            await asyncio.to_thread(shutil.move, top, local)

    async def _release(self) -> None:
        try:
            with contextlib.suppress(Exception):
                await self.container.delete(force=True)
            if self.io_dir is not None:
                await asyncio.to_thread(remove_state_dir, self.io_dir)
        finally:
            if self._owns_client:
                await self._docker.close()
