"""A persistent bash driven over pipes with a sentinel protocol.

Spawning a process per command costs 1.6 ms (bash) to 7 ms (bubblewrap); a shell that is
already running answers in well under 0.1 ms. The host writes each command to the shell's
stdin and reads stdout and stderr between a start and an end marker (the exit code travels
on the stdout end marker). Two modes (`PersistentShell`): `session`, where a wrapper loop
runs a session shell that executes commands itself, so variables and exports persist and
`exit` restarts it; and `isolated`, where each command runs in a subshell that cannot touch
the shell. A command that times out or whose caller is cancelled has its processes killed
from the host; what earlier commands left in the background keeps running until the sandbox
closes. The pipes come from a `ShellChannel`.

The agent runs inside the shell and may print anything, so the protocol rests on three rules:

- Every command gets a fresh random nonce (`secrets`), and its markers exist only in that
  command's text, written as printf octal escapes: the marker bytes appear nowhere in the
  shell's variables, functions, traps, command line, environment or `$BASH_COMMAND`, only in
  what printf writes at the command's start and end. Nothing the agent printed before a
  command was sent can be that command's marker.
- Each stream is parsed as it arrives (`_Inbox`): bytes before a command's start marker and
  between commands are dropped, a command's output keeps its head and tail within
  `max_output_bytes`, so the host holds a bounded amount per stream whatever is printed, and
  a stream flooding between commands is paused once it went past `_IDLE_BUDGET`.
- The shell runs commands one at a time, so the true end marker of a command always comes
  before the next command's start marker. A marker of the last command seen after its end
  (the agent printed its own command's end early, and the true one followed) is a desync:
  the shell is marked broken and every later call raises `SandboxError`.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import re
import secrets
import shlex
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Unpack

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecOptions, ExecResult
from clotho.sandbox.host import proctree

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DRAIN_TIMEOUT_S = 10.0
# A channel's own readers never pause: the shell's parser drops what it does not keep.
_STREAM_LIMIT = 1 << 40
# Bytes a reader keeps before a PersistentShell takes it over (a channel's announcement line).
_RAW_LIMIT = 1 << 20
# Bytes a stream may send between commands before its pipe is paused until the next command
# (only where the reader knows its transport: local processes). A background program's log
# keeps flowing; a flood costs the host this much reading per command, then blocks the writer.
_IDLE_BUDGET = 1 << 20
# The status after an end marker: "<code>\n" or "<code> X\n" (the command called exit).
_STATUS = re.compile(rb"(-?\d{1,10})( X)?")
_STATUS_MAX = 16
_DIAG_KEEP = 4096


def _escaped(marker: str) -> str:
    """`marker` as printf format text that does not contain it: its middle character becomes an
    octal escape, so the whole marker appears only in what printf writes. (Escaping every
    character would be no stronger, and bash reads a command from a pipe byte by byte.)"""
    mid = len(marker) // 2
    return f"{marker[:mid]}\\{ord(marker[mid]):03o}{marker[mid + 1 :]}"


def new_markers() -> tuple[str, str, str]:
    """(nonce, start marker, end marker) for one command: 64 random bits each time."""
    nonce = secrets.token_hex(8)
    return nonce, f"S{nonce}S", f"E{nonce}E"


def build_command_script(
    cmd: str,
    *,
    cwd: str | None,
    env: dict[str, str] | None,
    user: str | None,
    start: str,
    end: str,
) -> bytes:
    """The text sent to the shell for one isolated command (a subshell)."""
    s, e = _escaped(start), _escaped(end)
    lines = [f"printf '{s}' >&2; printf '{s}'", "("]
    if cwd:
        lines.append(f"cd -- {shlex.quote(cwd)} || exit 126")
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise ValueError(f"invalid environment variable name: {key!r}")
        lines.append(f"export {key}={shlex.quote(value)}")
    if user:
        lines.append(f"exec runuser -u {shlex.quote(user)} -- bash -c {shlex.quote(cmd)}")
    else:
        lines.append(f"eval {shlex.quote(cmd)}")
    lines.append(
        f") </dev/null & {{ wait $!; }} 2>/dev/null; printf '{e}%s\\n' \"$?\"; printf '{e}' >&2"
    )
    return ("\n".join(lines) + "\n").encode()


def build_session_script(cmd: str, *, cwd: str | None, start: str, end: str) -> bytes:
    """One command run by the session shell itself: no fork, shell state persists.

    fds 98/99 are the protocol pipes (opened by the wrapper loop); they are restored after
    every command, so `exec >file` lasts one command. An `exit` runs the EXIT trap, which
    prints the end markers flagged `X`; the wrapper then starts a fresh session shell.
    """
    s, e = _escaped(start), _escaped(end)
    run = f"builtin eval {shlex.quote(cmd)} </dev/null; __clotho_r=$?"
    if cwd:
        run = f"if builtin cd -- {shlex.quote(cwd)}; then {run}; else __clotho_r=126; fi"
    return (
        "builtin trap "
        f'\'builtin printf "{e}%s X\\n" "$?" >&98; builtin printf "{e}" >&99\' EXIT; '
        f"builtin printf '{s}' >&2; builtin printf '{s}'; "
        f"{run}; "
        "exec 1>&98 2>&99; builtin trap - EXIT; "
        f"builtin printf '{e}%s\\n' \"$__clotho_r\"; "
        f"builtin printf '{e}' >&2\n"
    ).encode()


def build_wrapper_loop(restart: str) -> bytes:
    """The session mode's outer loop: a session shell, then the restart marker when it ends."""
    r = _escaped(restart)
    return (
        f"while :; do bash --noprofile --norc 98>&1 99>&2; printf '{r}'; printf '{r}' >&2; done\n"
    ).encode()


