"""The `unsafe-local` backend: a persistent bash on the host, in a temporary directory.

There is no isolation: commands see and can change the whole host. Paths are host paths;
the workdir is the temporary directory, so tasks that hard-code /app will not find it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from clotho.sandbox.config import UnsafeLocalSandboxConfig, base_env
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.shell_backed import ShellBackedSandbox
from clotho.sandbox.state import remove_state_dir, state_dir_until_started
from clotho.sandbox.transfer import copy_host_file, read_host_file, write_host_file


class UnsafeLocalSandbox(ShellBackedSandbox):
    def __init__(self, state: Path, shell: PersistentShell, labels: dict[str, str]) -> None:
        super().__init__(shell, str(state / "app"), labels)
        self.state = state

    @classmethod
    async def create(
        cls, config: UnsafeLocalSandboxConfig, labels: dict[str, str] | None = None
    ) -> UnsafeLocalSandbox:
        labels = dict(labels or {})
        with state_dir_until_started(config.state_dir, labels) as state:
            (state / "app").mkdir()
            (state / "home").mkdir()
            shell = PersistentShell(
                ["bash", "--noprofile", "--norc"],
                env=base_env(str(state / "home"), {"TMPDIR": str(state), **config.env}),
                cwd=str(state / "app"),
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session",
            )
            await shell.start()
        return cls(state, shell, labels)

    async def read_file(self, path: str) -> bytes:
        return await read_host_file(Path(self.resolve(path)))

    async def write_file(self, path: str, data: bytes) -> None:
        target = Path(self.resolve(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        await write_host_file(target, data)

    async def upload(self, local: Path, remote: str) -> None:
        target = Path(self.resolve(remote))
        if local.is_dir():
            await asyncio.to_thread(
                shutil.copytree, local, target, symlinks=True, dirs_exist_ok=True
            )
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            await copy_host_file(local, target)

    async def download(self, remote: str, local: Path) -> None:
        source = Path(self.resolve(remote))
        if local.exists():
            raise FileExistsError(f"download target already exists: {local}")
        local.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            await asyncio.to_thread(shutil.copytree, source, local, symlinks=True)
        else:
            await copy_host_file(source, local)

    async def _release(self) -> None:
        await asyncio.to_thread(remove_state_dir, self.state)
