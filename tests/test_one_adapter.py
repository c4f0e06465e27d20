"""Training sees what evaluation sees: a Harbor task run through an environment (`process`,
`serve`) is the very attempt `clotho eval` makes: the task's agent time limit and wall clock,
its tamper-checked verifier, the same verdicts and error kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import TaskFactory, requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

from clotho.agent.llm import LLMAgent
from clotho.agent.loop import AgentLimits
from clotho.chat.client import ChatClient, ModelConfig
from clotho.envs.terminal_tasks import TerminalTasksConfig, TerminalTasksEnv
from clotho.rollout import RolloutOutcome
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial
from clotho.tools.builtin import default_registry

pytestmark = requires_bwrap


def policy(body: dict[str, Any]) -> dict[str, Any]:
    """A scripted model (a named test double): the right answer, or a command that hangs."""
    task = body["messages"][-1]["content"] if body["messages"][-1]["role"] == "user" else ""
    if body["messages"][-1]["role"] != "user":
        return assistant("done")
    if "hang" in task:
        return assistant("", [tool_call("terminal", {"command": "sleep 600"})])
    return assistant("", [tool_call("terminal", {"command": "echo ok > /app/done.txt"})])


def model(server: ScriptedOpenAIServer) -> ModelConfig:
    return ModelConfig(model="m", base_url=server.base_url, max_retries=0)


async def through_eval(server: ScriptedOpenAIServer, task_dir: Path) -> RolloutOutcome:
    tools = default_registry().resolve(["terminal"])
    agent = LLMAgent(ChatClient(model(server)), tools, AgentLimits(max_turns=4))
    async with SlotPool() as pool:
        return await run_trial(HarborTrial(load_task(task_dir)), agent, LocalSandboxConfig(), pool)


async def through_training(server: ScriptedOpenAIServer, task_dir: Path) -> RolloutOutcome:
    config = TerminalTasksConfig(
        tasks=[str(task_dir.parent)], group_size=1, max_turns=4, toolsets=["terminal"],
        model=model(server), min_valid_rollouts=1,
    )  # fmt: skip
    env = TerminalTasksEnv(config)
    try:
        await env.setup()
        _, (rollout,) = await env.collect_group(await env.get_next_item())
    finally:
        await env.close()
    return rollout


def verdict(outcome: RolloutOutcome) -> tuple[Any, ...]:
    stop = outcome.agent.stop_reason if outcome.agent is not None else None
    kind = outcome.error.kind if outcome.error is not None else None
    return outcome.reward, outcome.passed, kind, stop


async def test_a_solved_task_passes_on_both_paths(make_task: TaskFactory, tmp_path: Path) -> None:
    task_dir = make_task("solve", instruction="Write ok into /app/done.txt.")
    with ScriptedOpenAIServer(default=policy) as server:
        evaluated = await through_eval(server, task_dir)
        trained = await through_training(server, task_dir)
    assert verdict(evaluated) == verdict(trained) == (1.0, True, None, "finished")


async def test_the_tasks_agent_time_limit_holds_on_both_paths(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    """Before, the training path ignored `[agent] timeout_sec`: the rollout ran the command
    for as long as the terminal tool's own 180 s default."""
    # The task gives its agent 3 s; the scripted policy runs a command that takes 10 min.
    task_dir = make_task("slow", instruction="hang, then write ok.")
    toml = task_dir / "task.toml"
    toml.write_text(
        toml.read_text().replace("[agent]\ntimeout_sec = 60.0", "[agent]\ntimeout_sec = 3.0")
    )
    assert load_task(task_dir).config.agent.timeout_sec == 3.0
    with ScriptedOpenAIServer(default=policy) as server:
        evaluated = await through_eval(server, task_dir)
        trained = await through_training(server, task_dir)
    assert verdict(evaluated) == verdict(trained) == (0.0, False, None, "time_limit")