class _Capture:
    """Bytes of one stream for one command, with the middle dropped beyond a cap."""

    def __init__(self, cap: int) -> None:
        self.buf = bytearray()
        self.cap = cap
        self.cut_at: int | None = None
        self.dropped = 0
        self.searched = 0

    def trim(self, keep_tail: int) -> None:
        if len(self.buf) <= self.cap:
            return
        head = self.cut_at if self.cut_at is not None else self.cap // 2
        excess = len(self.buf) - head - keep_tail
        if excess <= 0:
            return
        del self.buf[head : head + excess]
        self.cut_at = head
        self.dropped += excess
        self.searched = max(head, self.searched - excess)

    def take(self, end: int) -> bytes:
        """The output up to `end`, at most `cap` bytes of it (plus the note of what was cut)."""
        out = self.buf[:end]
        if len(out) > self.cap:  # the last read came with the end marker: cut it too
            head = self.cut_at if self.cut_at is not None else self.cap // 2
            excess = len(out) - self.cap
            del out[head : head + excess]
            self.cut_at = head
            self.dropped += excess
        if self.dropped and self.cut_at is not None:
            note = f"\n[... {self.dropped} bytes of output dropped ...]\n".encode()
            out[self.cut_at : self.cut_at] = note
        return bytes(out)


# What one stream gave for one command: (output, exit code, how); how is "done", "exiting"
# (the command called exit) or "restarted" (the session shell died and was started again).
Frame = tuple[bytes, int | None, str]


