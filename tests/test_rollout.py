"""The one rollout path: what each phase's failure becomes, limits, and the sandbox's release."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from tests.test_chat_template import QWEN_DIR

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult
from clotho.env import EnvConfig, ToolContext
from clotho.env.driver import produce_groups
from clotho.env.registry import load_environment
from clotho.env.scored import ScoredGroup
from clotho.envs.terminal_test import InlineTask, TerminalTestEnv
from clotho.errors import ConfigError, LimitExceeded, SandboxError
from clotho.rollout import RolloutSpec, VerifierOutcome, run_rollout
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, Sandbox
from clotho.sandbox.pool import SlotPool

pytestmark = requires_bwrap


class WritesFile:
    """A scripted agent (no model): writes a marker file, or raises what it is given."""

    name = "writer"

    def __init__(self, raises: BaseException | None = None, hangs: bool = False) -> None:
        self.raises = raises
        self.hangs = hangs
        self.instructions: list[str] = []
        self.started = asyncio.Event()

    async def run(self, ctx: AgentContext) -> AgentResult:
        self.instructions.append(ctx.instruction)
        await ctx.sandbox.exec("echo done > /app/marker")
        self.started.set()
        if self.hangs:  # until the rollout's limit or a cancel ends it
            await asyncio.Event().wait()
        if self.raises is not None:
            raise self.raises
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


async def _marker_reward(sandbox: Sandbox, result: AgentResult) -> VerifierOutcome:
    found = await sandbox.exec("cat /app/marker")
    return VerifierOutcome(reward=float(found.stdout.strip() == "done"))


def _spec(agent: Any, **overrides: Any) -> RolloutSpec:
    fields: dict[str, Any] = {
        "sandbox": LocalSandboxConfig(),
        "agent": agent,
        "instruction": lambda: "write the marker",
        "verify": _marker_reward,
    }
    fields.update(overrides)
    return RolloutSpec(**fields)


async def test_a_rollout_passes_and_releases_its_sandbox() -> None:
    agent = WritesFile()
    async with SlotPool() as pool:
        outcome = await run_rollout(_spec(agent), pool)
        assert pool.stats()["in_use"] == 0
    assert outcome.error is None and outcome.passed and outcome.reward == 1.0
    assert outcome.phase == "done" and outcome.valid
    assert agent.instructions == ["write the marker"]
    assert outcome.messages == [{"role": "user", "content": "write the marker"}]
    timings = outcome.timings
    assert min(timings.acquire_s, timings.agent_s, timings.verify_s, timings.release_s) > 0
    assert timings.acquire_s + timings.setup_s + timings.agent_s + timings.verify_s <= (
        outcome.duration_s
    )


def _raise(exc: BaseException) -> Any:
    async def fail(*_: Any) -> Any:
        raise exc

    return fail


def _raising_prompt() -> str:
    raise KeyError("no such field")


@pytest.mark.parametrize(
    ("overrides", "agent_raises", "kind", "phase"),
    [
        ({"prepare": _raise(RuntimeError("setup bug"))}, None, "task", "setup"),
        ({"instruction": _raising_prompt}, None, "task", "setup"),
        ({}, RuntimeError("agent bug"), "infra", "agent"),
        ({}, SandboxError("shell died"), "agent", "agent"),
        ({"verify": _raise(ValueError("reward bug"))}, None, "verifier", "verify"),
        ({"prepare": _raise(SandboxError("upload failed"))}, None, "infra", "setup"),
        # An install that needs more memory than the task allows is the task's, not the agent's.
        ({"prepare": _raise(LimitExceeded("memory limit reached"))}, None, "task", "setup"),
        ({}, LimitExceeded("memory limit reached"), "limit", "agent"),
    ],
)
async def test_each_phase_failure_has_its_kind_and_is_never_a_reward(
    overrides: dict[str, Any], agent_raises: BaseException | None, kind: str, phase: str
) -> None:
    async with SlotPool() as pool:
        outcome = await run_rollout(_spec(WritesFile(agent_raises), **overrides), pool)
        assert pool.stats()["in_use"] == 0
    assert outcome.error is not None and outcome.error.kind == kind, outcome.error
    assert outcome.phase == phase
    assert outcome.reward is None and not outcome.passed and not outcome.valid


@pytest.mark.parametrize(("host_alive", "kind"), [(True, "agent"), (False, "infra")])
async def test_a_broken_sandbox_is_judged_by_its_own_host(
    monkeypatch: pytest.MonkeyPatch, host_alive: bool, kind: str
) -> None:
    """A cluster that lost some node reports itself unhealthy for a while; a sandbox the
    agent broke on a node that is alive is still the agent's failure. The health probe is a
    TEST DOUBLE (the local backend has no node to lose); the sandbox and the agent are real."""
    from clotho.sandbox.local.backend import LocalBackend

    asked: list[object] = []

    async def healthy(backend: LocalBackend, sandbox: object = None) -> bool:
        asked.append(sandbox)
        return host_alive if sandbox is not None else False  # "a node was lost elsewhere"

    monkeypatch.setattr(LocalBackend, "healthy", healthy)
    async with SlotPool() as pool:
        outcome = await run_rollout(_spec(WritesFile(SandboxError("shell died"))), pool)
    assert outcome.error is not None and outcome.error.kind == kind, outcome.error
    assert asked and all(isinstance(s, Sandbox) for s in asked)


async def test_the_wall_clock_limit_is_the_agents_failure_and_counts() -> None:
    async with SlotPool() as pool:
        outcome = await run_rollout(_spec(WritesFile(hangs=True), timeout_s=5), pool)
    assert outcome.error is not None and outcome.error.kind == "agent"
    assert "wall-clock limit of 5 s reached during agent" in outcome.error.message
    assert outcome.error.scored  # a failure that counts in the pass rate


async def test_cancelling_a_rollout_releases_its_sandbox() -> None:
    async with SlotPool() as pool:
        agent = WritesFile(hangs=True)
        task = asyncio.ensure_future(run_rollout(_spec(agent), pool))
        await asyncio.wait_for(agent.started.wait(), 30)
        assert pool.stats()["in_use"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.stats()["in_use"] == 0


class _BrokenSetup(TerminalTestEnv):
    """Every other item fails to set up, and every third prompt cannot be formatted."""

    broken: set[str] = {"count"}
    unformattable: set[str] = {"sum"}

    async def setup_workspace(self, item: InlineTask, sandbox: Sandbox) -> None:
        if item.name in self.broken:
            raise RuntimeError(f"cannot prepare {item.name}")

    def format_prompt(self, item: InlineTask) -> str:
        if item.name in self.unformattable:
            raise KeyError(item.name)
        return item.prompt

    async def compute_reward(self, item: InlineTask, result: Any, ctx: ToolContext) -> float:
        return 1.0


class _ListSink:
    def __init__(self) -> None:
        self.groups: list[ScoredGroup] = []

    async def wait_for_room(self) -> None:
        return None

    async def send(self, group: ScoredGroup) -> None:
        self.groups.append(group)


class _NoModel:
    """A named test double for the model: the agent here is scripted, never asks it."""

    def session(self) -> Any:
        raise AssertionError("the scripted agent never talks to a model")

    async def aclose(self) -> None:
        return None


async def test_a_raising_setup_or_prompt_is_that_rollouts_error_and_the_run_goes_on() -> None:
    config = EnvConfig(group_size=2, tokenizer=str(QWEN_DIR))
    env = _BrokenSetup(config, model=_NoModel())  # type: ignore[arg-type]
    env.agent = lambda tools: WritesFile()  # type: ignore[method-assign]
    sink = _ListSink()
    try:
        await env.setup()
        await produce_groups(env, sink, concurrency=2, n_groups=6)
    finally:
        await env.close()
    assert env.stats.groups == 6
    # greeting groups pass; count (setup) and sum (prompt) groups are dropped, not fatal
    assert len(sink.groups) == 2 and env.stats.dropped_too_few_valid == 4
    assert all(g.scores == [1.0, 1.0] for g in sink.groups)


async def test_groups_without_tokens_never_leave_the_environment() -> None:
    from clotho.chat.client import ChatClient, ModelConfig

    model = ModelConfig(model="m", base_url="http://127.0.0.1:9/v1")
    env = TerminalTestEnv(EnvConfig(model=model), model=ChatClient(model))
    try:
        with pytest.raises(ConfigError, match="no tokenizer is configured"):
            await produce_groups(env, _ListSink(), concurrency=1, n_groups=1)
    finally:
        await env.close()
    assert env.stats.groups == 0


def test_an_environment_loads_from_the_project_folder_and_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "mypkg_rollout_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = (
        "from clotho.envs.terminal_test import TerminalTestEnv\n"
        "class CountFiles(TerminalTestEnv):\n    name = 'count_files'\n"
    )
    (package / "envs.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    assert load_environment("mypkg_rollout_test.envs:CountFiles").name == "count_files"
    assert load_environment(f"{package / 'envs.py'}:CountFiles").name == "count_files"
    with pytest.raises(ConfigError, match="cannot load environment"):
        load_environment("mypkg_rollout_test.envs:Nope")


class Hog:
    """A scripted agent whose command allocates past the sandbox's memory limit."""

    name = "hog"

    async def run(self, ctx: AgentContext) -> AgentResult:
        await ctx.sandbox.exec(
            "python3 -c 'x = bytearray(400 << 20); x[::4096] = b\"1\" * len(x[::4096])'"
        )
        return AgentResult(messages=[])


