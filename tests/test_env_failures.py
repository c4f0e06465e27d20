"""Training reads an outcome as eval does: a rollout the agent failed (it broke its sandbox, hit
a limit, crashed the reward code) stays in its group with the failure score and its tokens;
only failures that say nothing about the policy (infra) leave it. A policy cannot make its
failures vanish from training by failing loudly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer
from tests.test_env import env_for, solver

from clotho.sandbox import LocalSandboxConfig

pytestmark = requires_bwrap

# What a policy about to fail does instead of answering, and the kind it must be charged with.
FAILING_MOVES = {
    "kills every process it can": ("kill -9 -1", {"agent"}),
    "exhausts its memory": (
        "python3 -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * len(b[::4096])'",
        {"limit"},
    ),
}


def sometimes_fails(move: str) -> Any:
    """A scripted policy (a named test double for a model): per task, its odd rollouts answer
    right, its even ones make `move` instead, and every rollout stops after its one call."""
    return solver(2, instead=move)


@pytest.mark.parametrize("failure_score", [0.0, -0.5])
@pytest.mark.parametrize("move", list(FAILING_MOVES))
async def test_a_failure_the_agent_caused_stays_in_its_group(
    move: str, failure_score: float
) -> None:
    command, kinds = FAILING_MOVES[move]
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
    assert group is not None, env.stats
    assert len(rollouts) == 4 and all(r.trainable for r in rollouts)
    # The policy's failing rollouts: charged with the kind, or (when the shell it killed was
    # restarted before the verifier ran) verified as the failures they are.
    failing = [r for r in rollouts if r.agent is not None and command in calls_of(r.agent.messages)]
    assert len(failing) == 2
    for r in failing:
        charged = r.error is not None and r.error.kind in kinds
        verified = (r.error, r.reward) == (None, 0.0) and "agent" in kinds
        assert charged or verified, r.error
        assert r.error is None or r.error.scored  # eval: a failure that counts
    expected = [1.0, 1.0] + [failure_score if r.error else 0.0 for r in failing]
    assert sorted(group.scores) == sorted(expected)
    # The failures are in the group with what the agent did: its call is in the transcript.
    assert group.messages is not None and len(group.messages) == 4
    assert sum(command in calls_of(m) for m in group.messages) == 2
    errors = sum(r.error is not None for r in failing)
    assert sum(env.stats.errors.values()) == env.stats.failures_scored == errors
    assert env.stats.dropped_too_few_valid == 0


def _both() -> Any:
    from clotho.tools.registry import ToolsetDistribution

    return ToolsetDistribution(name="both", probabilities={"terminal": 1.0, "file": 1.0})


def calls_of(messages: list[dict[str, Any]]) -> list[str]:
    """The commands of the terminal calls in `messages`."""
    return [
        json.loads(call["function"]["arguments"]).get("command", "")
        for m in messages
        for call in m.get("tool_calls") or []
    ]