class _Inbox:
    """One of the shell's streams, parsed as the bytes arrive; it holds about `cap` bytes at
    most (plus one read), whatever the shell and its background processes print.

    Phases: idle (no command: bytes are dropped), waiting for the command's start marker
    (bytes before it are dropped: they were printed before the command began), and capturing
    up to the end marker. Outside a capture it watches for the restart marker (the session
    shell died and the wrapper started a new one) and for the nonce of the last command (its
    end was already taken: a forged end came first, a desync).
    """

    def __init__(
        self, reader: ShellReader, cap: int, restart: bytes | None, wake: Callable[[], None]
    ) -> None:
        self._reader = reader
        self._cap_bytes = cap
        self._restart = restart
        self._wake = wake
        self._scan = bytearray()  # unmatched bytes outside a capture (at most a marker long)
        self._capture: _Capture | None = None
        self._start: bytes | None = None
        self._end = b""
        self._nonce = b""
        self._stale: bytes | None = None
        self._with_code = False
        self._keep_tail = 0
        self._idle_dropped = 0
        self._paused = False
        self._closing = False
        self.result: Frame | None = None
        self.error: str | None = None
        self.eof: str | None = None
        self.awaiting_restart = False
        self.unexpected_restarts = 0
        self.diag = bytearray()  # the last bytes dropped, for error messages

    @property
    def idle(self) -> bool:
        """No command's marker and no restart marker is awaited: what arrives is dropped, and
        past a budget the stream may be paused until the next command."""
        return self._start is None and self._capture is None and not self.awaiting_restart

    # -- the host's side ------------------------------------------------------------------

    def expect(self, nonce: bytes, start: bytes, end: bytes, *, with_code: bool) -> None:
        """The next command's markers (called before the command is written)."""
        self._nonce, self._start, self._end, self._with_code = nonce, start, end, with_code
        self._keep_tail = max(
            self._cap_bytes // 2, len(end) + _STATUS_MAX + len(self._restart or b"")
        )
        self.result = None
        self._idle_dropped = 0
        self.release()

    def release(self, *, for_good: bool = False) -> None:
        """Read the pipe again if it was paused; `for_good` before the shell is closed (the
        pipe must be read to its end, or the process is never reaped)."""
        if for_good:
            self._closing = True
        if self._paused:
            self._paused = False
            self._reader.resume()

    # -- the shell's side -----------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self.error is not None:
            return
        if self._capture is not None:
            self._capture.buf += data
            self._parse_capture()
        else:
            self._parse_outside(data)

    def feed_eof(self, why: str) -> None:
        if self.eof is None:
            self.eof = why
            self._wake()

    def _desync(self, what: str) -> None:
        self.error = f"the sandbox shell's protocol broke ({what}): the sandbox is discarded"
        self._scan.clear()
        self._capture = None
        self._wake()

    def _drop(self, data: bytes | bytearray) -> None:
        if not data:
            return
        self.diag += data[-_DIAG_KEEP:]
        del self.diag[:-_DIAG_KEEP]
        if self.idle:
            self._idle_dropped += len(data)
            if self._idle_dropped > _IDLE_BUDGET and not self._paused and not self._closing:
                self._paused = self._reader.pause()

    def _parse_outside(self, data: bytes | bytearray) -> None:
        buf = self._scan
        buf += data
        pos = 0
        while True:
            hits = []
            if self._start is not None and (i := buf.find(self._start, pos)) >= 0:
                hits.append((i, 0))
            if self._restart is not None and (i := buf.find(self._restart, pos)) >= 0:
                hits.append((i, 1))
            if self._stale is not None and (i := buf.find(self._stale, pos)) >= 0:
                hits.append((i, 2))
            if not hits:
                break
            i, kind = min(hits)
            self._drop(buf[pos:i])
            if kind == 2:
                self._desync("a marker of a finished command came again")
                return
            if kind == 1:
                assert self._restart is not None
                pos = i + len(self._restart)
                if self.awaiting_restart:
                    self.awaiting_restart = False
                    self._wake()
                else:
                    self.unexpected_restarts += 1
                continue
            assert self._start is not None
            rest = bytes(buf[i + len(self._start) :])
            buf.clear()
            self._start = None
            self._capture = _Capture(self._cap_bytes)
            self._capture.buf += rest
            self._parse_capture()
            return
        keep = max(len(self._start or b""), len(self._restart or b""), len(self._stale or b"")) - 1
        cut = max(pos, len(buf) - keep)
        self._drop(buf[pos:cut])
        del buf[:cut]

    def _parse_capture(self) -> None:
        cap = self._capture
        assert cap is not None
        buf = cap.buf
        end, restart = self._end, self._restart
        idx = buf.find(end, cap.searched)
        ridx = buf.find(restart, cap.searched) if restart is not None else -1
        if ridx >= 0 and (idx < 0 or ridx < idx):
            assert restart is not None
            self._finish((cap.take(ridx), None, "restarted"), buf[ridx + len(restart) :])
            return
        if idx >= 0:
            if not self._with_code:
                self._finish((cap.take(idx), None, "done"), buf[idx + len(end) :])
                return
            status_at = idx + len(end)
            newline = buf.find(b"\n", status_at, status_at + _STATUS_MAX + 1)
            if newline < 0:
                if len(buf) - status_at > _STATUS_MAX:
                    self._desync("an end marker without a valid status")
                    return
                cap.searched = idx  # wait for the rest of the status line
            else:
                status = _STATUS.fullmatch(bytes(buf[status_at:newline]))
                if status is None:
                    self._desync("an end marker without a valid status")
                    return
                how = "exiting" if status.group(2) else "done"
                self._finish((cap.take(idx), int(status.group(1)), how), buf[newline + 1 :])
                return
        else:
            longest = max(len(end), len(restart or b""))
            cap.searched = max(cap.searched, len(buf) - longest + 1, 0)
        cap.trim(self._keep_tail)

    def _finish(self, frame: Frame, rest: bytes | bytearray) -> None:
        rest = bytes(rest)
        self._capture = None
        self._stale = self._nonce
        self.awaiting_restart = frame[2] == "exiting"
        self.result = frame
        self._wake()
        self._parse_outside(rest)


