"""The local backend: a persistent bash inside bubblewrap.

Namespaces: user (uid 0 mapped to the caller, so no host capabilities), pid, ipc, uts, net
(off unless enabled) and mount. The host root is either bound read-only entry by entry, or
(as root) the lower layer of an overlay mounted in a private mount namespace, whose upper
layer is a folder in the sandbox's state folder: writes go away with that folder and nothing
is mounted on the host. /tmp, /run, /root and /home are private tmpfs; the workspace is a
host folder bound at `workdir`; a transfer folder bound at `XFER_MOUNT` carries files in and
out without base64.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import uuid
from pathlib import Path

from clotho.errors import SandboxError
from clotho.sandbox.config import LocalSandboxConfig, base_env
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.state import remove_state_dir, state_dir_until_started
from clotho.sandbox.transfer import (
    IS_DIR_EXIT,
    NOT_FOUND_EXIT,
    XFER_MOUNT,
    copy_host_file,
    move_host_path,
    read_host_file,
    remove_host_file,
    write_host_file,
)

_PRIVATE_DIRS = ("tmp", "run", "root", "home")
_SKIPPED_ROOT_ENTRIES = {"proc", "dev", "sys", *_PRIVATE_DIRS}
_RO_EXTRA_DIRS = ("/logs", "/tests", "/solution")

INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; the local sandbox refuses to run without it. "
    "Install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`, "
    "or pass --sandbox unsafe-local to run commands on the host without isolation."
)


# bwrap binds recursively: a host mount that comes or goes meanwhile (a container starting or
# stopping on this host) fails the copy of the mount tree with this; trying again succeeds.
_MOUNT_RACE = "Unable to apply mount flags"
_START_ATTEMPTS = 3


def ro_root_args(only: set[str] | None = None) -> list[str]:
    """bwrap arguments binding the host's top-level entries read-only (`only` those named)."""
    args: list[str] = []
    for name in sorted(os.listdir("/")):
        if name in _SKIPPED_ROOT_ENTRIES or name.startswith("."):
            continue
        if only is not None and name not in only:
            continue
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def bwrap_argv(config: LocalSandboxConfig, root_mode: str, state: Path) -> list[str]:
    argv = ["bwrap"]
    if root_mode == "overlay":
        argv += ["--bind", str(state / "ovl" / "m"), "/"]
    else:
        argv += ro_root_args()
        for path in _RO_EXTRA_DIRS:
            argv += ["--tmpfs", path]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for name in _PRIVATE_DIRS:
        argv += ["--tmpfs", f"/{name}"]
    argv += ["--bind", str(state / "app"), config.workdir]
    argv += ["--bind", str(state / "xfer"), XFER_MOUNT]
    argv += ["--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0"]
    if config.network:
        argv += ["--share-net"]
    argv += ["--hostname", "clotho", "--die-with-parent", "--new-session"]
    argv += ["--chdir", config.workdir, "bash", "--noprofile", "--norc"]
    if root_mode == "overlay":
        # A private mount namespace holds the overlay, so nothing is mounted on the host; its
        # upper layer lives in the sandbox's state folder and goes away with it. (A Python
        # preexec_fn would do the mounts without the extra processes, but it forces fork()
        # instead of vfork(), which costs 15 ms from a 300 MB parent.)
        ovl = state / "ovl"
        for sub in ("u", "w", "m"):
            (ovl / sub).mkdir(parents=True)
        mount = (
            'mount -t overlay clotho -o "lowerdir=/,upperdir=$0/u,workdir=$0/w" "$0/m" && exec "$@"'
        )
        return [
            "unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", mount, str(ovl), *argv,
        ]  # fmt: skip
    return argv


def resolve_root_mode(config: LocalSandboxConfig) -> str:
    if config.root != "auto":
        if config.root == "overlay" and os.geteuid() != 0:
            raise SandboxError("root='overlay' needs root privileges; use root='ro'")
        return config.root
    return "overlay" if os.geteuid() == 0 and shutil.which("unshare") else "ro"


