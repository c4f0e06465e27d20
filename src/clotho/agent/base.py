"""The agent interface shared by the model agent and the reference agents."""

from __future__ import annotations

from dataclasses import dataclass
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


class Agent(Protocol):
    name: str

    async def run(self, ctx: AgentContext) -> AgentResult: ...