class ShellReader(asyncio.StreamReader):
    """The stream reader a channel feeds. Until a `PersistentShell` takes it over it buffers
    like any reader (at most `_RAW_LIMIT` bytes: a channel may read an announcement line);
    after that every byte goes straight to the shell's parser and nothing accumulates here."""

    def __init__(self) -> None:
        super().__init__(limit=_STREAM_LIMIT)
        self._inbox: _Inbox | None = None

    def take_over(self, inbox: _Inbox) -> None:
        self._inbox = inbox
        pending, self._buffer = bytes(self._buffer), bytearray()
        inbox.feed(pending)
        if self._eof:
            inbox.feed_eof("the sandbox shell exited unexpectedly")

    def feed_data(self, data: bytes) -> None:
        if self._inbox is not None:
            self._inbox.feed(data)
        elif len(self._buffer) < _RAW_LIMIT:
            super().feed_data(data)

    def feed_eof(self) -> None:
        super().feed_eof()
        if self._inbox is not None:
            self._inbox.feed_eof("the sandbox shell exited unexpectedly")

    def set_exception(self, exc: BaseException) -> None:
        super().set_exception(exc)
        if self._inbox is not None:
            self._inbox.feed_eof(f"the sandbox shell's pipe failed: {exc}")

    @property
    def idle(self) -> bool:
        """Taken over by a shell that awaits nothing on this stream (see `_Inbox.idle`)."""
        return self._inbox is not None and self._inbox.idle

    def pause(self) -> bool:
        """Stop reading the pipe (when the channel gave its transport); True if paused. A
        transport may decline (raise): the next dropped bytes ask again."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        with contextlib.suppress(Exception):
            transport.pause_reading()
            return True
        return False

    def resume(self) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            with contextlib.suppress(Exception):
                transport.resume_reading()


class _ShellProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """A subprocess protocol whose stdout and stderr readers are `ShellReader`s."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            pipe = transport.get_pipe_transport(fd)  # type: ignore[attr-defined]
            if pipe is not None:
                reader = ShellReader()
                reader.set_transport(pipe)
                setattr(self, name, reader)


