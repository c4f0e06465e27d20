"""RL environments: group rollouts, typed failures, scored groups, `process` and `serve`."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import HTTPError, ScriptedOpenAIServer, assistant, tool_call
from tests.test_chat_template import QWEN_DIR

from clotho.chat.client import ChatClient, ModelConfig
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.env import EnvConfig, ScoredGroup, ToolContext
from clotho.env.registry import load_environment
from clotho.envs.terminal_test import TerminalTestEnv
from clotho.errors import ConfigError
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.tools.registry import ToolsetDistribution
from clotho.trainers.jsonl import load_groups

pytestmark = requires_bwrap

ANSWERS = {"greeting.txt": "Hello from clotho", "count.txt": "1\n2\n3\n4\n5\n", "answer.txt": "579"}


def solver(wrong_every: int = 0, *, instead: str | None = None) -> Any:
    """A scripted model: writes the right file (or, for every Nth rollout of the same task, a
    wrong one; with `instead`, runs that command in its place). Counted per task, so a
    group's rollouts alternate even when groups of other tasks run at the same time. Every
    rollout stops after its one call."""
    calls: dict[str, int] = {}

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if messages[-1]["role"] != "user":
            return assistant("done")
        task = messages[-1]["content"]
        calls[task] = calls.get(task, 0) + 1
        wrong = bool(wrong_every) and calls[task] % wrong_every == 0
        if wrong and instead is not None:
            return assistant("", [tool_call("terminal", {"command": instead})])
        path = re.search(r"/app/\w+\.txt", task).group(0)  # type: ignore[union-attr]
        content = "nope" if wrong else ANSWERS.get(path.rsplit("/", 1)[1], "42")
        return assistant("", [tool_call("write_file", {"path": path, "content": content})])

    return reply


def env_for(server: ScriptedOpenAIServer, **config: Any) -> TerminalTestEnv:
    model = ModelConfig(model="m", base_url=server.base_url, max_retries=0, backoff_initial_s=0.01)
    return TerminalTestEnv(EnvConfig(model=model, **config), model=ChatClient(model))


async def test_group_rollouts_score_in_their_own_sandboxes() -> None:
    with ScriptedOpenAIServer(default=solver(wrong_every=2)) as server:
        env = env_for(server, group_size=4)
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert group is not None
    assert sorted(group.scores) == [0.0, 0.0, 1.0, 1.0]  # each rollout saw only its own files
    assert len(group.messages or []) == 4 and group.tokens == [[], [], [], []]
    assert all(r.agent is not None and r.agent.tool_calls == 1 for r in rollouts)
    assert env.stats.groups == 1 and env.stats.infra_errors == 0


async def test_model_outage_is_infra_and_the_group_is_dropped() -> None:
    with ScriptedOpenAIServer(default=HTTPError(503)) as server:
        env = env_for(server, group_size=2)
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert group is None
    assert [r.error.kind for r in rollouts if r.error] == ["infra", "infra"]
    assert all(r.reward is None for r in rollouts)  # never scored 0
    assert env.stats.dropped_too_few_valid == 1 and env.stats.infra_errors == 2


class _BrokenReward(TerminalTestEnv):
    async def compute_reward(self, item: Any, result: Any, ctx: ToolContext) -> float:
        raise RuntimeError("reward code bug")


async def test_a_raising_reward_function_is_a_verifier_error_not_a_reward() -> None:
    """The rollouts are verifier errors with the message, counted by kind; in training, as in
    eval, they count as failures (the agent may have made the reward code raise), so the
    group keeps them with the failure score (tests/test_env_failures.py)."""
    with ScriptedOpenAIServer(default=solver()) as server:
        model = ModelConfig(model="m", base_url=server.base_url)
        env = _BrokenReward(EnvConfig(model=model, group_size=2), model=ChatClient(model))
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert all(r.error is not None and r.error.kind == "verifier" for r in rollouts)
    assert all(r.reward is None for r in rollouts)  # the verifier gave no reward
    assert "reward code bug" in rollouts[0].error.message  # type: ignore[union-attr]
    assert env.stats.verifier_errors == 2 and env.stats.errors == {"verifier": 2}
    assert group is not None and group.scores == [0.0, 0.0]


async def test_same_scores_can_be_dropped_and_tools_come_from_a_distribution() -> None:
    with ScriptedOpenAIServer(default=solver()) as server:
        env = env_for(server, group_size=2, ensure_scores_are_not_same=True, distribution="both")
        env.registry.add_distribution(
            ToolsetDistribution(name="both", probabilities={"terminal": 1.0, "file": 1.0})
        )
        try:
            await env.setup()
            assert {t.name for t in env.resolve_tools()} >= {"terminal", "write_file"}
            group, _ = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert group is None and env.stats.dropped_same_scores == 1


async def test_tool_context_works_in_the_agents_sandbox(tmp_path: Path) -> None:
    async with await open_sandbox(LocalSandboxConfig()) as sandbox:
        ctx = ToolContext(sandbox)
        await ctx.write_file("notes/a.txt", "alpha\nbeta\n")
        assert await ctx.read_text("/app/notes/a.txt") == "alpha\nbeta\n"
        assert (await ctx.terminal("wc -l < notes/a.txt")).stdout.strip() == "2"
        assert "notes/a.txt:2:beta" in await ctx.search("bet")
        assert "2\tbeta" in await ctx.call_tool("read_file", {"path": "notes/a.txt"})
        (tmp_path / "up").mkdir()
        (tmp_path / "up" / "bin.dat").write_bytes(bytes(range(256)))
        await ctx.upload(tmp_path / "up", "/app/up")
        await ctx.download("/app/up", tmp_path / "down")
        assert (tmp_path / "down" / "bin.dat").read_bytes() == bytes(range(256))
        with pytest.raises(ValueError, match="path"):
            await ctx.call_tool("read_file", {})


def test_registry_names_and_import_paths() -> None:
    assert load_environment("terminal_test") is TerminalTestEnv
    assert load_environment("clotho.envs.terminal_test:TerminalTestEnv") is TerminalTestEnv
    with pytest.raises(ConfigError, match="registered name"):
        load_environment("nope")


def test_process_writes_groups_that_load_back(tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    with ScriptedOpenAIServer(default=solver(wrong_every=3)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "clotho", "process", "terminal_test", "--out", str(out),
             "--n-groups", "3", "--group-size", "3", "--model", "m", "--base-url", server.base_url,
             "--tokenizer", str(QWEN_DIR)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        untrainable = subprocess.run(
            [sys.executable, "-m", "clotho", "process", "terminal_test", "--out",
             str(tmp_path / "none.jsonl"), "--model", "m", "--base-url", server.base_url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert untrainable.returncode == 2 and "no tokenizer is configured" in untrainable.stderr
    assert proc.returncode == 0, proc.stderr
    groups = [ScoredGroup.model_validate(line.model_dump()) for line in load_groups(out)]
    assert len(groups) == 3
    for group in groups:
        assert len(group.scores) == len(group.messages or []) == len(group.tokens) == 3
        assert all(len(tokens) > 50 for tokens in group.tokens)
    assert "rollout 0" in out.with_suffix(".html").read_text()


async def test_serve_feeds_a_trainer_through_clotho_api(tmp_path: Path) -> None:
    from tests.test_trainers_support import ScriptedTrainer

    from clotho.trainers.server import ApiServer

    with ScriptedOpenAIServer(default=solver(wrong_every=2)) as model:
        async with ApiServer(port=0) as api:
            trainer = ScriptedTrainer(api.url)
            await trainer.register(batch_size=4)
            serve = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "clotho", "serve", "terminal_test", "--api-url", api.url,
                "--group-size", "2", "--model", "m", "--base-url", model.base_url,
                "--tokenizer", str(QWEN_DIR),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                batch = await trainer.pull(timeout_s=60)
            finally:
                serve.send_signal(signal.SIGINT)
                _, stderr = await asyncio.wait_for(serve.communicate(), 30)
                await trainer.aclose()
    assert sum(len(g["tokens"]) for g in batch) == 4
    tokenizer = TemplateTokenizer.from_path(QWEN_DIR)
    for group in batch:
        assert len(group["scores"]) == len(group["messages"]) == len(group["masks"]) == 2
        assert sorted(group["scores"]) == [0.0, 1.0]
        for tokens, masks, messages in zip(
            group["tokens"], group["masks"], group["messages"], strict=True
        ):
            assert len(tokens) == len(masks) > 50
            trained = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m != -100])
            untrained = tokenizer.decode(
                [t for t, m in zip(tokens, masks, strict=True) if m == -100]
            )
            assert all(m in (-100, t) for t, m in zip(tokens, masks, strict=True))
            # Trained: the model's own turns (its tool call and its final answer) and nothing else.
            assert '"name": "write_file"' in trained and "done" in trained
            assert trained.count("<|im_end|>") == 2
            assert messages[1]["content"] in untrained and messages[1]["content"] not in trained
            assert "wrote " in untrained and "wrote " not in trained  # the tool result
    assert serve.returncode == 130, stderr.decode()


def oracle_like(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model that looks around once and stops: the tests decide pass or fail."""
    messages = body["messages"]
    if messages[-1]["role"] != "user":
        return assistant("done")
    return assistant("", [tool_call("terminal", {"command": "ls"})])


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_evaluate_terminal_tasks_writes_a_run_directory(
    make_task, tmp_path: Path, backend: str
) -> None:
    if backend == "docker":
        from tests.docker_probe import DOCKER_PROBLEM, IN_CI

        if DOCKER_PROBLEM and not IN_CI:
            pytest.skip(f"no Docker daemon answers ({DOCKER_PROBLEM})")
    make_task("passes", test_sh="mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    make_task("fails", category="git")
    out = tmp_path / "run"
    config = tmp_path / "env.yaml"
    config.write_text(
        f"tasks: [{tmp_path / 'tasks'}]\nsandbox: {{backend: {backend}}}\nmax_turns: 3\n"
    )
    with ScriptedOpenAIServer(default=oracle_like) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "clotho", "evaluate", "terminal_tasks", "--out", str(out),
             "--config", str(config), "--model", "m", "--base-url", server.base_url],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {
        json.loads(line)["task"]: json.loads(line)
        for line in (out / "results.jsonl").read_text().splitlines()
    }
    assert rows["passes"]["passed"] is True and rows["fails"]["passed"] is False
    assert rows["fails"]["error"] is None and rows["fails"]["turns"] == 2
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_rate"] == 0.5 and set(metrics["by_category"]) == {"files", "git"}


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
async def test_overlong_sequences_are_dropped_or_truncated(overlong: str) -> None:
    with ScriptedOpenAIServer(default=solver()) as server:
        env = env_for(
            server, group_size=2, tokenizer=str(QWEN_DIR), max_token_length=40, overlong=overlong
        )
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert all(r.valid for r in rollouts)
    if overlong == "drop":
        assert group is None and env.stats.dropped_overlong == 1
    else:
        assert group is not None and env.stats.truncated == 2
        assert [len(t) for t in group.tokens] == [40, 40] == [len(m) for m in group.masks]
