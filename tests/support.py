"""Helpers the test modules share: waiting for a condition instead of for a duration, the
`clotho` command in a child process, and small Harbor tasks written on disk.

A test asserts what happened and in which order, never how long it took: a busy machine
stretches every duration. The only sleeps in tests are the polls here, and their deadlines
are generous bounds for a stuck test, not measurements.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")

# Long enough for a 2-core machine running the suite beside another load; a condition that
# holds sooner returns sooner.
PATIENCE_S = 30.0
POLL_S = 0.02


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float = PATIENCE_S
) -> bool:
    """True once `predicate()` holds (it may be a coroutine function), False after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        held = predicate()
        if not isinstance(held, bool):
            held = await held
        if held:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)


def wait_until_sync(predicate: Callable[[], bool], timeout: float = PATIENCE_S) -> bool:
    """`wait_until` for code outside an event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def running(argv: list[str]) -> bool:
    """Whether a live process on this host runs exactly `argv` (sandboxed ones included)."""
    wanted = "\0".join(argv).encode() + b"\0"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/cmdline").read_bytes() == wanted:
                return True
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return False


def wait_for_value(condition: Callable[[], T], timeout: float = PATIENCE_S) -> T:
    """The first truthy value of `condition()`; errors it raises count as "not yet" until the
    deadline, when the last one is raised (a page still loading, a server still starting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:
            if time.monotonic() > deadline:
                raise
        else:
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {condition}")
        time.sleep(POLL_S)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on `host:port`."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        return False
    return True


async def http_up(url: str, timeout: float = PATIENCE_S) -> None:
    """Wait until `url` answers HTTP at all (any status); raise if it never does."""
    async with httpx.AsyncClient() as http:

        async def answers() -> bool:
            try:
                await http.get(url)
            except httpx.TransportError:
                return False
            return True

        if not await wait_until(answers, timeout):
            raise AssertionError(f"{url} did not answer within {timeout:g} s")


# --- the command line ------------------------------------------------------------------------


def run_clotho(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m clotho *args` in a child process, its output captured as text; `env` goes
    over this process's environment. The timeout bounds a hung command, it measures nothing."""
    return subprocess.run(
        [sys.executable, "-m", "clotho", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# --- tasks on disk -----------------------------------------------------------------------------

# The verifier of a written task: reward 1 when /app/done.txt holds "ok".
DONE_TEST_SH = """\
mkdir -p /logs/verifier
if [ "$(cat /app/done.txt 2>/dev/null)" = ok ]; then echo 1; else echo 0; fi \\
  > /logs/verifier/reward.txt
"""


def write_task(
    root: Path,
    name: str,
    *,
    solve_sh: str = "echo ok > /app/done.txt\n",
    test_sh: str = DONE_TEST_SH,
    agent_timeout_s: float = 60.0,
) -> Path:
    """A small Harbor task at `root/name` (as conftest's `make_task` writes one), for fixtures
    wider than a test's tmp_path; by default its solution passes."""
    task = root / name
    for sub in ("tests", "solution", "environment"):
        (task / sub).mkdir(parents=True)
    toml = '[metadata]\ncategory = "files"\n[verifier]\ntimeout_sec = 30.0\n'
    agent = f"[agent]\ntimeout_sec = {agent_timeout_s}\n"
    (task / "task.toml").write_text('version = "1.0"\n' + toml + agent)
    (task / "instruction.md").write_text("Write ok into /app/done.txt.")
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "solution" / "solve.sh").write_text(solve_sh)
    return task