class ShellChannel(abc.ABC):
    """The pipes of a running shell: stdin to write, stdout and stderr to read.

    `ProcessChannel` is a local process (bubblewrap or plain bash); the Docker backend
    drives a shell through FIFOs or attached over the Engine API socket. The readers are
    `ShellReader`s (`_own_readers` for a channel that feeds them itself).
    """

    stdout: ShellReader
    stderr: ShellReader
    _shell_pid: int | None = None

    def _own_readers(self) -> None:
        """Readers the channel feeds itself with `feed_data`/`feed_eof`."""
        self.stdout = ShellReader()
        self.stderr = ShellReader()

    @abc.abstractmethod
    async def open(self) -> None: ...

    async def ready(self) -> None:  # noqa: B027 - a hook most channels need not fill
        """Called once the shell answered its first command (a channel may look up its pid)."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send bytes to the shell; SandboxError if it is gone."""

    def kill_running(self) -> None:
        """Kill whatever the shell is running now, but not the shell."""
        if (shell := self.shell_pid) is not None:
            proctree.kill_descendants(shell)

    @abc.abstractmethod
    async def close(self) -> None:
        """Kill the shell and everything it started."""

    @property
    def pid(self) -> int | None:
        """Host pid of the outermost process: the shell's, unless something wraps it."""
        return self._shell_pid

    @property
    def shell_pid(self) -> int | None:
        """Host pid of the bash that reads our commands, once known."""
        return self._shell_pid


