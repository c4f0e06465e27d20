"""What an agent run produced: the conversation, why it stopped, errors, usage and timings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.chat.ledger import TokenSequence
from clotho.chat.types import Usage
from clotho.gateway.record import GatewayRecord

# "interrupted": the rollout ended the agent from outside (its wall clock, a sandbox limit, a
# sandbox the agent broke); what it did until then is kept, for training on the failure.
StopReason = Literal[
    "finished", "max_turns", "time_limit", "token_limit", "model_error", "interrupted"
]


class ToolErrorRecord(BaseModel):
    turn: int = Field(description="1-based turn of the call")
    tool: str
    arguments: str = Field(description="raw arguments, cut at 500 characters")
    error: str = Field(description="what the model was told")


class TurnTiming(BaseModel):
    model_s: float = 0.0
    tools_s: float = 0.0


class InstalledAgentTrace(BaseModel):
    """An installed (third-party) agent's run: its messages are what the gateway saw, so the
    gateway's full record and the agent's own log and trajectory are kept beside them."""

    agent: str
    version: str
    gateway: GatewayRecord = Field(description="every model call, as sent and received")
    exit_code: int
    timed_out: bool = False
    output: str = Field("", description="the tails of the agent command's stdout and stderr")
    trajectory: str | None = Field(None, description="the agent's own trajectory file, if any")
    exposure: Literal["bind", "upload"] = Field(
        "upload", description="how its install reached the sandbox: a read-only bind, a copy"
    )
    prepare_s: float = Field(0.0, description="python probe, install (cached), exposure")
    agent_s: float = 0.0


class AgentResult(BaseModel):
    messages: list[dict[str, Any]]
    turns: int = 0
    stop_reason: StopReason = "finished"
    reasoning: list[str | None] = Field(default_factory=list, description="one entry per turn")
    tool_calls: int = 0
    tool_errors: list[ToolErrorRecord] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    timings: list[TurnTiming] = Field(default_factory=list)
    duration_s: float = 0.0
    error: str | None = Field(None, description="the model error that stopped the run, if any")
    sequences: list[TokenSequence] | None = Field(
        None, description="token backends only: the exact training sequences (ids, masks, logprobs)"
    )
    installed: InstalledAgentTrace | None = Field(
        None, description="installed agents only: the gateway's record and the agent's own files"
    )
