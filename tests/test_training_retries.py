"""The training path (`process`, `serve`, `evaluate`) retries what eval retries: a try lost to
the infrastructure runs again within the run, counted in the group stats; the agent's failures
never do. And it builds its agent, evaluates and prepares task environments the way eval does.

The infra failure is real: the local backend cannot make a sandbox's folder because its parent
is a file (as in tests/test_eval_retry.py), repaired when the environment says it retries. The
model is a scripted endpoint (tests/scripted_openai.py, a named test double for a hosted model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import TaskFactory, requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer
from tests.test_env import env_for, solver
from tests.test_env_failures import calls_of, sometimes_fails

from clotho.agent.llm import DEFAULT_SYSTEM_PROMPT, LLMAgent
from clotho.chat.client import ChatClient, ModelConfig
from clotho.env import EnvConfig
from clotho.env.base import Environment
from clotho.envs.endless import EndlessEnv
from clotho.envs.swe import SweEnv
from clotho.envs.terminal_tasks import TerminalTasksConfig, TerminalTasksEnv
from clotho.envs.terminal_test import TerminalTestEnv
from clotho.rollout import RolloutOutcome
from clotho.runs.env_eval import write_evaluation
from clotho.runs.eval import build_agent
from clotho.runs.records import EvalConfig
from clotho.runs.store import RunStore
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tools.tool import Tool

pytestmark = requires_bwrap


class _BrokenStateDir:
    """A local sandbox config whose state folder cannot be made (its parent is a file): every
    acquire fails with a real `SandboxError` (infra) until `repair()` makes the folder."""

    def __init__(self, tmp_path: Path) -> None:
        self.blocker = tmp_path / "blocker"
        self.blocker.write_text("a file where the state folder's parent should be")
        self.state = self.blocker / "state"
        self.config = LocalSandboxConfig(state_dir=str(self.state))
        self.repairs = 0

    async def repair(self, item: Any, tools: Sequence[Tool], outcome: RolloutOutcome) -> None:
        assert outcome.error is not None and outcome.error.kind == "infra", outcome.error
        if self.blocker.is_file():
            self.blocker.unlink()
            self.state.mkdir(parents=True)
            self.repairs += 1


def test_the_default_retries_are_evals() -> None:
    assert EnvConfig().retries == EvalConfig(paths=["x"]).retries == 2


async def test_a_rollout_lost_to_the_sandbox_backend_runs_again_in_its_group(
    tmp_path: Path,
) -> None:
    broken = _BrokenStateDir(tmp_path)
    seen: list[RolloutOutcome] = []

    async def observe(item: Any, tools: Sequence[Tool], outcome: RolloutOutcome) -> None:
        seen.append(outcome)

    with ScriptedOpenAIServer(default=solver(wrong_every=2)) as server:
        env = env_for(server, group_size=2, sandbox=broken.config)
        env.on_retry(broken.repair)
        env.on_rollout(observe)
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert broken.repairs == 1
    # Both rollouts acquire at once, so each may have lost its first try; none lost two.
    lost = [r.lost_tries for r in rollouts]
    assert all(len(tries) <= 1 for tries in lost) and any(lost), lost
    for tries in lost:
        assert all(e.kind == "infra" and "Not a directory" in e.message for e in tries), tries
    assert all(r.error is None for r in rollouts), [r.error for r in rollouts]
    assert group is not None and sorted(group.scores) == [0.0, 1.0]
    stats = env.stats
    assert stats.retries == sum(map(len, lost)) >= 1
    assert stats.rollouts == 2 and stats.infra_errors == 0 and stats.errors == {}
    assert len(seen) == 2 and all(o.error is None for o in seen), "only outcomes that stand"
    # (the local backend may keep its own caches there, named .clotho-*)
    left = [f for f in broken.state.iterdir() if not f.name.startswith(".clotho-")]
    assert left == [], "no sandbox folder left"


async def test_with_no_retries_the_lost_rollouts_leave_the_group(tmp_path: Path) -> None:
    broken = _BrokenStateDir(tmp_path)
    with ScriptedOpenAIServer(default=solver()) as server:
        env = env_for(server, group_size=2, sandbox=broken.config, retries=0)
        env.on_retry(broken.repair)
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    assert group is None and broken.repairs == 0
    assert [r.error.kind for r in rollouts if r.error] == ["infra", "infra"]
    assert all(r.lost_tries == [] for r in rollouts)
    assert env.stats.retries == 0 and env.stats.dropped_too_few_valid == 1


async def test_the_agents_failure_is_never_retried() -> None:
    """A policy that kills every process it can breaks its sandbox on a healthy backend: the
    agent's failure, scored in its group, and never run again (that would let a policy turn
    its failures into retries until it gets lucky)."""
    retried: list[RolloutOutcome] = []

    async def on_retry(item: Any, tools: Sequence[Tool], outcome: RolloutOutcome) -> None:
        retried.append(outcome)

    with ScriptedOpenAIServer(default=sometimes_fails("kill -9 -1")) as server:
        env = env_for(server, group_size=4, toolsets=["terminal", "file"])
        env.on_retry(on_retry)
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    killers = [r for r in rollouts if r.agent and "kill -9 -1" in calls_of(r.agent.messages)]
    assert len(killers) == 2
    assert all(r.error is None or r.error.kind == "agent" for r in killers), killers
    assert retried == [] and env.stats.retries == 0
    assert all(r.lost_tries == [] for r in rollouts)
    assert group is not None and len(group.scores) == 4


async def test_evaluate_runs_through_the_same_retries(tmp_path: Path) -> None:
    broken = _BrokenStateDir(tmp_path)
    with ScriptedOpenAIServer(default=solver()) as server:
        env = env_for(server, sandbox=broken.config)
        env.on_retry(broken.repair)
        try:
            (sample,) = await env.evaluate()
        finally:
            await env.close()
    assert (sample.name, sample.category) == ("answer", "terminal-test")
    assert sample.rollout.reward == 1.0 and sample.rollout.error is None
    assert [e.kind for e in sample.rollout.lost_tries] == ["infra"]
    # The run directory says so as clotho eval's does: one line, its lost try on it.
    metrics = await write_evaluation([sample], tmp_path / "run", agent="env:terminal_test")
    (record,) = RunStore(tmp_path / "run").load_records()
    assert record.passed and [e.kind for e in record.lost_tries] == ["infra"]
    assert metrics.n_passed == 1 and metrics.errors == {}


@pytest.mark.parametrize("env_cls", [TerminalTestEnv, TerminalTasksEnv, SweEnv, EndlessEnv])
def test_evaluate_is_written_once(env_cls: type[Environment[Any]]) -> None:
    """Every environment gives its evaluation set; the base class runs it."""
    assert "evaluate" not in vars(env_cls)
    assert "evaluation_items" in vars(env_cls)


async def test_eval_and_training_build_the_same_agent() -> None:
    model = ModelConfig(model="m", base_url="http://127.0.0.1:9/v1")
    eval_agent, client = await build_agent(EvalConfig(paths=["x"], model=model, max_turns=7))
    assert client is not None
    env = TerminalTestEnv(EnvConfig(model=model, max_turns=7), model=client)
    try:
        train_agent = env.agent(env.resolve_tools())
        assert isinstance(eval_agent, LLMAgent) and isinstance(train_agent, LLMAgent)
        assert eval_agent.limits == train_agent.limits
        assert eval_agent.system_prompt == train_agent.system_prompt == DEFAULT_SYSTEM_PROMPT
        assert [t.name for t in eval_agent.tools] == [t.name for t in train_agent.tools]
        configured = TerminalTestEnv(
            EnvConfig(system_prompt="be brief", time_limit_s=5, max_total_tokens=100),
            model=ChatClient(model),
        )
        custom = configured.agent([])
        assert custom.system_prompt == "be brief"
        assert (custom.limits.time_limit_s, custom.limits.max_total_tokens) == (5, 100)
        await configured.close()
    finally:
        await env.close()


class _PrepareSpy:
    """Wraps a real pool's `prepare` (the preparations themselves are real) to see how many
    run at once: each waits until `cap` are in flight, so a setup that prepares one after
    another never gets past its first (the wait's bound fails the test)."""

    def __init__(self, pool: SlotPool, cap: int) -> None:
        self.real = pool.prepare
        self.cap = cap
        self.in_flight = 0
        self.peak = 0
        self.events: list[str] = []
        self.full = asyncio.Event()

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.events.append("start")
        if self.in_flight >= self.cap:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), timeout=60)
            return await self.real(*args, **kwargs)
        finally:
            self.in_flight -= 1
            self.events.append("end")


