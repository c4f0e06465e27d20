"""The agent interface shared by the model agent and the reference agents."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from clotho.agent.result import AgentResult
from clotho.sandbox.base import Sandbox


@dataclass
class AgentContext:
    """Everything an agent may use for one attempt at one task."""

    instruction: str
    sandbox: Sandbox
    time_limit_s: float | None = None
    solution_dir: Path | None = None  # only the oracle looks at it
    solution_mount: str = "/solution"
    # The run so far, kept up to date by agents that can (the model agent): when the rollout
    # stops the agent early, this is what the agent did, scored as its failure in training.
    transcript: AgentResult = field(default_factory=lambda: AgentResult(messages=[]))


class Agent(Protocol):
    name: str

    async def run(self, ctx: AgentContext) -> AgentResult: ...
