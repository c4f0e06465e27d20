"""The event loop never blocks: `clotho eval` has no step that computed for 50 ms or more and
makes no blocking call on the loop, with the embedded model and with the Docker backend.

The check (tests/slow_callbacks) judges a step by its CPU time and by the calls it makes,
never by the wall clock, so a busy machine's preemption cannot fail it. The first tests show
that it sees both kinds of blocking, lets the loop's own ways of waiting pass, and ignores a
step that was kept waiting for a CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from tests.slow_callbacks import run_watched

SLOW_S = 0.05
ROOT = Path(__file__).resolve().parent.parent


def test_the_check_sees_a_long_computation() -> None:
    async def computes_on_the_loop() -> None:
        started = time.thread_time()  # CPU time: the same however busy the machine is
        while time.thread_time() - started < 2 * SLOW_S:
            pass

    slow: list[str] = []
    run_watched(computes_on_the_loop(), SLOW_S, slow)
    assert any("computes_on_the_loop" in line and "computed for" in line for line in slow), slow


def test_the_check_sees_blocking_calls_however_short() -> None:
    async def sleeps() -> None:
        time.sleep(0.001)  # noqa: ASYNC251 - the blocking call the check must see

    async def runs_a_command() -> None:
        subprocess.run(["true"], check=True)  # noqa: ASYNC221 - likewise

    async def waits_for_a_thread() -> None:
        done = threading.Event()
        threading.Thread(target=done.set).start()
        done.wait()

    async def talks_http_synchronously() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n")

    for blocking, call in [
        (sleeps, "time.sleep"),
        (runs_a_command, "os.waitpid"),
        (waits_for_a_thread, "Event.wait"),
        (talks_http_synchronously, "socket.connect"),
    ]:
        slow: list[str] = []
        run_watched(blocking(), SLOW_S, slow)
        assert any(blocking.__name__ in line and call in line for line in slow), slow


def test_the_loops_own_ways_of_waiting_pass() -> None:
    """Awaiting sleeps, child processes, threads and sockets: nothing blocks the loop."""

    async def waits_properly() -> None:
        await asyncio.sleep(2 * SLOW_S)
        proc = await asyncio.create_subprocess_exec("true")
        assert await proc.wait() == 0
        await asyncio.to_thread(time.sleep, 2 * SLOW_S)
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"hello")
            await writer.drain()
            assert await reader.read() == b""
            writer.close()

    slow: list[str] = []
    run_watched(waits_properly(), SLOW_S, slow)
    assert slow == []


# Runs in its own process: it pins itself to one CPU, starts two busy processes there and
# lowers its own priority, so the kernel keeps its loop thread waiting for that CPU.
PREEMPTED = f"""
import asyncio, json, logging, os, subprocess, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.slow_callbacks import LoopWatch, open_schedstat, run_delay_ns

os.sched_setaffinity(0, {{min(os.sched_getaffinity(0))}})
hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]
os.setpriority(os.PRIO_PROCESS, 0, 19)
wall_clock = []

class Collect(logging.Handler):
    def emit(self, record):
        if "took" in record.getMessage():
            wall_clock.append(record.getMessage())

async def preempted():
    fd = open_schedstat()
    waited = run_delay_ns(fd)
    while run_delay_ns(fd) - waited < {4 * SLOW_S} * 1e9:  # computes only between waits
        pass
    os.close(fd)

logging.getLogger("asyncio").addHandler(Collect())
try:
    with asyncio.Runner(debug=True) as runner:
        loop = runner.get_loop()
        loop.slow_callback_duration = {SLOW_S}  # asyncio's own check, by the wall clock
        with LoopWatch(loop, {SLOW_S}, keep_steps=True) as watch:
            runner.run(preempted())
finally:
    for hog in hogs:
        hog.kill()
        hog.wait()
print(json.dumps({{"slow": watch.slow, "steps": watch.steps, "wall_clock": wall_clock}}))
"""


def test_the_check_ignores_a_step_kept_waiting_for_a_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PREEMPTED], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    cpu, waited, _ = max(report["steps"], key=lambda step: step[1])
    assert waited >= 4 * SLOW_S * 1e9  # the step spent 200 ms+ waiting for a CPU ...
    assert any("preempted" in line for line in report["wall_clock"])  # ... which debug mode flags
    assert cpu < SLOW_S * 1e9 and report["slow"] == []  # ... and this check does not


# `clotho` as a user runs it, in its own process (a test process's bigger heap makes garbage
# collection pauses that a user's run does not have), every loop step watched, asyncio's
# debug mode on for its other checks.
WATCHED_CLOTHO = f"""
import asyncio, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.slow_callbacks import run_watched

def run(coro, **kwargs):
    slow = []
    try:
        return run_watched(coro, {SLOW_S}, slow)
    finally:
        for line in slow:
            print("SLOWCHECK", line, file=sys.stderr, flush=True)

asyncio.run = run
from clotho.cli.main import app
app(sys.argv[1:], prog_name="clotho")
"""


def _eval_without_slow_callbacks(args: list[str], out: Path) -> None:
    """A blocking call fails the first run. A long computation fails when the second run
    shows one too: CPU time is immune to preemption but not quite to contention, and a
    sandbox's start (some 200 file-system calls and forks on the loop, about 20 ms of CPU
    on an idle machine) measured 57 ms once while other processes hammered the same kernel.
    A step that computes too long does so on every run."""
    slow: list[str] = []
    for attempt in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", WATCHED_CLOTHO, "eval", *args, "--out", str(out / str(attempt))],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        slow = [line for line in proc.stderr.splitlines() if line.startswith("SLOWCHECK")]
        blocking = [line for line in slow if "made a blocking call" in line]
        assert blocking == [], "blocking calls on the event loop:\n" + "\n".join(blocking)
        if not slow:
            return
    raise AssertionError(
        "steps computed too long on the event loop, on both runs:\n" + "\n".join(slow)
    )


@requires_bwrap
def test_eval_with_the_embedded_model_never_blocks_the_loop(
    examples_dir: Path, tmp_path: Path
) -> None:
    args = [str(examples_dir), "--agent", "llm", "--max-turns", "2", "--max-tokens", "24"]
    args += ["--filter", "sales-csv-to-json,crontab-schedule"]
    _eval_without_slow_callbacks(args, tmp_path)


@requires_docker
def test_eval_on_docker_never_blocks_the_loop(examples_dir: Path, tmp_path: Path) -> None:
    args = [str(examples_dir), "--agent", "oracle", "--sandbox", "docker", "--concurrency", "4"]
    args += ["--filter", "sales-csv-to-json,crontab-schedule,access-log-summary,fix-roman-*"]
    _eval_without_slow_callbacks(args, tmp_path)


def test_watching_leaves_asyncio_as_it_was() -> None:
    """The check patches asyncio's `Handle._run` and the blocking calls only while it
    watches a loop."""

    def patched() -> list[object]:
        return [asyncio.events.Handle._run, time.sleep, os.waitpid, vars(socket.socket)]

    original = patched()
    run_watched(asyncio.sleep(0), SLOW_S, [])
    assert patched() == original
    with pytest.raises(ZeroDivisionError):
        run_watched(_divide(), SLOW_S, [])
    assert patched() == original


async def _divide() -> float:
    return 1 / 0
