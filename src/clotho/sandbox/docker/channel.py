"""A bash inside a container, attached over the Engine API socket (no CLI process)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.docker.attach import attach_exec
from clotho.sandbox.shell import ShellChannel


class DockerExecChannel(ShellChannel):
    """`exec` of `bash` with stdin attached; the multiplexed stream is split into two readers."""

    def __init__(
        self,
        container: Any,
        *,
        env: dict[str, str],
        workdir: str,
        shell: str = "bash",
        argv: list[str] | None = None,
    ) -> None:
        """`argv` replaces the plain `shell` command (a slot's shell starts through sh -c)."""
        self._container = container
        self._shell = shell
        self._argv = argv
        self._env = env
        self._workdir = workdir
        self._exec: Any = None
        self._stream: Any = None
        self._transport: asyncio.Transport | None = None
        self._pump: asyncio.Task[None] | None = None
        self._own_readers()

    async def open(self) -> None:
        from aiodocker.exceptions import DockerError

        try:
            argv = self._argv or (
                [self._shell, "--noprofile", "--norc"] if self._shell == "bash" else [self._shell]
            )
            self._exec = await self._container.exec(
                argv,
                stdin=True,
                stdout=True,
                stderr=True,
                environment=self._env,
                workdir=self._workdir,
            )
            socket_path = getattr(self._container.docker.connector, "path", None)
            if socket_path:  # the fast path: our own frame parser on the raw socket
                self._transport, _ = await attach_exec(
                    socket_path, self._exec.id, self.stdout, self.stderr
                )
                return
            self._stream = self._exec.start(detach=False)
            # Upgrade the connection now: the reader and the first write would race to do it.
            await self._stream.write_in(b"")
        except DockerError as exc:
            raise SandboxError(f"cannot start a shell in container: {exc}") from exc
        self._pump = asyncio.create_task(self._run_pump())

    async def _run_pump(self) -> None:
        try:
            while True:
                message = await self._stream.read_out()
                if message is None:
                    break
                (self.stdout if message.stream == 1 else self.stderr).feed_data(message.data)
        except Exception as exc:  # the socket broke: the readers see EOF, the shell is gone
            self.stderr.feed_data(f"\n[attach stream failed: {exc}]".encode())
        finally:
            self.stdout.feed_eof()
            self.stderr.feed_eof()

    async def ready(self) -> None:
        # The host pid of the exec'd shell, so a timed-out command's tree can be killed.
        for _ in range(50):
            info = await self._exec.inspect()
            pid = int(info.get("Pid") or 0)
            if pid > 0:
                self._shell_pid = pid
                return
            await asyncio.sleep(0.01)
        raise SandboxError("the container shell reported no pid")

    async def write(self, data: bytes) -> None:
        if self._transport is not None:
            if self._transport.is_closing():
                raise SandboxError("the container shell is gone")
            self._transport.write(data)
            return
        if self._stream is None:
            raise SandboxError("container shell is not started")
        try:
            await self._stream.write_in(data)
        except Exception as exc:
            raise SandboxError(f"the container shell is gone: {exc}") from exc

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                await self._stream.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
