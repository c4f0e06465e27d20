"""mini-swe-agent, the real package (pinned, installed once from the package registry into
~/.cache/clotho), run headless in a real local sandbox on a bundled task, its model calls
through the gateway to `ScriptedOpenAIServer`, the TEST DOUBLE of a hosted model. Led through
the task's own solution it earns reward 1; told nothing useful it earns 0. The trial keeps the
gateway's record and the agent's own trajectory."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

from clotho.errors import ConfigError, TaskError
from clotho.gateway import GatewayLimits
from clotho.installed_agents import InstalledAgentRunner, agent_names, installed_agent
from clotho.installed_agents.base import AGENT_LOGS, sandbox_python
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial

pytestmark = [pytest.mark.bwrap, requires_bwrap]
pytest_plugins = ("tests.gateway_fixtures",)  # gateway_for

TASK = Path(__file__).parents[1] / "examples" / "tasks" / "fix-roman-numerals"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _bash(command: str) -> dict[str, Any]:
    return assistant("", [tool_call("bash", {"command": command})])


def solving(body: dict[str, Any]) -> dict[str, Any]:
    """Scripted policy: run the task's reference solution (a bash script; mini runs each
    command with sh) until a run of it succeeds (mini cuts a command at 30 s, which a loaded
    machine can reach), then submit."""
    last = body["messages"][-1]
    if last.get("role") == "tool" and '"returncode": 0' in str(last.get("content")):
        return _bash(SUBMIT)
    return _bash("bash -c " + shlex.quote((TASK / "solution" / "solve.sh").read_text()))


def _observed(run: Any) -> list[str]:
    """What the agent saw of its commands (for a failure's message)."""
    if run.trajectory is None:
        return [run.output[-3000:]]
    messages = json.loads(run.trajectory).get("messages", [])
    return [str(m.get("content"))[-1000:] for m in messages if m.get("role") == "tool"]


def giving_up(body: dict[str, Any]) -> dict[str, Any]:
    """Scripted policy: look around once, then submit without changing anything."""
    if not any(m.get("role") == "tool" for m in body["messages"]):
        return _bash("ls /app")
    return _bash(SUBMIT)


async def _attempt(
    policy: Callable[[dict[str, Any]], dict[str, Any]],
    gateway_for: Any,
    max_turns: int = 10,
    config: SandboxConfig | None = None,
) -> tuple[Any, InstalledAgentRunner, ScriptedOpenAIServer]:
    """mini-swe-agent on the bundled task (in a local sandbox unless `config` says), its
    model `policy` behind a gateway allowing `max_turns` calls."""
    with ScriptedOpenAIServer(default=policy) as server:
        runner = InstalledAgentRunner(
            installed_agent("mini-swe-agent"),
            gateway_for(server),
            GatewayLimits(max_turns=max_turns),
        )
        async with SlotPool() as pool:
            outcome = await run_trial(HarborTrial(load_task(TASK)), runner,
                                      config or LocalSandboxConfig(), pool)  # fmt: skip
    return outcome, runner, server


async def test_mini_swe_agent_led_to_the_solution_passes(gateway_for: Any) -> None:
    outcome, runner, server = await _attempt(solving, gateway_for)
    [run] = runner.runs
    assert outcome.error is None, (outcome.error, run.output)
    assert (outcome.reward, outcome.passed) == (1.0, True), (outcome.verifier, _observed(run))
    record = run.record
    # The solution, then the submission (each model call forwarded and recorded).
    assert record.turns == len(server.requests) >= 2
    first = record.exchanges[0]
    assert first.api == "openai-chat" and first.status == 200
    sent = json.dumps(first.request["messages"])
    assert "Fix the Roman numeral converter" in sent  # the task's instruction, via mini's prompt
    assert first.request["tools"][0]["function"]["name"] == "bash"
    assert first.response is not None
    solution_call = first.response["choices"][0]["message"]["tool_calls"][0]
    # The second request carries what the agent saw of the first call's result.
    answered = record.exchanges[1].request["messages"]
    assert any(m.get("tool_call_id") == solution_call["id"] for m in answered)
    # The agent's own trajectory, read from the sandbox before it closed.
    assert run.trajectory is not None
    trajectory = json.loads(run.trajectory)
    assert trajectory["info"]["exit_status"] == "Submitted"
    # The trial's messages are the last conversation the model saw, and its reply.
    assert outcome.agent is not None
    assert outcome.agent.turns == record.turns and outcome.agent.stop_reason == "finished"
    assert outcome.agent.messages[-1]["tool_calls"][0]["function"]["arguments"] == json.dumps(
        {"command": SUBMIT}
    )


async def test_mini_swe_agent_that_does_not_solve_fails(gateway_for: Any) -> None:
    outcome, runner, server = await _attempt(giving_up, gateway_for)
    [run] = runner.runs
    assert outcome.error is None, (outcome.error, run.output)
    assert (outcome.reward, outcome.passed) == (0.0, False)
    assert run.record.turns == len(server.requests) == 2
    assert run.trajectory is not None and AGENT_LOGS  # it ran to its own end


async def test_the_model_budget_ends_the_agent(gateway_for: Any) -> None:
    """A turn limit of 1: the second call is refused by the gateway, the agent stops, the
    attempt is the agent's failure (reward 0, stop reason max_turns), never an infra error."""
    outcome, runner, server = await _attempt(giving_up, gateway_for, max_turns=1)
    [run] = runner.runs
    assert len(server.requests) == 1
    assert run.record.limit == "turns"
    assert outcome.reward == 0.0 and outcome.agent is not None
    assert outcome.agent.stop_reason == "max_turns"
    assert outcome.error is None or outcome.error.kind not in ("infra", "task", "config")


def test_adapters_are_registered_by_name() -> None:
    assert "mini-swe-agent" in agent_names()
    with pytest.raises(ConfigError, match="unknown installed agent 'nope'"):
        installed_agent("nope")


async def test_an_image_without_python3_is_a_task_error(tmp_path: Path) -> None:
    async with await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path))) as sandbox:
        await sandbox.exec("mkdir -p /tmp/bare && export PATH=/tmp/bare")
        with pytest.raises(TaskError, match=r"mini-swe-agent agent needs python3 >= 3\.10"):
            await sandbox_python(sandbox, "mini-swe-agent", (3, 10))


