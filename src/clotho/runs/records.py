"""Files of a run directory, each a versioned pydantic model.

DIR/config.json      EvalConfig (resolved)
DIR/results.jsonl    one TrialRecord per finished attempt, flushed as it ends
DIR/metrics.json     RunMetrics
DIR/trials/*.json    TrialDetail: the full conversation and verifier output
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clotho.agent.result import AgentResult
from clotho.chat.client import ModelConfig
from clotho.errors import ErrorInfo
from clotho.rollout import PhaseTimings, RolloutOutcome, VerifierOutcome
from clotho.sandbox import LocalSandboxConfig, SandboxConfig
from clotho.swe.instance import SweOptions
from clotho.tools.builtin import ToolsConfig


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    paths: list[str]
    agent: str = Field(
        "llm", description="llm, oracle, nop, or an installed agent's name (mini-swe-agent, ...)"
    )
    model: ModelConfig | None = Field(
        None, description="None: the embedded local model (SmolLM2-135M-Instruct, extra `local`)"
    )
    sandbox: SandboxConfig = Field(default_factory=LocalSandboxConfig)
    concurrency: int = Field(4, ge=1)
    attempts: int = Field(1, ge=1)
    task_timeout_s: float | None = Field(None, gt=0, description="agent + verification")
    max_turns: int = Field(30, ge=1)
    filter: list[str] = Field(default_factory=list)
    skip: list[str] = Field(default_factory=list)
    default_skips: bool | str = Field(
        True,
        description="also skip the tasks known not to run on this run's backend: true, the "
        "bundled list (clotho/runs/default_skips.toml); a path, a TOML file of that form",
    )
    system_prompt: str | None = Field(
        None,
        description="the model agent's system prompt ({workdir} is filled in); None: the default",
    )
    verifier_timeout_s: float | None = Field(
        None, gt=0, description="every task's verifier time limit, instead of the task's own"
    )
    command_timeout_s: float | None = Field(
        None,
        gt=0,
        description="the time limit of each command the agent runs (its default and its cap)",
    )
    pass_threshold: float = 1.0
    force_build: bool = Field(False, description="rebuild task images even if cached")
    prewarm: bool = Field(True, description="start upcoming trials' sandboxes ahead of time")
    retries: int = Field(
        2,
        ge=0,
        description="an attempt that failed with an infra error (a lost node, a broken "
        "sandbox backend) runs again within the run, up to this many times",
    )
    retry_budget: int | None = Field(
        None,
        ge=0,
        description="retries in the whole run; None: the larger of twice the concurrency and "
        "a quarter of the attempts to run (past it, infra failures wait for --resume)",
    )
    toolsets: list[str] = Field(default_factory=lambda: ["terminal", "file"])
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig,
        description="the web provider and the vision model of the web and vision toolsets",
    )
    swe: SweOptions = Field(
        default_factory=SweOptions, description="SWE instance files: repositories, reward, caches"
    )

    @field_validator("agent")
    @classmethod
    def _known_agent(cls, value: str) -> str:
        from clotho.rollout.agents import agent_kinds

        known = agent_kinds()
        if value not in known:
            raise ValueError(f"unknown agent {value!r}; known: {', '.join(known)}")
        return value


class TrialRecord(BaseModel):
    """One line of results.jsonl."""

    schema_version: Literal[1] = 1
    task: str
    category: str
    attempt: int
    reward: float | None
    rewards: dict[str, float] = Field(default_factory=dict)
    passed: bool
    error: ErrorInfo | None = None
    stop_reason: str | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    duration_s: float = 0.0
    agent: str
    timings: PhaseTimings = Field(default_factory=PhaseTimings)
    detail: str | None = Field(None, description="path of the TrialDetail file, relative to DIR")
    lost_tries: list[ErrorInfo] = Field(
        default_factory=list,
        description="errors of earlier tries of this attempt, retried within the run",
    )
    finished_at: float = 0.0

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.attempt)

    @property
    def scored(self) -> bool:
        """Counted in the pass rate: no error, or one that says something about the agent."""
        return self.error is None or self.error.scored

    @property
    def score(self) -> float | None:
        """The reward the mean reward counts, read as training reads an outcome
        (`RolloutOutcome.training_score`): the verifier's reward, 0 for a scored failure
        (tamper, agent, limit, verifier); None for an attempt left out (infra, task, config)."""
        if not self.scored:
            return None
        if self.error is None and self.reward is not None:
            return self.reward
        return 0.0

    @classmethod
    def from_outcome(
        cls, outcome: RolloutOutcome, *, task: str, category: str, attempt: int, agent: str
    ) -> TrialRecord:
        result = outcome.agent
        return cls(
            task=task,
            category=category,
            attempt=attempt,
            reward=outcome.reward,
            rewards=outcome.rewards,
            passed=outcome.passed,
            error=outcome.error,
            stop_reason=result.stop_reason if result else None,
            turns=result.turns if result else 0,
            tool_calls=result.tool_calls if result else 0,
            tool_errors=len(result.tool_errors) if result else 0,
            duration_s=round(outcome.duration_s, 3),
            timings=outcome.timings.model_copy(
                update={k: round(v, 4) for k, v in outcome.timings.model_dump().items()}
            ),
            agent=agent,
            finished_at=time.time(),
        )


class TrialDetail(BaseModel):
    schema_version: Literal[1] = 1
    record: TrialRecord
    agent_result: AgentResult | None = None
    verifier: VerifierOutcome | None = None

    @classmethod
    def of(cls, record: TrialRecord, outcome: RolloutOutcome | None = None) -> TrialDetail:
        if outcome is None:
            return cls(record=record)
        return cls(record=record, agent_result=outcome.agent, verifier=outcome.verifier)


class CategoryMetrics(BaseModel):
    pass_rate: float | None
    n: int
    n_passed: int


class TimingStats(BaseModel):
    total_s: float
    p50_s: float
    p95_s: float


class RunMetrics(BaseModel):
    schema_version: Literal[1] = 1
    pass_rate: float | None = Field(
        description="passed / scored attempts (infra and task errors excluded)"
    )
    pass_rate_ci95: tuple[float, float] | None = None
    mean_reward: float | None = Field(
        None,
        description="mean of `TrialRecord.score` over the scored attempts (the pass rate's "
        "denominator): a scored failure counts as 0, infra/task/config errors are left out",
    )
    mean_reward_n: int | None = Field(
        None,
        description="attempts the mean reward averages (n_scored); None in metrics written "
        "before it was recorded, whose mean left scored failures out: read them again",
    )
    n_tasks: int
    n_attempts: int
    n_scored: int
    n_passed: int
    by_category: dict[str, CategoryMetrics]
    errors: dict[str, int]
    pass_at_k: dict[str, float] | None = None
    duration_s: float | None = None
    timings: dict[str, TimingStats] = Field(
        default_factory=dict, description="per phase (acquire_s, agent_s, ...) over attempts"
    )
    complete: bool | None = Field(
        None,
        description="True: every planned attempt ran; False: the run was stopped (Ctrl-C, a "
        "signal, a crash) and `clotho eval --resume` completes it; None: written before this "
        "was recorded (read as finished, as it was then)",
    )
    n_planned: int | None = Field(
        None, description="attempts the run has in all (tasks x attempts); None: not recorded"
    )
    n_finished: int | None = Field(
        None, description="of `n_planned`, the attempts with a result; None: not recorded"
    )
    extra: dict[str, Any] = Field(default_factory=dict)
