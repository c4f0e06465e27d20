"""OpenAI-format chat messages and tool calls, as clotho stores and sends them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "user", "assistant", "tool"]


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field("", description="the raw JSON text the model produced")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Role
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def to_api(self) -> dict[str, Any]:
        """The dict sent to an OpenAI-compatible endpoint."""
        data = self.model_dump(exclude_none=True)
        if self.role == "assistant" and "content" not in data:
            data["content"] = ""
        return data


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class ChatResponse(BaseModel):
    """One completion: the assistant message as returned (reasoning not yet split off)."""

    message: dict[str, Any]
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    latency_s: float = 0.0
