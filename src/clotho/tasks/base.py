"""What `clotho eval` and `clotho check` run: any task format that can say what sandbox it
needs and how one attempt at it goes (its workspace, instruction and verdict)."""

from __future__ import annotations

from typing import Protocol, TypedDict, Unpack

from clotho.agent.base import Agent
from clotho.rollout import RolloutSpec
from clotho.sandbox import EnvironmentSpec, PreparedEnvironment


class TrialOptions(TypedDict, total=False):
    """How one attempt runs, whatever the task format."""

    timeout_s: float | None  # wall clock of agent + verification (None: the task's default)
    labels: dict[str, str]  # put on the sandbox
    pass_threshold: float  # reward >= this passes (default 1.0)


class EvalTask(Protocol):
    """A Harbor task directory, a dataset row, a SWE instance: one thing to attempt."""

    @property
    def name(self) -> str: ...

    @property
    def category(self) -> str: ...

    def environment_spec(self) -> EnvironmentSpec:
        """What the task asks of its sandbox (image or build context, limits)."""
        ...

    def rollout(
        self, agent: Agent, prepared: PreparedEnvironment, **options: Unpack[TrialOptions]
    ) -> RolloutSpec:
        """One attempt of `agent` at the task, in the sandbox the backend prepared."""
        ...
