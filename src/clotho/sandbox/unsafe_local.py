"""The `unsafe-local` backend: a persistent bash on the host, in a temporary directory.

There is no isolation: commands see and can change the whole host. Paths are host paths;
the workdir is the temporary directory, so tasks that hard-code /app will not find it.

Verification does what is meaningful without isolation: as root, the shell and everything it
starts live in a freezer cgroup (`cgroups.py`), so `stop_agent` stops even detached
processes; otherwise it kills the shell's process tree (a process that left it, by double
fork and setsid, is out of reach). `exec_fresh` is a new `bash` on the host with the base
environment; `digests` hashes host paths (nothing is private to the sandbox). None of this
makes the verdict trustworthy: the agent could have changed anything on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from clotho.errors import SandboxError
from clotho.sandbox import proctree
from clotho.sandbox.base import ExecResult, FreshCall
from clotho.sandbox.cgroups import AGENT, SandboxCgroups
from clotho.sandbox.config import UnsafeLocalSandboxConfig, base_env
from clotho.sandbox.fresh import digests_at, run_fresh_call
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.state import remove_state_dir, state_dir_until_started
from clotho.sandbox.transfer import copy_host_file, read_host_file, too_big, write_host_file

DEFAULT_DOWNLOAD_LIMIT = 1 << 30


class UnsafeLocalSandbox(ShellBackedSandbox):
    def __init__(self, state: Path, shell: PersistentShell, labels: dict[str, str],
                 config: UnsafeLocalSandboxConfig | None = None,
                 cgroups: SandboxCgroups | None = None) -> None:  # fmt: skip
        super().__init__(shell, str(state / "app"), labels)
        self.state = state
        self.config = config or UnsafeLocalSandboxConfig()
        self._cgroups = cgroups

    @classmethod
    async def create(
        cls, config: UnsafeLocalSandboxConfig, labels: dict[str, str] | None = None
    ) -> UnsafeLocalSandbox:
        labels = dict(labels or {})
        with state_dir_until_started(config.state_dir, labels) as state:
            (state / "app").mkdir()
            (state / "home").mkdir()
            cgroups = SandboxCgroups.create(state.name) if os.geteuid() == 0 else None
            prefix = cgroups.enter_argv() if cgroups is not None else []
            shell = PersistentShell(
                [*prefix, "bash", "--noprofile", "--norc"],
                env=base_env(str(state / "home"), {"TMPDIR": str(state), **config.env}),
                cwd=str(state / "app"),
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session",
            )
            await shell.start()
        return cls(state, shell, labels, config, cgroups)

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        home = str(self.state / "home")
        return base_env(home, {"TMPDIR": str(self.state), **self.config.env, **(extra or {})})

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """A new `bash` on the host (its own cgroup as root): ends with all it started."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        return await run_fresh_call(
            ["bash", "--noprofile", "--norc", "-c", call.cmd],
            call,
            cgroups=self._cgroups,
            env=self._env(call.env),
            cwd=self.resolve(call.cwd or self.workdir),
        )

    async def stop_agent(self) -> None:
        """As root: freeze the shell's cgroup and SIGKILL everything in it (the shell too: the
        host has no namespace to keep). Otherwise: kill the shell's process tree."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self._stopped = True
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
        await asyncio.to_thread(remove_state_dir, self.state)


def _tree_size(root: Path) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(folder, name))
                total += info.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total