async def test_setup_prepares_task_environments_concurrently_within_the_cap(
    make_task: TaskFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c", "d", "e"):
        make_task(name)
    config = TerminalTasksConfig(tasks=[str(tmp_path / "tasks")], prepare_concurrency=2)
    pool = SlotPool(config.pool)
    spy = _PrepareSpy(pool, cap=2)
    monkeypatch.setattr(pool, "prepare", spy)
    env = TerminalTasksEnv(config, model=ChatClient(ModelConfig(model="m")), pool=pool)
    try:
        await env.setup()
    finally:
        await env.close()
    assert spy.events[:2] == ["start", "start"], "two preparations run side by side"
    assert spy.peak == 2, "never more than prepare_concurrency at once"
    assert spy.events.count("end") == 5
    assert sorted(p.name for p in env._prepared) == ["a", "b", "c", "d", "e"]


async def test_a_failed_preparation_stops_setup_as_itself(
    make_task: TaskFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task whose environment cannot be prepared ends the setup with that task's own
    error (a one-line message), not an exception group. The failing build is a test double
    (`prepare` raises the backend's `TaskError` for the task named bad); the others are real."""
    from clotho.errors import TaskError

    make_task("good")
    make_task("bad")
    config = TerminalTasksConfig(tasks=[str(tmp_path / "tasks")])
    pool = SlotPool(config.pool)
    real = pool.prepare

    async def prepare(base: Any, spec: Any, **kwargs: Any) -> Any:
        if spec.name == "bad":
            raise TaskError("bad: the image cannot be built")
        return await real(base, spec, **kwargs)

    monkeypatch.setattr(pool, "prepare", prepare)
    env = TerminalTasksEnv(config, model=ChatClient(ModelConfig(model="m")), pool=pool)
    try:
        with pytest.raises(TaskError, match="bad: the image cannot be built"):
            await env.setup()
    finally:
        await env.close()
