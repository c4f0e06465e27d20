"""A container's shell talking through FIFOs in a bind-mounted host folder.

With the attach socket every byte of a command's I/O passes through dockerd and the
containerd shim; at thousands of commands per second that copying, not the command, is the
cost (about 0.6 ms of CPU per command here). A detached exec starts the shell with its
stdin, stdout and stderr on three FIFOs in a host folder mounted into the container, so the
host and the shell exchange bytes through the kernel alone, as a local sandbox does. Needs
the daemon on this host (a unix socket); the attach socket is the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import struct
import termios
from pathlib import Path
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.host import proctree
from clotho.sandbox.shell import ShellChannel

MOUNT = "/.clotho-io"
ANNOUNCE = "clotho-shell:"


def main_shell_command(mount: str = MOUNT) -> list[str]:
    """The container's own command when its first process is the shell: stdio on the FIFOs,
    bash if the image has it, else sh; it first says which on stdout."""
    script = (
        f"exec <{mount}/in >{mount}/out 2>{mount}/err; "
        f"if command -v bash >/dev/null 2>&1; then echo {ANNOUNCE}bash; "
        "exec bash --noprofile --norc; fi; "
        f"echo {ANNOUNCE}sh; exec sh"
    )
    return ["sh", "-c", script]


def make_fifos(folder: Path, *, replace: bool = False) -> None:
    for name in ("in", "out", "err"):
        if replace:
            (folder / name).unlink(missing_ok=True)
        os.mkfifo(folder / name, 0o600)


class _Feed(asyncio.Protocol):
    """Pipe bytes into a stream reader until `end()`; after that (the shell died) a process
    it left behind may still write into the FIFO: those bytes are dropped."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._ended = False

    def data_received(self, data: bytes) -> None:
        if not self._ended:
            self._reader.feed_data(data)

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._reader.feed_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.end()


def _unread(transport: asyncio.BaseTransport) -> int:
    """Bytes waiting in the pipe under a read transport."""
    pipe = transport.get_extra_info("pipe")
    if pipe is None or pipe.closed:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0" * 4))[0]
    except OSError:
        return 0


def _shell_under_init(pid: int) -> int:
    if proctree.comm(pid) in ("bash", "sh", "dash"):
        return pid
    kids = proctree.children(pid)
    return kids[0] if kids else pid