class BwrapSandbox(ShellBackedSandbox):
    def __init__(self, config: LocalSandboxConfig, state: Path, shell: PersistentShell,
                 labels: dict[str, str]) -> None:  # fmt: skip
        super().__init__(shell, config.workdir, labels)
        self.config = config
        self.state = state

    @classmethod
    async def create(
        cls, config: LocalSandboxConfig, labels: dict[str, str] | None = None
    ) -> BwrapSandbox:
        if shutil.which("bwrap") is None:
            raise SandboxError(INSTALL_HINT)
        labels = dict(labels or {})
        root_mode = resolve_root_mode(config)
        for _ in range(_START_ATTEMPTS - 1):
            try:
                return await cls._start(config, root_mode, labels)
            except SandboxError as exc:
                if _MOUNT_RACE not in str(exc):
                    raise
        return await cls._start(config, root_mode, labels)

    @classmethod
    async def _start(
        cls, config: LocalSandboxConfig, root_mode: str, labels: dict[str, str]
    ) -> BwrapSandbox:
        with state_dir_until_started(config.state_dir, labels) as state:
            (state / "app").mkdir()
            (state / "xfer").mkdir()
            shell = PersistentShell(
                bwrap_argv(config, root_mode, state),
                env=base_env("/root", config.env),
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session",
            )
            await shell.start()
        return cls(config, state, shell, labels)

    def _xfer_name(self) -> tuple[Path, str]:
        name = uuid.uuid4().hex
        return self.state / "xfer" / name, f"{XFER_MOUNT}/{name}"

    async def read_file(self, path: str) -> bytes:
        path = self.resolve(path)
        host, inner = self._xfer_name()
        q = shlex.quote(path)
        try:
            await self._transfer(
                f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; [ -d {q} ] && exit {IS_DIR_EXIT}; "
                f"cat -- {q} > {inner}",
                path,
            )
            return await read_host_file(host, follow_symlinks=False)
        finally:
            await remove_host_file(host)

    async def write_file(self, path: str, data: bytes) -> None:
        path = self.resolve(path)
        host, inner = self._xfer_name()
        await write_host_file(host, data)
        await self._put_from_xfer(host, inner, path)

    async def _put_from_xfer(self, host: Path, inner: str, path: str) -> None:
        """Have the shell copy the transfer file `inner` (`host` outside) to `path`."""
        q = shlex.quote(path)
        try:
            await self._transfer(
                f'[ -d {q} ] && exit {IS_DIR_EXIT}; mkdir -p -- "$(dirname -- {q})" && '
                f"cat -- {inner} > {q}",
                path,
            )
        finally:
            await remove_host_file(host)

    async def upload(self, local: Path, remote: str) -> None:
        remote = self.resolve(remote)
        host, inner = self._xfer_name()
        if local.is_file():  # copied, not read: a big file never sits in memory
            await copy_host_file(local, host)
            await self._put_from_xfer(host, inner, remote)
            return
        if not local.is_dir():
            raise FileNotFoundError(f"no such file or directory on the host: {local}")
        await asyncio.to_thread(shutil.copytree, local, host, symlinks=True)
        q = shlex.quote(remote)
        try:
            await self._transfer(f"mkdir -p -- {q} && cp -a -- {inner}/. {q}/", remote)
        finally:
            await asyncio.to_thread(shutil.rmtree, host, True)

    async def download(self, remote: str, local: Path) -> None:
        remote = self.resolve(remote)
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        host, inner = self._xfer_name()
        q = shlex.quote(remote)
        try:
            await self._transfer(
                f"[ -e {q} ] || exit {NOT_FOUND_EXIT}; cp -R --preserve=mode,timestamps -- {q} {inner}",
                remote,
            )
            local.parent.mkdir(parents=True, exist_ok=True)
            await move_host_path(host, local)
        finally:
            if host.is_dir():
                await asyncio.to_thread(shutil.rmtree, host, True)
            else:
                await remove_host_file(host)

    async def _release(self) -> None:
        await asyncio.to_thread(remove_state_dir, self.state)
