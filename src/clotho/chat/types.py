"""One model turn, read once: what every model client returns to the agent loop.

Conversations stay OpenAI-format dicts (what is sent to endpoints and stored in results). What
a model call produced is read exactly once, by the client that received it (the chat client
from the endpoint's JSON, the token session from the sampled ids), into a `ModelTurn`: content
and reasoning apart, tool calls with their arguments as a dict (or the model's text and what
is wrong with it), calls the parser could not read, usage and latency. The loop consumes it
as is.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, model_validator


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


class ToolCall(BaseModel):
    """A call the model made: `arguments` as a dict, or `error` saying why there is none."""

    id: str | None = Field(None, description="the model's or server's id; the loop makes it unique")
    name: str
    arguments: dict[str, Any] | None = None
    text: str = Field(description="the arguments as JSON text, as stored in the conversation")
    error: str | None = Field(None, description="why the arguments are not a JSON object")

    @model_validator(mode="after")
    def _either_arguments_or_error(self) -> ToolCall:
        if (self.arguments is None) == (self.error is None):
            raise ValueError("a tool call has either arguments or an error, not both or neither")
        return self

    @classmethod
    def from_arguments(cls, call_id: str | None, name: str, arguments: Any) -> ToolCall:
        """A call from the arguments a server sent: JSON text (usual) or an object (some servers)."""
        if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
            return cls(id=call_id, name=name, arguments={}, text=arguments or "")
        if isinstance(arguments, str):
            text = arguments
            try:
                arguments = json.loads(text)
            except json.JSONDecodeError as exc:
                error = f"the arguments of {name!r} are not valid JSON ({exc})"
                return cls(id=call_id, name=name, text=text, error=error)
        else:
            text = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, dict):
            error = f"the arguments of {name!r} must be a JSON object"
            return cls(id=call_id, name=name, text=text, error=error)
        return cls(id=call_id, name=name, arguments=arguments, text=text)


class InvalidToolCall(BaseModel):
    """Text that looked like a tool call but could not be read (a client-side parser's verdict)."""

    name: str | None = None
    text: str = Field(description="the call as the model wrote it")
    error: str = Field(description="what was wrong, told to the model")


class ModelTurn(BaseModel):
    """One assistant turn, parsed: the only form a model's reply takes after its client."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = Field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    latency_s: float = 0.0


# --- image content (OpenAI content parts) --------------------------------------------------

_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def image_mime(data: bytes) -> str | None:
    """The image type read from the bytes themselves (PNG, JPEG, GIF, WebP), else None."""
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_part(data: bytes, detail: str | None = None) -> dict[str, Any]:
    """An OpenAI `image_url` content part carrying the image itself as a data: URL (a model
    server need not reach any file or address of ours)."""
    import base64

    mime = image_mime(data)
    if mime is None:
        raise ValueError("not an image clotho can send (PNG, JPEG, GIF or WebP)")
    url: dict[str, Any] = {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
    if detail:
        url["detail"] = detail
    return {"type": "image_url", "image_url": url}


def user_message(text: str, images: list[bytes] | tuple[bytes, ...] = ()) -> dict[str, Any]:
    """A user message: plain text, or text and image content parts when there are images."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [image_part(image) for image in images]
    return {"role": "user", "content": parts}