@requires_docker
async def test_a_limit_the_agent_hits_is_a_failure_of_kind_limit_that_counts() -> None:
    async with SlotPool() as pool:
        spec = _spec(Hog(), sandbox=DockerSandboxConfig(memory_mb=128))
        outcome = await run_rollout(spec, pool)
        assert pool.stats()["in_use"] == 0
    assert outcome.error is not None and outcome.error.kind == "limit", outcome.error
    assert outcome.error.scored and not outcome.passed


class _NoTurn:
    """A scripted agent on a token backend whose time ran out before its first token."""

    name = "no-turn"

    async def run(self, ctx: AgentContext) -> AgentResult:
        return AgentResult(messages=[], stop_reason="time_limit", sequences=[])


async def test_a_group_without_a_single_token_is_dropped_not_sent() -> None:
    env = _BrokenSetup(EnvConfig(group_size=2, min_valid_rollouts=1), model=_NoModel())  # type: ignore[arg-type]
    env.agent = lambda tools: _NoTurn()  # type: ignore[method-assign]
    try:
        await env.setup()
        group, rollouts = await env.collect_group(await env.get_next_item())
    finally:
        await env.close()
    assert group is None and len(rollouts) == 2
    assert env.stats.dropped_no_tokens == 1 and env.stats.dropped_overlong == 0
