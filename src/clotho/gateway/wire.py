"""The wire formats the gateway speaks, read into and rendered from clotho's own forms.

A request becomes OpenAI-form messages and tools (what every `ModelSession.complete` takes);
the model's `ModelTurn` becomes the reply object of the agent's API; a streamed reply is a
rendering of that same object as server-sent events, so the record's object is exactly what
the stream carried. The model is asked once, whole: a stream is cut from the finished turn.
Sampling fields in a request (model, temperature, max_tokens) are recorded, not obeyed: the
run's model configuration decides them, as it does for clotho's own agent.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Collection
from typing import Any

from clotho.chat.types import ModelTurn


class WireError(ValueError):
    """A request the gateway cannot serve (malformed, or asks for what it does not support)."""


def text_of(content: Any, where: str, kinds: Collection[str] = ("text",)) -> str:
    """A content string, or its parts' texts joined by newlines: parts of `kinds`, and a
    refusal's text where "refusal" is one of them; anything else (an image, a file) is
    refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError(f"{where}: content must be a string or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in kinds:
            raise WireError(f"{where}: only text content is supported, not {kind!r}")
        text = str(part.get("refusal", "")) if kind == "refusal" else part.get("text")
        if not isinstance(text, str):
            raise WireError(f"{where}: a text part has no text")
        texts.append(text)
    return "\n".join(texts)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    return body


def _messages_list(body: dict[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise WireError("'messages' must be a non-empty list")
    return messages


# --- OpenAI Chat Completions ---------------------------------------------------------------


def read_openai(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """An OpenAI chat request as the messages and tools to forward: text parts joined, the
    `developer` role as `system`, legacy `functions` as tools; the rest as sent."""
    body = _object(body)
    if int(body.get("n") or 1) != 1:
        raise WireError("n > 1 is not supported: one reply per call")
    messages: list[dict[str, Any]] = []
    for i, raw in enumerate(_messages_list(body)):
        if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
            raise WireError(f"messages[{i}] must be an object with a role")
        message = dict(raw)
        if message["role"] == "developer":
            message["role"] = "system"
        if isinstance(message.get("content"), list):
            message["content"] = text_of(message["content"], f"messages[{i}]")
        messages.append(message)
    tools = body.get("tools")
    if tools is None and isinstance(body.get("functions"), list):
        tools = [{"type": "function", "function": f} for f in body["functions"]]
    if tools is not None:
        if not isinstance(tools, list):
            raise WireError("'tools' must be a list")
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type", "function") != "function":
                raise WireError(f"tools[{i}]: only function tools are supported")
    return messages, tools or None


def _call_ids(turn: ModelTurn, prefix: str) -> list[str]:
    """The model's call ids where it gave them, else fresh ones (unique in the conversation)."""
    return [call.id or f"{prefix}{secrets.token_hex(12)}" for call in turn.tool_calls]


def _content_of(turn: ModelTurn) -> str:
    """The turn's text; calls the model wrote that no parser could read stay visible as text."""
    extra = [bad.text for bad in turn.invalid_tool_calls]
    return "\n".join([turn.content, *extra]) if extra else turn.content


def openai_reply(turn: ModelTurn, *, model: str) -> dict[str, Any]:
    """The `chat.completion` object for `turn`."""
    message: dict[str, Any] = {"role": "assistant", "content": _content_of(turn)}
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    if turn.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": c.name, "arguments": c.text}}
            for cid, c in zip(_call_ids(turn, "call_"), turn.tool_calls, strict=True)
        ]
        if not message["content"]:
            message["content"] = None
    finish = "tool_calls" if turn.tool_calls else (turn.finish_reason or "stop")
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": turn.usage.model_dump(),
    }


def _sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


def openai_events(reply: dict[str, Any], *, include_usage: bool) -> list[str]:
    """`reply` as `chat.completion.chunk` events: the role, the reasoning, the content, each
    tool call whole (id, name and arguments in one delta), the finish reason, the usage if
    asked (`stream_options.include_usage`), then `[DONE]`."""
    choice = reply["choices"][0]
    message = choice["message"]
    base = {k: reply[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": ""})]
    if message.get("reasoning_content"):
        events.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        events.append(chunk({"content": message["content"]}))
    for i, call in enumerate(message.get("tool_calls") or []):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        events.append(_sse({**base, "choices": [], "usage": reply["usage"]}))
    events.append("data: [DONE]\n\n")
    return events


def openai_error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


# --- Anthropic Messages --------------------------------------------------------------------


def read_anthropic(body: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """An Anthropic Messages request as OpenAI-form messages and tools: `system` first;
    `tool_use` blocks as the assistant's tool calls; each `tool_result` as a `tool` message,
    before the user's text of the same turn; `thinking` blocks are dropped (the record keeps
    them in the request)."""
    body = _object(body)
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system, "system")})
    for i, raw in enumerate(_messages_list(body)):
        if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant"):
            raise WireError(f"messages[{i}] must be an object with role user or assistant")
        role, content = raw["role"], raw.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise WireError(f"messages[{i}]: content must be a string or a list of blocks")
        if role == "assistant":
            messages.append(_anthropic_assistant(content, i))
        else:
            messages.extend(_anthropic_user(content, i))
    tools = body.get("tools")
    if tools is None:
        return messages, None
    if not isinstance(tools, list):
        raise WireError("'tools' must be a list")
    converted = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise WireError(f"tools[{i}] must be an object with a name")
        if "input_schema" not in tool:
            raise WireError(
                f"tools[{i}] ({tool['name']}): only client tools with an input_schema are "
                f"supported, not the server tool {tool.get('type')!r}"
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return messages, converted or None


def _anthropic_assistant(blocks: list[Any], i: int) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind not in ("thinking", "redacted_thinking"):
            raise WireError(f"messages[{i}]: unsupported assistant block {kind!r}")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _anthropic_user(blocks: list[Any], i: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    texts: list[str] = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result":
            text = text_of(block.get("content"), f"messages[{i}] tool_result")
            results.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        else:
            raise WireError(f"messages[{i}]: only text and tool_result blocks, not {kind!r}")
    if texts:
        results.append({"role": "user", "content": "\n".join(texts)})
    return results


_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}


def anthropic_reply(turn: ModelTurn, *, model: str) -> dict[str, Any]:
    """The Messages API `message` object for `turn` (reasoning is not sent: a thinking block
    needs a signature only the provider can make; the record keeps it in `turn`)."""
    content: list[dict[str, Any]] = []
    text = _content_of(turn)
    if text:
        content.append({"type": "text", "text": text})
    for cid, call in zip(_call_ids(turn, "toolu_"), turn.tool_calls, strict=True):
        # A call whose arguments are not an object reaches the agent as its raw text.
        arguments = call.arguments if call.arguments is not None else {"_raw": call.text}
        content.append({"type": "tool_use", "id": cid, "name": call.name, "input": arguments})
    if turn.tool_calls:
        stop = "tool_use"
    else:
        stop = _STOP_REASONS.get(turn.finish_reason or "stop", "end_turn")
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": turn.usage.prompt_tokens,
            "output_tokens": turn.usage.completion_tokens,
        },
    }


def anthropic_events(reply: dict[str, Any]) -> list[str]:
    """`reply` as Messages stream events: message_start, each block (text whole in one
    delta, a tool's input as one `input_json_delta`), message_delta, message_stop."""
    start = {**reply, "content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": reply["usage"]["input_tokens"], "output_tokens": 0}
    events = [_sse({"type": "message_start", "message": start}, "message_start")]
    for i, block in enumerate(reply["content"]):
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        begin = {"type": "content_block_start", "index": i, "content_block": opened}
        events.append(_sse(begin, "content_block_start"))
        step = {"type": "content_block_delta", "index": i, "delta": delta}
        events.append(_sse(step, "content_block_delta"))
        events.append(_sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    delta = {"stop_reason": reply["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": reply["usage"]["output_tokens"]}
    events.append(_sse({"type": "message_delta", "delta": delta, "usage": usage}, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


def anthropic_error(message: str, kind: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}
