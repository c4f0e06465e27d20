"""The event loop never blocks: `clotho eval` under asyncio's debug mode reports no callback
that held the loop for 50 ms or more, with the embedded model and with the Docker backend."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from typer.testing import CliRunner

from clotho.cli.main import app

SLOW_S = 0.05


def _debug_run(coro: Coroutine[Any, Any, Any]) -> Any:
    """`asyncio.run` in debug mode, logging every callback that takes `SLOW_S` or more."""
    with asyncio.Runner(debug=True) as runner:
        runner.get_loop().slow_callback_duration = SLOW_S
        return runner.run(coro)


def _slow_callbacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "asyncio" and "took" in r.message]


def _eval_without_slow_callbacks(
    args: list[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(asyncio, "run", _debug_run)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        result = CliRunner().invoke(app, ["eval", *args])
    assert result.exit_code == 0, result.output
    slow = _slow_callbacks(caplog)
    assert slow == [], "callbacks blocked the event loop:\n" + "\n".join(slow)


def test_the_check_sees_a_callback_that_blocks(caplog: pytest.LogCaptureFixture) -> None:
    async def blocks() -> None:
        time.sleep(2 * SLOW_S)  # noqa: ASYNC251 - the blocking call the check must see

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        _debug_run(blocks())
    assert len(_slow_callbacks(caplog)) == 1


@requires_bwrap
def test_eval_with_the_embedded_model_never_blocks_the_loop(
    examples_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = [str(examples_dir), "--agent", "llm", "--max-turns", "2", "--max-tokens", "24"]
    args += ["--filter", "sales-csv-to-json,crontab-schedule", "--out", str(tmp_path / "run")]
    _eval_without_slow_callbacks(args, monkeypatch, caplog)


@requires_docker
def test_eval_on_docker_never_blocks_the_loop(
    examples_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    args = [str(examples_dir), "--agent", "oracle", "--sandbox", "docker", "--concurrency", "4"]
    args += ["--filter", "sales-csv-to-json,crontab-schedule,access-log-summary,fix-roman-*"]
    args += ["--out", str(tmp_path / "run")]
    _eval_without_slow_callbacks(args, monkeypatch, caplog)
