"""The `unsafe-local` backend: a persistent bash on the host, in a temporary directory.

There is no isolation: commands see and can change the whole host. Paths are host paths;
the workdir is the temporary directory, so tasks that hard-code /app will not find it.

Verification does what is meaningful without isolation: as root, the shell and everything it
starts live in a freezer cgroup (`cgroups.py`), so `stop_agent` stops even detached
processes; otherwise it kills the shell's process tree (a process that left it, by double
fork and setsid, is out of reach). `exec_fresh` is a new `bash` on the host with the base
environment; `digests` hashes host paths (nothing is private to the sandbox). None of this
makes the verdict trustworthy: the agent could have changed anything on the host.

The harness's own folders are the sandbox's, not the host's: as root, every process of the
sandbox (the shell and each fresh process) starts in a private mount namespace whose root
is the host's (each top-level entry bound, so the agent sees and changes the real host) with
/tests, /logs and /solution bound from the sandbox's state folder. Concurrent trials never
share them, and nothing is written to the host's /tests or /logs (a leftover there, owned by
root, would break every later local trial's verifier). Without root (no mounts), sandboxes on
this host take turns from `stop_agent` (the start of verification) to `close`, under a lock
file, so two verifiers never share those folders at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import posixpath
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecResult, FreshCall
from clotho.sandbox.config import base_env
from clotho.sandbox.host import proctree
from clotho.sandbox.host.cgroups import AGENT, SandboxCgroups
from clotho.sandbox.host.state import remove_state_dir, state_dir_until_started
from clotho.sandbox.local.config import UnsafeLocalSandboxConfig
from clotho.sandbox.local.fresh import digests_at, run_fresh_call
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.transfer import (
    DEFAULT_DOWNLOAD_LIMIT,
    copy_host_file,
    read_host_file,
    too_big,
    write_host_file,
)

# The harness's folders: private to each sandbox (bound from its state folder).
PRIVATE_DIRS = ("tests", "logs", "solution")
# Without root: verifications on this host take turns under this lock.
HOST_LOCK = Path(tempfile.gettempdir()) / "clotho-unsafe-local-verify.lock"
_LOCK_POLL_S = 0.05

# `unshare --mount` runs this as root: a tmpfs root holding the host's top-level entries
# (bound recursively, links copied) and the sandbox's private folders, then chroot into it.
# The entry holding the state folder is bound first, while the new root is still empty, so
# its copy does not hold the new root's own mounts.
_PRIVATE_ROOT = r"""set -eu
state=$0; cwd=$1; shift
root=$state/root
mount -t tmpfs -o mode=0755 clotho "$root"
bind() {
  case $1 in ""|tests|logs|solution) return 0 ;; esac
  if [ -e "$root/$1" ] || [ -L "$root/$1" ]; then return 0; fi
  if [ -L "/$1" ]; then ln -s "$(readlink "/$1")" "$root/$1"
  elif [ -d "/$1" ]; then mkdir "$root/$1"; mount --rbind "/$1" "$root/$1"
  elif [ -e "/$1" ]; then : > "$root/$1"; mount --bind "/$1" "$root/$1"
  fi
}
top=${state#/}
bind "${top%%/*}"
for entry in /* /.[!.]* /..?*; do
  if [ -e "$entry" ] || [ -L "$entry" ]; then bind "${entry#/}"; fi
done
for name in tests logs solution; do
  mkdir "$root/$name"
  mount --bind "$state/$name" "$root/$name"
done
exec chroot "$root" /bin/sh -c 'cd -- "$0" 2>/dev/null || cd /; exec "$@"' "$cwd" "$@"
"""


def private_mounts_available() -> bool:
    """Root with `unshare`, `mount` and `chroot`: each sandbox gets its own harness folders."""
    return os.geteuid() == 0 and all(shutil.which(p) for p in ("unshare", "mount", "chroot"))


def _namespace_argv(state: Path, cwd: str) -> list[str]:
    """argv prefix that runs the rest in the sandbox's private mount namespace."""
    return ["unshare", "--mount", "--propagation", "private", "--",
            "/bin/sh", "-c", _PRIVATE_ROOT, str(state), cwd]  # fmt: skip


class UnsafeLocalSandbox(ShellBackedSandbox):
    def __init__(self, state: Path, shell: PersistentShell, labels: dict[str, str],
                 config: UnsafeLocalSandboxConfig | None = None,
                 cgroups: SandboxCgroups | None = None) -> None:  # fmt: skip
        super().__init__(shell, str(state / "app"), labels)
        self.state = state
        self.config = config or UnsafeLocalSandboxConfig()
        self._cgroups = cgroups
        # The harness folders are the state folder's (see the module docstring).
        self.private = (state / "root").is_dir()
        self._host_lock: int | None = None

    @classmethod
    async def create(
        cls, config: UnsafeLocalSandboxConfig, labels: dict[str, str] | None = None
    ) -> UnsafeLocalSandbox:
        labels = dict(labels or {})
        with state_dir_until_started(config.state_dir, labels) as state:
            (state / "app").mkdir()
            (state / "home").mkdir()
            if private_mounts_available():
                for name in (*PRIVATE_DIRS, "root"):
                    (state / name).mkdir()
            cgroups = SandboxCgroups.create(state.name) if os.geteuid() == 0 else None
            prefix = cgroups.enter_argv() if cgroups is not None else []
            if (state / "root").is_dir():
                prefix += _namespace_argv(state, str(state / "app"))
            shell = PersistentShell(
                [*prefix, "bash", "--noprofile", "--norc"],
                env=base_env(str(state / "home"), {"TMPDIR": str(state), **config.env}),
                cwd=str(state / "app"),
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session",
            )
            await shell.start()
        return cls(state, shell, labels, config, cgroups)

    def resolve(self, path: str) -> str:
        """Host path for `path`: /tests, /logs and /solution are the sandbox's own folders."""
        resolved = super().resolve(path)
        if self.private:
            top, _, rest = resolved.lstrip("/").partition("/")
            if top in PRIVATE_DIRS:
                return (
                    posixpath.join(str(self.state / top), rest) if rest else str(self.state / top)
                )
        return resolved

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        home = str(self.state / "home")
        return base_env(home, {"TMPDIR": str(self.state), **self.config.env, **(extra or {})})

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """A new `bash` on the host (its own cgroup as root): ends with all it started."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        cwd = self.resolve(call.cwd or self.workdir)
        prefix = _namespace_argv(self.state, cwd) if self.private else []
        return await run_fresh_call(
            [*prefix, "bash", "--noprofile", "--norc", "-c", call.cmd],
            call,
            cgroups=self._cgroups,
            env=self._env(call.env),
            cwd=cwd,
        )

    async def stop_agent(self) -> None:
        """As root: freeze the shell's cgroup and SIGKILL everything in it (the shell too: the
        host has no namespace to keep). Otherwise: kill the shell's process tree."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self._stopped = True
        if not self.private and self._host_lock is None:
            self._host_lock = await _take_host_lock()
        cgroups = self._cgroups
        if cgroups is not None:

            def stop() -> None:
                for sub in cgroups.subgroups():
                    cgroups.freeze_and_kill(sub)
                    if sub != AGENT:
                        cgroups.thaw(sub)

            await asyncio.to_thread(stop)
        elif (pid := self._shell.pid) is not None:
            await asyncio.to_thread(proctree.kill_descendants, pid)

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        if self._closed:
            raise SandboxError("the sandbox is closed")

        def run() -> dict[str, str | None]:
            root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                return digests_at(root, [self.resolve(p) for p in paths])
            finally:
                os.close(root)

        found = await asyncio.to_thread(run)
        return dict(zip(paths, found.values(), strict=True))

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        self._check_live()
        return await read_host_file(Path(self.resolve(path)), max_bytes=max_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_live()
        target = Path(self.resolve(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        await write_host_file(target, data)

    async def upload(self, local: Path, remote: str) -> None:
        self._check_live()
        target = Path(self.resolve(remote))
        if local.is_dir():
            await asyncio.to_thread(
                shutil.copytree, local, target, symlinks=True, dirs_exist_ok=True
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            await copy_host_file(local, target)

    async def download(
        self, remote: str, local: Path, *, max_bytes: int = DEFAULT_DOWNLOAD_LIMIT
    ) -> None:
        """Links are copied as links (never followed), at most `max_bytes` of files in all."""
        self._check_live()
        source = Path(self.resolve(remote))
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        local.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir() and not source.is_symlink():
            total = await asyncio.to_thread(_tree_size, source)
            if total > max_bytes:
                raise too_big(str(source), max_bytes)
            await asyncio.to_thread(shutil.copytree, source, local, symlinks=True)
        else:
            info = source.stat()
            if not source.is_file():
                raise OSError(errno.EINVAL, "not a regular file", str(source))
            if info.st_size > max_bytes:
                raise too_big(str(source), max_bytes)
            await copy_host_file(source, local)

    async def _end_processes(self) -> None:
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.destroy)

    async def _release(self) -> None:
        try:
            await asyncio.to_thread(remove_state_dir, self.state)
        finally:
            if self._host_lock is not None:
                os.close(self._host_lock)  # closing the descriptor drops the lock
                self._host_lock = None


async def _take_host_lock() -> int:
    """The host-wide verification turn (no root: the host's /tests and /logs are shared).
    Polled, not blocking a thread: many sandboxes may wait at once."""
    try:
        fd = os.open(HOST_LOCK, os.O_RDONLY | os.O_CLOEXEC)  # another user's file: no O_CREAT
    except FileNotFoundError:
        fd = os.open(HOST_LOCK, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                pass
            await asyncio.sleep(_LOCK_POLL_S)
    except BaseException:
        os.close(fd)
        raise


def _tree_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                total += info.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total
