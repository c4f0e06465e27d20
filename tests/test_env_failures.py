"""Training reads an outcome as eval does: a rollout the agent failed (it broke its sandbox, hit
a limit, crashed the reward code) stays in its group with the failure score and its tokens;
only failures that say nothing about the policy (infra) leave it. A policy cannot make its
failures vanish from training by failing loudly."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.test_env import ANSWERS, env_for

from clotho.sandbox import LocalSandboxConfig

pytestmark = requires_bwrap

# What a policy about to fail does instead of answering, and the kind it must be charged with.
FAILING_MOVES = {
    "kills its whole sandbox": ("kill -9 -1", "agent"),
    "exhausts its memory": (
        "python3 -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * len(b[::4096])'",
        "limit",
    ),
}


def sometimes_fails(move: str) -> Any:
    """A scripted policy (a named test double for a model): per task, its odd rollouts answer
    right, its even ones make `move` instead, and every rollout stops after its one call."""
    calls: dict[str, int] = {}

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if messages[-1]["role"] != "user":
            return assistant("done")
        task = messages[-1]["content"]
        calls[task] = calls.get(task, 0) + 1
        if calls[task] % 2 == 0:
            return assistant("", [tool_call("terminal", {"command": move})])
        path = re.search(r"/app/\w+\.txt", task).group(0)  # type: ignore[union-attr]
        content = ANSWERS.get(path.rsplit("/", 1)[1], "42")
        return assistant("", [tool_call("write_file", {"path": path, "content": content})])

    return reply


@pytest.mark.parametrize("failure_score", [0.0, -0.5])
@pytest.mark.parametrize("move", list(FAILING_MOVES))
async def test_a_failure_the_agent_caused_stays_in_its_group(
    move: str, failure_score: float
) -> None:
    command, kind = FAILING_MOVES[move]
    with ScriptedOpenAIServer(default=sometimes_fails(command)) as server:
        env = env_for(
            server,
            group_size=4,
            failure_score=failure_score,
            distribution="both",
            sandbox=LocalSandboxConfig(memory_mb=256),
        )
        env.registry.add_distribution(_both())
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    failed = [r for r in rollouts if r.error is not None]
    assert [r.error.kind for r in failed] == [kind, kind], [r.error for r in failed]  # type: ignore[union-attr]
    assert all(r.error.scored for r in failed)  # type: ignore[union-attr]  # eval: a failure
    assert group is not None, env.stats
    assert sorted(group.scores) == sorted([failure_score, failure_score, 1.0, 1.0])
    # The failures are in the group with what the agent did: its call is in the transcript.
    assert group.messages is not None and len(group.messages) == 4
    calls = [json_calls(m) for m in group.messages]
    assert sum(command in c for c in calls) == 2
    for r in failed:  # cut short in the agent phase, or broken for the verifier: both kept
        assert r.agent is not None and command in json_calls(r.agent.messages)
    assert env.stats.errors == {kind: 2} and env.stats.failures_scored == 2
    assert env.stats.dropped_too_few_valid == 0


def _both() -> Any:
    from clotho.tools.registry import ToolsetDistribution

    return ToolsetDistribution(name="both", probabilities={"terminal": 1.0, "file": 1.0})


def json_calls(messages: list[dict[str, Any]]) -> list[str]:
    """The commands of the terminal calls in `messages`."""
    return [
        json.loads(call["function"]["arguments"]).get("command", "")
        for m in messages
        for call in m.get("tool_calls") or []
    ]