async def test_an_install_is_made_once_and_only_used_when_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cached install is found by its stamp; a folder left half-made (no stamp) is made
    again, never used. pip here is a stand-in that writes one package (no registry)."""
    from clotho.installed_agents import base

    calls: list[list[str]] = []

    async def fake_pip(agent: str, tool: str, argv: list[str], cwd: Path | None = None) -> None:
        assert tool == "pip"
        calls.append(argv)
        site = Path(argv[argv.index("--target") + 1])
        (site / "pkg-1.0.dist-info").mkdir(parents=True, exist_ok=True)
        (site / "pkg.py").write_text("X = 1\n")

    monkeypatch.setattr(base, "run_installer", fake_pip)
    first = await base.pip_install("demo", "1.0", ["pkg==1.0"], python="3.11", cache_dir=tmp_path)
    assert first.root == tmp_path / "agents" / "demo-1.0-py3.11"
    assert first.stamp.installed == ["pkg==1.0"] and first.stamp.bytes == 6
    assert "--only-binary=:all:" in calls[0] and "3.11" in calls[0]
    again = await base.pip_install("demo", "1.0", ["pkg==1.0"], python="3.11", cache_dir=tmp_path)
    assert again.stamp == first.stamp and len(calls) == 1

    (first.root / "install.json").unlink()  # as if the install had stopped half-way
    remade = await base.pip_install("demo", "1.0", ["pkg==1.0"], python="3.11", cache_dir=tmp_path)
    assert len(calls) == 2 and (remade.root / "install.json").is_file()


@requires_docker
async def test_mini_swe_agent_solves_on_docker_too(gateway_for: Any) -> None:
    """The same attempt in a container: the gateway's socket in its FIFO folder, the install
    uploaded into the container, the task's own image."""
    outcome, runner, server = await _attempt(solving, gateway_for, config=DockerSandboxConfig())
    [run] = runner.runs
    assert outcome.error is None, (outcome.error, run.output)
    assert (outcome.reward, outcome.passed) == (1.0, True), (outcome.verifier, _observed(run))
    assert run.record.turns == len(server.requests) >= 2
    assert run.trajectory is not None
    assert json.loads(run.trajectory)["info"]["exit_status"] == "Submitted"
