"""What an agent run produced: the conversation, why it stopped, errors, usage and timings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.chat.ledger import TokenSequence
from clotho.chat.types import Usage

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
