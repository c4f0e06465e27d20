"""What the local backends share for verification: a fresh process with bounded output and a
timeout that ends its whole tree, and digests of paths walked from a root directory fd on the
host without ever following a link out of it."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import posixpath
import signal
import stat
import time
from collections.abc import Callable, Sequence

from clotho.sandbox.base import ExecResult, FreshCall
from clotho.sandbox.host import proctree
from clotho.sandbox.host.cgroups import SandboxCgroups

_READ = 1 << 16
_MAX_LINKS = 40


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    """Read to EOF, keeping the first `cap` bytes: the rest is read and dropped, so the process
    never blocks on a full pipe and our memory stays bounded."""
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(_READ):
        room = cap - len(kept)
        if room > 0:
            kept += chunk[:room]
        dropped += max(0, len(chunk) - max(room, 0))
    if dropped:
        kept += f"\n[clotho: {dropped} more bytes cut]\n".encode()
    return bytes(kept)


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Wait for the process itself to exit (asyncio's `wait` also waits for its pipes, which a
    background child may hold forever); polled, from 1 ms up to 50 ms."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while proc.returncode is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)
    return True


async def run_fresh(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    timeout: float,
    stdin: bytes | None,
    max_output_bytes: int,
    kill_tree: Callable[[int], None],
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """Run `argv` on the host in a new session; `kill_tree(pid)` ends it and everything it
    started when the timeout hits (a cgroup where there is one)."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=cwd,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )
    assert proc.stdout is not None and proc.stderr is not None

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin or b"")
            await proc.stdin.drain()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            proc.stdin.close()

    readers = asyncio.gather(
        _read_capped(proc.stdout, max_output_bytes),
        _read_capped(proc.stderr, max_output_bytes),
        feed() if stdin is not None else asyncio.sleep(0),
    )
    timed_out = False
    try:
        timed_out = not await _exited(proc, timeout)
    except BaseException:
        await asyncio.to_thread(kill_tree, proc.pid)
        await proc.wait()
        readers.cancel()
        raise
    # Done or out of time: end its tree (what it left running would hold the pipes open).
    await asyncio.to_thread(kill_tree, proc.pid)
    try:
        out, err, _ = await asyncio.wait_for(readers, 5.0)
    except TimeoutError:  # something outside our reach kept a pipe open: give up on it
        out, err = b"", b"[clotho: output lost: a process kept the pipes open]\n"
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 1.0)
    code = proc.returncode if proc.returncode is not None else -9
    return ExecResult(
        exit_code=code,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


async def run_fresh_call(
    argv: Sequence[str],
    call: FreshCall,
    *,
    cgroups: SandboxCgroups | None,
    env: dict[str, str],
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> ExecResult:
    """`run_fresh` of `argv` for `call` (its timeout, stdin and output cap), in a cgroup of
    its own under `cgroups` (removed afterwards), or without cgroups as a process tree: either
    way, whatever it starts ends when it returns or times out."""
    sub = cgroups.new_fresh() if cgroups is not None else None
    prefix = cgroups.enter_argv(sub) if cgroups is not None and sub else []

    def kill_tree(pid: int) -> None:
        if cgroups is not None and sub is not None:
            cgroups.freeze_and_kill(sub)
            cgroups.thaw(sub)
        else:
            proctree.kill_descendants(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    try:
        return await run_fresh(
            [*prefix, *argv],
            env=env,
            timeout=call.timeout,
            stdin=call.stdin,
            max_output_bytes=call.max_output_bytes,
            kill_tree=kill_tree,
            cwd=cwd,
            pass_fds=pass_fds,
        )
    finally:
        if cgroups is not None and sub is not None:
            cgroups.remove_sub(sub)


# -- digests ----------------------------------------------------------------------------------

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk_to_parent(root_fd: int, path: str) -> tuple[int, str] | None:
    """(fd of the parent directory, last name) of `path` resolved inside the tree at
    `root_fd` as a process rooted there would: intermediate links are followed, but an
    absolute target restarts at `root_fd` and `..` never climbs above it. None if missing."""
    parts = [p for p in posixpath.normpath("/" + path).split("/") if p]
    if not parts:
        return None
    stack = [os.dup(root_fd)]
    links = 0
    try:
        while True:
            name = parts.pop(0)
            if name == ".":
                continue
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            if not parts:
                return stack.pop(), name
            try:
                fd = os.open(name, _PATH_FLAGS, dir_fd=stack[-1])
            except (FileNotFoundError, NotADirectoryError):
                return None
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                os.close(fd)
                links += 1
                if links > _MAX_LINKS:
                    return None
                target = os.readlink(name, dir_fd=stack[-1])
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p]
                if not parts:
                    return None
            elif stat.S_ISDIR(mode):
                stack.append(fd)
            else:
                os.close(fd)
                return None
    finally:
        for fd in stack:
            os.close(fd)


def digest_at(root_fd: int, path: str) -> str | None:
    """The sha256 of `path` as seen from the root at `root_fd`; `link:<target>` for a symlink,
    `type:<kind>` for what is neither file nor link (never opened: a FIFO or device could
    block or act), None where nothing exists."""
    found = _walk_to_parent(root_fd, path)
    if found is None:
        return None
    parent, name = found
    try:
        try:
            fd = os.open(name, _PATH_FLAGS, dir_fd=parent)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                return "link:" + os.readlink(name, dir_fd=parent)
            if not stat.S_ISREG(mode):
                kind = "dir" if stat.S_ISDIR(mode) else oct(stat.S_IFMT(mode))
                return f"type:{kind}"
            # Reopening an O_PATH fd through /proc reads exactly the inode we checked.
            with open(f"/proc/self/fd/{fd}", "rb") as file:
                return hashlib.file_digest(file, "sha256").hexdigest()
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def digests_at(root_fd: int, paths: Sequence[str]) -> dict[str, str | None]:
    """`digest_at` for each path (blocking: run it in a thread)."""
    return {path: digest_at(root_fd, path) for path in paths}
