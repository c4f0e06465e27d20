"""The configuration of an RL environment: one pydantic model, loadable from YAML."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from clotho.chat.client import ModelConfig
from clotho.sandbox import LocalSandboxConfig, SandboxConfig
from clotho.sandbox.pool import PoolConfig
from clotho.tools.builtin import ToolsConfig


class EnvConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    group_size: int = Field(4, ge=1, description="rollouts per item")
    toolsets: list[str] | None = Field(
        default_factory=lambda: ["terminal", "file"], description="None: every toolset"
    )
    disabled_toolsets: list[str] = Field(default_factory=list)
    distribution: str | None = Field(None, description="toolset distribution, sampled per group")
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig,
        description="the web provider and the vision model of the web and vision toolsets",
    )
    max_turns: int = Field(30, ge=1)
    time_limit_s: float | None = Field(None, gt=0, description="per rollout, agent only")
    max_total_tokens: int | None = Field(None, gt=0)
    system_prompt: str | None = None
    model: ModelConfig | None = None
    sandbox: SandboxConfig = Field(default_factory=LocalSandboxConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    min_valid_rollouts: int = Field(
        2,
        ge=1,
        description="groups with fewer trainable rollouts (scored, or failed by the agent's "
        "doing) are dropped",
    )
    rollout_timeout_s: float | None = Field(
        3600.0,
        gt=0,
        description="wall clock of a whole rollout (sandbox, agent, verification) for "
        "environments with their own hooks; task formats use their task's limits, as eval "
        "does; reaching it is the agent's failure",
    )
    retries: int = Field(
        2,
        ge=0,
        description="a rollout that failed with an infra error (a lost node, a broken sandbox "
        "backend, a model outage) runs again, up to this many times, as clotho eval's attempts "
        "do; the agent's, the task's and the verifier's failures never do",
    )
    prepare_concurrency: int = Field(
        4, ge=1, description="task environments (images, limits) prepared at once in setup"
    )
    failure_score: float = Field(
        0.0,
        allow_inf_nan=False,
        description="the training score of a rollout the agent failed (agent, limit, tamper or "
        "verifier error): it stays in its group, as it counts as a failure in eval",
    )
    ensure_scores_are_not_same: bool = Field(
        False, description="drop groups whose rollouts all scored the same (no learning signal)"
    )
    tokenizer: str | None = Field(
        None, description="tokenizer folder or file with a chat template, for tokens and masks"
    )
    max_token_length: int | None = Field(None, gt=0)
    overlong: Literal["drop", "truncate"] = "drop"
    seed: int = 0
    eval_concurrency: int = Field(4, ge=1)
    # The serve lifecycle (Atropos' names).
    max_num_workers: int = Field(
        2,
        ge=1,
        description="groups in flight at once (each runs group_size rollouts); "
        "clotho serve --max-num-workers / --concurrency",
    )
    total_steps: int | None = Field(
        None, ge=1, description="serve stops once the trainer reaches this step; None: never"
    )
    steps_per_eval: int | None = Field(
        None, ge=0, description="serve runs evaluate() every this many trainer steps; 0/None: never"
    )
    # Weights & Biases' rollouts table (`--wandb`), Atropos' names.
    num_rollouts_per_group_for_logging: int = Field(
        -1, ge=-1, description="rollouts of each group in the W&B rollouts table; -1: all"
    )
    num_rollouts_to_keep: int = Field(
        256, ge=0, description="rows of the W&B rollouts table (the latest groups' rollouts)"
    )
