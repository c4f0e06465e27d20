"""What the gateway keeps of a trial: every call exactly as the agent sent and received it.

A third-party agent keeps its own conversation; the only faithful copy of what the model saw
and said is the traffic. Each `GatewayExchange` holds the request body as the agent sent it
(parsed JSON), the messages and tools forwarded to the run's model (OpenAI form), the parsed
turn, and the reply as the agent received it (a streamed reply is stored as the one object its
events were rendered from: `wire.py` renders the events from it, nothing else).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.chat.ledger import TokenSequence
from clotho.chat.types import ModelTurn, Usage

GatewayApi = Literal["openai-chat", "openai-responses", "anthropic-messages"]
# Which trial budget ended the agent's model access (None: none did).
LimitName = Literal["turns", "tokens", "wall_clock", "context"]


class GatewayLimits(BaseModel):
    """A trial's model budget, enforced by the gateway: a call past it is refused (HTTP 401:
    the token is spent; a message naming the limit), never forwarded."""

    max_turns: int | None = Field(None, gt=0, description="model calls the agent may make")
    max_tokens: int | None = Field(
        None, gt=0, description="total tokens (prompt + completion) over the trial"
    )
    timeout_s: float | None = Field(
        None, gt=0, description="wall clock from the trial's start; a call in flight is cut"
    )
    max_request_bytes: int = Field(
        16 << 20, ge=1024, description="largest request body; more is a 413, never read whole"
    )


class ExchangeError(BaseModel):
    """Why a call got no model reply. `kind` follows clotho's errors: `limit` (a budget above),
    `agent` (a request the gateway cannot serve), `infra` (the model endpoint failed: never
    the agent's fault)."""

    kind: Literal["limit", "agent", "infra"]
    message: str
    limit: LimitName | None = None


class GatewayExchange(BaseModel):
    index: int = Field(description="0-based, in the order the calls arrived")
    api: GatewayApi
    path: str
    stream: bool = False
    started_s: float = Field(description="seconds from the trial's start")
    latency_s: float = 0.0
    status: int
    request: Any = Field(description="the body as the agent sent it")
    forwarded: list[dict[str, Any]] | None = Field(
        None, description="the messages forwarded to the model (OpenAI form)"
    )
    tools: list[dict[str, Any]] | None = None
    turn: ModelTurn | None = None
    response: dict[str, Any] | None = Field(
        None, description="the reply as the agent received it (a stream: its single object)"
    )
    error: ExchangeError | None = None


class GatewayRecord(BaseModel):
    """A trial's traffic through the gateway: what `trial.record` holds, stored with the trial."""

    schema_version: Literal[1] = 1
    model: str = Field(description="the run's model the calls were forwarded to")
    exchanges: list[GatewayExchange] = Field(default_factory=list)
    turns: int = Field(0, description="calls forwarded to the model")
    usage: Usage = Field(default_factory=Usage)
    limit: LimitName | None = Field(None, description="the first budget the agent ran out of")
    infra_errors: int = Field(0, description="calls the model endpoint failed (not the agent's)")
    sequences: list[TokenSequence] | None = Field(
        None, description="token APIs: the exact training sequences of the last conversation"
    )