class DockerFifoChannel(ShellChannel):
    def __init__(
        self,
        container: Any,
        folder: Path,
        *,
        env: dict[str, str],
        workdir: str,
        shell: str = "bash",
        mount: str = MOUNT,
        prelude: str = "",
        main_process: bool = False,
        announce_timeout_s: float = 15.0,
    ) -> None:
        """`mount` is `folder` as the container sees it; `shell` may be a whole command line,
        run by `exec` after the `prelude` (shell text ending in `;` or a newline).

        `main_process`: the shell is the container's own command (`main_shell_command`), and
        `open()` starts the created container instead of an exec, which saves the exec's
        round trips (about 50 ms) on every new sandbox; `shell` is then what it announced."""
        self._container = container
        self._folder = folder
        self._env = env
        self._workdir = workdir
        self._shell = shell
        self._mount = mount
        self._prelude = prelude
        self._main_process = main_process
        self._announce_timeout_s = announce_timeout_s
        self._opened = False
        self._exec: Any = None
        self._writer: asyncio.WriteTransport | None = None
        self._readers: list[asyncio.BaseTransport] = []
        self._feeds: list[_Feed] = []
        self._watchdog: asyncio.Task[None] | None = None
        self._keep: int | None = None
        self._own_readers()

    @property
    def shell_name(self) -> str:
        return self._shell.split()[0]

    async def open(self) -> None:
        from aiodocker.exceptions import DockerError

        if self._opened:  # the main-process shell is opened before its PersistentShell
            return
        self._opened = True
        # The host holds both ends of every FIFO: no open ever blocks, and the shell's
        # redirections succeed at once. The price is that no EOF marks a dead shell, so a
        # watchdog does: it ends the streams when the shell's process is gone.
        loop = asyncio.get_running_loop()
        # stdin: a never-read reader end lets the write end open without blocking (asyncio's
        # write transport must not be on a read-write descriptor: it takes readable for EOF).
        self._keep = os.open(self._folder / "in", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        writer = os.open(self._folder / "in", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._writer, _ = await loop.connect_write_pipe(
            asyncio.Protocol, os.fdopen(writer, "wb", buffering=0)
        )
        fds = [os.open(self._folder / n, os.O_RDWR | os.O_CLOEXEC) for n in ("out", "err")]
        for fd, reader in ((fds[0], self.stdout), (fds[1], self.stderr)):
            transport, feed = await loop.connect_read_pipe(
                lambda reader=reader: _Feed(reader), os.fdopen(fd, "rb", buffering=0)
            )
            self._readers.append(transport)
            self._feeds.append(feed)
        if self._main_process:
            await self._start_main()
            return
        shell = f"{self._shell} --noprofile --norc" if self._shell == "bash" else self._shell
        io = self._mount
        # The prelude runs with the FIFOs as stdio already, so its errors reach the host.
        redirect = f"exec <{io}/in >{io}/out 2>{io}/err; {self._prelude}exec {shell}"
        try:
            self._exec = await self._container.exec(
                ["sh", "-c", redirect], environment=self._env, workdir=self._workdir
            )
            await self._exec.start(detach=True)
            for _ in range(200):
                info = await self._exec.inspect()
                if int(info.get("Pid") or 0) > 0 and info.get("Running"):
                    self._shell_pid = int(info["Pid"])
                    break
                if info.get("ExitCode") is not None and not info.get("Running"):
                    raise SandboxError(
                        f"the container shell ({self._shell.split()[0]}) exited with "
                        f"{info.get('ExitCode')}"
                    )
                await asyncio.sleep(0.005)
            else:
                raise SandboxError("the container shell did not start")
        except DockerError as exc:
            raise SandboxError(f"cannot start a shell in container: {exc}") from exc
        self._watchdog = asyncio.create_task(self._watch(self._shell_pid))

    async def _start_main(self) -> None:
        """Start the container, read which shell it runs, find that shell's host pid."""
        from aiodocker.exceptions import DockerError

        try:
            await self._container.start()
            line = await self._announcement()
            info = await self._container.show()
        except DockerError as exc:
            raise SandboxError(f"the container's shell did not start: {exc}") from exc
        text = line.decode(errors="replace").strip()
        if not text.startswith(ANNOUNCE):
            raise SandboxError(f"the container's shell said {text!r}, not which shell it is")
        self._shell = text[len(ANNOUNCE) :]
        pid = int((info.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            raise SandboxError("the container's shell is not running")
        # With docker-init as pid 1 the shell is its only child (found in a thread: a walk of
        # /proc grows with the host's process count).
        pid = await asyncio.to_thread(_shell_under_init, pid)
        self._shell_pid = pid
        self._watchdog = asyncio.create_task(self._watch(pid))

    async def _announcement(self) -> bytes:
        """The shell's first line; fails fast if the container exits without it (no `sh`,
        an entrypoint that does not run its command)."""
        reading = asyncio.ensure_future(self.stdout.readline())
        deadline = asyncio.get_running_loop().time() + self._announce_timeout_s
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=0.2)
                if done:
                    return reading.result()
                state = (await self._container.show()).get("State") or {}
                if not state.get("Running"):
                    raise SandboxError(
                        f"the container exited ({state.get('ExitCode')}) before its shell started"
                    )
                if asyncio.get_running_loop().time() > deadline:
                    raise SandboxError("the container's shell did not say it started")
        finally:
            reading.cancel()

    async def _watch(self, pid: int) -> None:
        while os.path.exists(f"/proc/{pid}"):  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.5)
        # What the shell wrote before it died is still in the pipes: let the readers have it
        # (the transports read on the next loop turns), then end the streams.
        for _ in range(100):
            if not any(_unread(t) for t in self._readers):
                break
            await asyncio.sleep(0.01)
        for feed in self._feeds:
            feed.end()

    async def write(self, data: bytes) -> None:
        if self._writer is None or self._writer.is_closing():
            raise SandboxError("the container shell is gone")
        self._writer.write(data)

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(BaseException):
                await self._watchdog
        for transport in [self._writer, *self._readers]:
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
        if self._keep is not None:
            os.close(self._keep)
            self._keep = None