class ProcessChannel(ShellChannel):
    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str],
        cwd: str | None = None,
        shell_comm: str = "bash",
    ) -> None:
        self._argv = list(argv)
        self._env = env
        self._cwd = cwd
        self._shell_comm = shell_comm
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    async def open(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.subprocess_exec(
                lambda: _ShellProtocol(limit=_STREAM_LIMIT, loop=loop),
                *self._argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )
            self._proc = asyncio.subprocess.Process(transport, protocol, loop)
        except OSError as exc:
            raise SandboxError(f"cannot start sandbox shell {self._argv[0]!r}: {exc}") from exc
        assert isinstance(protocol.stdout, ShellReader) and isinstance(protocol.stderr, ShellReader)
        self.stdout = protocol.stdout
        self.stderr = protocol.stderr

    @property
    def shell_pid(self) -> int | None:
        """Found on first use (a timeout), not at start: the /proc scan costs a millisecond."""
        if self._shell_pid is None and self._proc is not None:
            if proctree.comm(self._proc.pid) == self._shell_comm:
                self._shell_pid = self._proc.pid
            else:
                for pid in proctree.descendants(self._proc.pid):
                    if proctree.comm(pid) == self._shell_comm:
                        self._shell_pid = pid
                        break
        return self._shell_pid

    async def write(self, data: bytes) -> None:
        if self._proc is None or self._proc.stdin is None:
            raise SandboxError("sandbox shell is not started")
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise SandboxError("the sandbox shell is gone") from exc

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        # In a thread: the walk of /proc grows with the host's process count.
        await asyncio.to_thread(proctree.kill_descendants, proc.pid)
        # killpg only: Process.kill() polls (waitpid) first and would race asyncio's child
        # watcher for the zombie, which then logs "Unknown child process".
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


@dataclass(frozen=True)
class _Command:
    since: float  # seconds since boot when it started (for telling its processes apart)
    last_pid: int | None


_RESTART_NOTE = b"\n[the shell was restarted: shell variables were reset]\n"


class PersistentShell:
    """One long-lived bash process (possibly inside bubblewrap or a container).

    Two modes:

    - `isolated`: each command runs in a background subshell: `cd`, exports and `exit`
      never touch the shell; costs a fork (about 0.5 ms here) per command.
    - `session`: a wrapper loop runs a session shell that executes commands itself, like a
      terminal: shell variables and exports persist, no fork. `exit` or a crash restarts
      the session shell (the wrapper prints a restart marker). Calls with `env` or `user`
      still run isolated, so their environment cannot leak.

    Output that breaks the protocol (see the module's docstring) marks the shell broken: the
    call raises `SandboxError`, and so does every later one (a pool's health check too).
    """

    def __init__(
        self,
        argv: Sequence[str] | None = None,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        max_output_bytes: int = 8 << 20,
        shell_comm: str = "bash",
        channel: ShellChannel | None = None,
        session: bool = False,
    ) -> None:
        if channel is None:
            if argv is None:
                raise ValueError("PersistentShell needs argv or a channel")
            channel = ProcessChannel(argv, env=env or {}, cwd=cwd, shell_comm=shell_comm)
        self._channel = channel
        self._session = session
        self._started = False
        self._cap = max_output_bytes
        # Known to the wrapper loop only (as octal escapes), never to the session shell.
        self._restart = f"R{secrets.token_hex(8)}R"
        self._lock = asyncio.Lock()
        self._out: _Inbox | None = None
        self._err: _Inbox | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._pending: _Command | None = None
        self._dead: str | None = None

    @property
    def pid(self) -> int | None:
        return self._channel.pid

    async def start(self, timeout: float = 15.0) -> None:
        """Start the shell and see it answer; on any failure (a cancelled caller too) nothing
        is left running."""
        await self._channel.open()
        self._started = True
        try:
            self._out = self._take_over(self._channel.stdout)
            self._err = self._take_over(self._channel.stderr)
            if self._session:
                await self._channel.write(build_wrapper_loop(self._restart))
            result = await self.run("true", timeout=timeout)
            if result.exit_code != 0:
                raise SandboxError(result.stderr.strip())
            await self._channel.ready()
        except SandboxError as exc:
            said = bytes(self._err.diag) if self._err is not None else b""
            stderr = said.decode(errors="replace").strip()
            await self.close()
            raise SandboxError(f"sandbox failed to start: {stderr or exc}") from exc
        except BaseException:
            await self.close()
            raise

    def _take_over(self, reader: ShellReader) -> _Inbox:
        if not isinstance(reader, ShellReader):
            raise TypeError(f"a shell channel's readers must be ShellReaders, not {reader!r}")
        restart = self._restart.encode() if self._session else None
        inbox = _Inbox(reader, self._cap, restart, self._wake)
        reader.take_over(inbox)
        return inbox

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check_broken(self) -> None:
        for box in (self._out, self._err):
            if box is not None and box.error is not None:
                self._dead = self._dead or box.error
                raise SandboxError(box.error)

    async def _wait_for(self, ready: Callable[[], bool]) -> None:
        """Wait until `ready()`; SandboxError on a desync or a stream's end. If this is
        cancelled (a timeout), the parsers keep their state and a later call resumes."""
        while True:
            self._check_broken()
            if ready():
                return
            for box in (self._out, self._err):
                if box is not None and box.eof is not None:
                    raise SandboxError(box.eof)
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def _collect(self) -> list[Frame]:
        """Both streams' frames of the command being run."""
        out, err = self._out, self._err
        assert out is not None and err is not None
        await self._wait_for(lambda: out.result is not None and err.result is not None)
        assert out.result is not None and err.result is not None
        return [out.result, err.result]

    async def run(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        """`Sandbox.exec` on this shell (`cwd` is used as given: the sandbox resolves it)."""
        timeout, cwd = options.get("timeout"), options.get("cwd")
        env, user = options.get("env"), options.get("user")
        async with self._lock:
            if self._dead:
                raise SandboxError(self._dead)
            if not self._started:
                raise SandboxError("sandbox shell is not started")
            out, err = self._out, self._err
            assert out is not None and err is not None
            if self._pending is not None:  # a cancelled caller left its command behind
                with contextlib.suppress(SandboxError):
                    await self._finish(await self._recover(self._pending))
                self._pending = None
            if self._dead:
                raise SandboxError(self._dead)
            self._check_broken()
            nonce, start, end = new_markers()
            if self._session and env is None and user is None:
                script = build_session_script(cmd, cwd=cwd, start=start, end=end)
            else:
                script = build_command_script(
                    cmd, cwd=cwd, env=env, user=user, start=start, end=end
                )
            started = time.perf_counter()
            command = _Command(proctree.boot_seconds(), proctree.last_pid())
            out.expect(nonce.encode(), start.encode(), end.encode(), with_code=True)
            err.expect(nonce.encode(), start.encode(), end.encode(), with_code=False)
            try:
                await self._channel.write(script)
            except SandboxError as exc:
                self._dead = str(exc)
                raise
            self._pending = command
            timed_out = False
            try:
                try:
                    # asyncio.timeout costs a timer, not a task: this is the hot path.
                    async with asyncio.timeout(timeout):
                        parts = await self._collect()
                except TimeoutError:
                    timed_out = True
                    parts = await self._recover(command)
            except asyncio.CancelledError:
                # Stop the command now; the next run() reads what is left of it. (A second
                # cancellation cannot stop the kill: the thread finishes it.)
                await self._stop_command(command)
                raise
            except SandboxError as exc:
                # The shell died or broke the protocol: no further command may start.
                self._dead = self._dead or str(exc)
                raise
            self._pending = None
            (stdout, code, how), (stderr, _, _) = parts
            await self._finish(parts)
            if (how == "restarted" and not timed_out) or out.unexpected_restarts:
                stderr += _RESTART_NOTE
            out.unexpected_restarts = err.unexpected_restarts = 0
            return ExecResult.model_construct(  # trusted values: skip validation on the hot path
                exit_code=-9 if timed_out else (code if code is not None else -1),
                stdout=stdout.decode(errors="replace"),
                stderr=stderr.decode(errors="replace"),
                timed_out=timed_out,
                duration_s=time.perf_counter() - started,
            )

    async def _finish(self, parts: list[Frame]) -> None:
        """After `exit`, the wrapper starts a new session shell and says so on both streams."""
        if not any(how == "exiting" for _, _, how in parts):
            return
        out, err = self._out, self._err
        assert out is not None and err is not None
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                await self._wait_for(lambda: not out.awaiting_restart and not err.awaiting_restart)
        except (TimeoutError, SandboxError) as exc:
            self._dead = self._dead or f"the session shell did not restart: {exc}"
            raise SandboxError(self._dead) from exc

    def _session_shell_pid(self) -> int | None:
        wrapper = self._channel.shell_pid
        if wrapper is None:
            return None
        inner = proctree.children(wrapper)
        return inner[0] if inner else None

    async def _stop_command(self, command: _Command) -> None:
        """`_kill_command` in a thread: its walks of /proc grow with the host's process count
        (about 18 us a process here, so 70 ms with 4000 processes on the host)."""
        await asyncio.to_thread(self._kill_command, command)

    def _kill_command(self, command: _Command) -> None:
        """Kill the processes of the running command; the shell survives."""
        if not self._session:
            self._channel.kill_running()
            return
        inner = self._session_shell_pid()
        if inner is not None:
            proctree.kill_descendants(
                inner, started_after=command.since, after_pid=command.last_pid
            )

    def _kill_session_shell(self) -> None:
        if (inner := self._session_shell_pid()) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(inner, signal.SIGKILL)

    async def _recover(self, command: _Command) -> list[Frame]:
        """Stop a command that must end (timeout, cancelled caller) and read its markers.

        Kill its processes, twice with a grace period (under load it may not have forked
        everything yet); in session mode a command that is the shell itself (a builtin loop)
        then gets the session shell killed, and the wrapper's restart marker ends it.
        """
        for grace in (1.0, 0.5):
            await self._stop_command(command)
            try:
                async with asyncio.timeout(grace):
                    return await self._collect()
            except TimeoutError:
                continue
        if self._session:
            await asyncio.to_thread(self._kill_session_shell)
        try:
            async with asyncio.timeout(_DRAIN_TIMEOUT_S):
                return await self._collect()
        except TimeoutError:
            self._dead = "the sandbox shell stopped answering after a killed command"
            raise SandboxError(self._dead) from None

    async def close(self) -> None:
        self._dead = self._dead or "the sandbox is closed"
        if not self._started:
            return
        self._started = False
        for box in (self._out, self._err):
            if box is not None:
                box.release(for_good=True)
        await self._channel.close()
