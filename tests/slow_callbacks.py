"""Catch what holds the event loop, measured so that a busy machine cannot fake it.

asyncio's debug mode times each step by the wall clock: a step the kernel preempted for
50 ms (another process wanted the CPU) looks as slow as one that blocked, so on a busy
machine it flags innocent steps. This check judges two things that load does not change:

* computation: a step's CPU time on the loop's thread (Linux's per-thread schedstat, user
  and kernel time, so reading a large file into memory counts), flagged at `limit_s`;
* blocking calls: a step that sleeps, waits for a child process (`subprocess.run`), does
  I/O on a blocking socket (a synchronous HTTP client) or waits on a thread (an `Event`, a
  `concurrent.futures` result) is flagged however short the wait was this time.

Time spent waiting for a CPU, for the GIL or for a disk is left out: it measures the
machine's load as much as the code. Small file operations on the loop are the project's
policy (a stat is not worth a thread hop); a large one shows as computation.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import sys
import threading
import time
from asyncio import events
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

_ORIGINAL_RUN = events.Handle._run
_WATCHES: dict[asyncio.AbstractEventLoop, LoopWatch] = {}


class _Step(threading.local):
    """The watch whose loop is running a step in this thread, if any."""

    watch: LoopWatch | None = None
    handle: events.Handle | None = None


_step = _Step()


def schedstat_ns(fd: int) -> tuple[int, int]:
    """(on a CPU, waiting for one): nanoseconds so far of the thread of `fd`, its open
    schedstat file."""
    on_cpu, waiting, _ = os.pread(fd, 128, 0).split()
    return int(on_cpu), int(waiting)


def run_delay_ns(fd: int) -> int:
    """Nanoseconds the thread of `fd` (its open schedstat file) has waited for a CPU."""
    return schedstat_ns(fd)[1]


def open_schedstat() -> int:
    """The calling thread's schedstat file, open for `schedstat_ns`."""
    path = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/schedstat"
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RuntimeError(
            f"{path} is missing: the loop check needs a Linux kernel with CONFIG_SCHED_INFO"
        ) from None


# --- blocking calls ---------------------------------------------------------------------------


def _timeout_blocks(timeout: float | None) -> bool:
    return timeout is None or timeout > 0


def _socket_blocks(sock: socket.socket, *_: Any, **__: Any) -> bool:
    return sock.gettimeout() != 0.0  # asyncio's sockets are non-blocking


def _event_wait_blocks(event: threading.Event, timeout: float | None = None) -> bool:
    # Thread.start waits for the new thread to say it runs: a handshake, not a wait for work.
    caller = sys._getframe(2).f_code
    return _timeout_blocks(timeout) and caller is not threading.Thread.start.__code__


def _result_blocks(future: concurrent.futures.Future[Any], timeout: float | None = None) -> bool:
    return not future.done() and _timeout_blocks(timeout)


# (owner, attribute, does this call block?)
_BLOCKING: list[tuple[Any, str, Callable[..., bool]]] = [
    (time, "sleep", lambda seconds: seconds > 0),
    (os, "waitpid", lambda pid, options: not options & os.WNOHANG),
    (threading.Event, "wait", _event_wait_blocks),
    (concurrent.futures.Future, "result", _result_blocks),
    *[
        (socket.socket, name, _socket_blocks)
        for name in ("accept", "connect", "recv", "recv_into", "recvfrom", "send", "sendall")
    ],
]
_ORIGINALS: dict[tuple[Any, str], Any] = {}  # None: inherited, not the owner's own


def _watched_call(owner: Any, name: str, blocks: Callable[..., bool]) -> Callable[..., Any]:
    original = getattr(owner, name)
    label = f"{getattr(owner, '__name__', owner)}.{name}"

    def call(*args: Any, **kwargs: Any) -> Any:
        watch = _step.watch
        if watch is not None and blocks(*args, **kwargs):
            watch.slow.append(f"Executing {_describe(_step.handle)} made a blocking call: {label}")
        return original(*args, **kwargs)

    return call


