"""The event loop never blocks: `clotho eval` under asyncio's debug mode reports no callback
that held the loop for 50 ms or more, with the embedded model and with the Docker backend."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker

SLOW_S = 0.05


def _debug_run(coro: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run` in debug mode, logging every callback that takes `SLOW_S` or more."""
    with asyncio.Runner(debug=True) as runner:
        runner.get_loop().slow_callback_duration = SLOW_S
        return runner.run(coro)


# `clotho` as a user runs it, in its own process (a test process's bigger heap makes garbage
# collection pauses that a user's run does not have), with asyncio's debug mode on.
DEBUG_CLOTHO = f"""
import asyncio, logging, sys
def run(coro, **kwargs):
    with asyncio.Runner(debug=True) as runner:
        runner.get_loop().slow_callback_duration = {SLOW_S}
        return runner.run(coro)
asyncio.run = run
logging.basicConfig(level=logging.WARNING, format="SLOWCHECK %(name)s %(message)s")
from clotho.cli.main import app
app(sys.argv[1:], prog_name="clotho")
"""


def _slow_callbacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.message]


def _eval_without_slow_callbacks(args: list[str], out: Path) -> None:
    """A blocking call blocks on every run; a busy machine's preemption does not repeat
    itself: a run with slow callbacks is tried once more, and both must show them to fail."""
    slow: list[str] = []
    for attempt in range(2):
        argv = ["eval", *args, "--out", str(out / str(attempt))]
        proc = subprocess.run(
            [sys.executable, "-c", DEBUG_CLOTHO, *argv], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        slow = [
            line for line in proc.stderr.splitlines()
            if line.startswith("SLOWCHECK asyncio") and "took" in line
        ]  # fmt: skip
        if not slow:
            return
    raise AssertionError("callbacks blocked the event loop on both runs:\n" + "\n".join(slow))


def test_the_check_sees_a_callback_that_blocks(caplog: pytest.LogCaptureFixture) -> None:
    async def blocks() -> None:
        time.sleep(2 * SLOW_S)  # noqa: ASYNC251 - the blocking call the check must see

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        _debug_run(blocks())
    assert len(_slow_callbacks(caplog)) == 1


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
