"""What one rollout produced: reward or typed error, the agent's run, the verifier's record."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.agent.result import AgentResult
from clotho.errors import ErrorInfo

Phase = Literal["acquire", "setup", "agent", "verify", "done"]


class VerifierOutcome(BaseModel):
    """The verdict of a rollout: the reward and, for a test script, what it printed."""

    reward: float
    rewards: dict[str, float] = Field(default_factory=dict)
    exit_code: int | None = Field(None, description="the test script's; None for reward code")
    output: str = Field("", description="tail of the test script's output")
    duration_s: float = 0.0


class PhaseTimings(BaseModel):
    """Seconds spent in each phase of one attempt: where the time goes."""

    acquire_s: float = 0.0
    setup_s: float = 0.0
    agent_s: float = 0.0
    model_s: float = Field(0.0, description="the agent's time waiting for the model")
    tools_s: float = Field(0.0, description="the agent's time running tools")
    verify_s: float = 0.0
    release_s: float = 0.0


class RolloutOutcome(BaseModel):
    """One attempt, scored or failed with the kind of failure. `phase` is where it ended."""

    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    passed: bool = False
    error: ErrorInfo | None = None
    agent: AgentResult | None = None
    verifier: VerifierOutcome | None = None
    phase: Phase = "acquire"
    duration_s: float = 0.0
    timings: PhaseTimings = Field(default_factory=PhaseTimings)
    lost_tries: list[ErrorInfo] = Field(
        default_factory=list, description="infra errors of earlier tries, retried in the run"
    )

    @classmethod
    def failed(cls, exc: BaseException, what: str) -> RolloutOutcome:
        """An attempt that could not start (its environment could not be prepared)."""
        error = ErrorInfo.of(exc)
        return cls(error=error.model_copy(update={"message": f"{what}: {error.message}"}))

    @property
    def valid(self) -> bool:
        """Scored by its verifier, with no error: usable as training data."""
        return self.error is None and self.reward is not None

    @property
    def trainable(self) -> bool:
        """Whether training sees this attempt: scored by its verifier, or a failure the agent
        caused (the same kinds that count as failures in an eval's pass rate). Infra, task and
        config errors say nothing about the policy: left out (and retried where safe)."""
        return self.valid or (self.error is not None and self.error.scored)

    def training_score(self, failure_score: float = 0.0) -> float:
        """The verifier's reward, or `failure_score` for a failure the agent caused."""
        if self.valid:
            return float(self.reward or 0.0)
        if self.trainable:
            return failure_score
        raise ValueError(f"an attempt that failed with {self.error} has no training score")

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.agent.messages if self.agent is not None else []