def _install() -> None:
    events.Handle._run = _watched_run  # type: ignore[method-assign]
    for owner, name, blocks in _BLOCKING:
        _ORIGINALS[owner, name] = vars(owner).get(name)
        setattr(owner, name, _watched_call(owner, name, blocks))


def _uninstall() -> None:
    events.Handle._run = _ORIGINAL_RUN  # type: ignore[method-assign]
    for (owner, name), original in _ORIGINALS.items():
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
    _ORIGINALS.clear()


# --- the watch --------------------------------------------------------------------------------


class LoopWatch:
    """Records in `slow` the steps of `loop` that computed for `limit_s` or more, and the
    blocking calls made in any step. Made in the loop's thread (the schedstat file is that
    thread's)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, limit_s: float, *, keep_steps: bool = False
    ) -> None:
        self.loop = loop
        self.limit_ns = int(limit_s * 1e9)
        self.slow: list[str] = []
        # With keep_steps, every step's (CPU, waited for a CPU, wall) in ns: to test the check.
        self.steps: list[tuple[int, int, int]] | None = [] if keep_steps else None
        self._fd = open_schedstat()

    def __enter__(self) -> LoopWatch:
        if self.loop in _WATCHES:
            raise RuntimeError("this loop is already watched")
        if not _WATCHES:
            _install()
        _WATCHES[self.loop] = self
        return self

    def __exit__(self, *exc: object) -> None:
        del _WATCHES[self.loop]
        if not _WATCHES:
            _uninstall()
        os.close(self._fd)

    def run(self, handle: events.Handle) -> None:
        started = time.perf_counter_ns()
        ran, waited = schedstat_ns(self._fd)
        outer = _step.watch, _step.handle
        _step.watch, _step.handle = self, handle
        try:
            _ORIGINAL_RUN(handle)
        finally:
            _step.watch, _step.handle = outer
            wall = time.perf_counter_ns() - started
            now_ran, now_waited = schedstat_ns(self._fd)
            cpu = now_ran - ran
            if self.steps is not None:
                self.steps.append((cpu, now_waited - waited, wall))
            if cpu >= self.limit_ns:
                self.slow.append(
                    f"Executing {_describe(handle)} computed for {cpu / 1e9:.3f} seconds "
                    f"({wall / 1e9:.3f} s by the wall clock)"
                )


def _watched_run(handle: events.Handle) -> None:
    watch = _WATCHES.get(handle._loop)
    if watch is None:
        _ORIGINAL_RUN(handle)
    else:
        watch.run(handle)


def _describe(handle: events.Handle | None) -> str:
    owner = getattr(handle, "_callback", None)
    owner = getattr(owner, "__self__", None)
    return repr(owner) if isinstance(owner, asyncio.Task) else repr(handle)


@contextlib.asynccontextmanager
async def slow_callbacks(limit_s: float = 0.05) -> AsyncIterator[list[str]]:
    """Watches the running loop while inside; yields what held it (see the module doc)."""
    with LoopWatch(asyncio.get_running_loop(), limit_s) as watch:
        yield watch.slow


def run_watched(
    coro: Coroutine[Any, Any, Any], limit_s: float, slow: list[str], *, debug: bool = True
) -> Any:
    """`asyncio.run(coro)` with every step watched; what held the loop goes into `slow`.

    Debug mode stays on for its other checks (calls from the wrong thread, never-awaited
    coroutines); its own slow-callback warnings, by the wall clock, are turned off.
    """
    runner = asyncio.Runner(debug=debug)
    loop = runner.get_loop()
    loop.slow_callback_duration = float("inf")
    with LoopWatch(loop, limit_s) as watch:  # shutting down is watched too
        try:
            with runner:
                return runner.run(coro)
        finally:
            slow.extend(watch.slow)
