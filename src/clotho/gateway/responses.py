"""The OpenAI Responses API (`POST /v1/responses`) as the gateway speaks it.

A request's `instructions` and `input` items become OpenAI-form chat messages (what every
`ModelSession.complete` takes): `message` items by role (`developer` as `system`), each
`function_call` as a tool call of the assistant message it follows, each
`function_call_output` as a `tool` message; `reasoning` items are dropped (the record keeps
them in the request: their encrypted content is the provider's alone). `previous_response_id`
is served from the trial's own earlier responses (`ResponseStore`). Function tools are
forwarded, those of a `namespace` tool by their own names (a call of one names its namespace
back); a hosted tool (web search, file search, ...) is not a tool the run's model can
call, so it is left out, and the record keeps the request as sent. The model's turn becomes a
`response` object (a `reasoning` summary, the `message`, a `function_call` per call); a
streamed reply is that same object cut into the API's semantic events, so the record's object
is exactly what the stream carried.
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from typing import Any

from clotho.chat.types import ModelTurn
from clotho.gateway.wire import WireError, text_of

# Tool types that are the provider's own (run on its servers): nothing the run's model can do.
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "image_generation", "computer_use_preview", "mcp",
})  # fmt: skip
# The Responses API's text parts (a refusal's text counts as text).
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "refusal")


def _text(content: Any, where: str) -> str:
    return text_of(content, where, _TEXT_PARTS)


class ResponseStore:
    """A trial's last responses by id, as the conversation each one ended (for
    `previous_response_id`): bounded, the oldest forgotten first."""

    def __init__(self, keep: int = 16) -> None:
        self._keep = keep
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        self._items[response_id] = conversation
        while len(self._items) > self._keep:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        return self._items.get(response_id)


def read_responses(
    body: Any, store: ResponseStore | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A Responses request as the messages and tools to forward."""
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    messages: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        found = store.get(previous) if store is not None and isinstance(previous, str) else None
        if found is None:
            raise WireError(f"previous_response_id {previous!r}: no such response in this trial")
        # The earlier request's instructions do not carry over (the API's rule).
        messages = [m for m in found if m.get("role") != "system"]
    instructions = body.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": _text(instructions, "instructions")})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not (items or messages):
        raise WireError("'input' must be a string or a non-empty list of items")
    for i, item in enumerate(items):
        _read_item(item, i, messages)
    if not messages:
        raise WireError("the request has no messages")
    return messages, _read_tools(body.get("tools"))


def _read_item(item: Any, i: int, messages: list[dict[str, Any]]) -> None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise WireError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise WireError(
                f"{where}: a message's role must be user, assistant, system or developer"
            )
        text = _text(item.get("content"), where)
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    elif kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments", "")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise WireError(f"{where}: a function_call needs a name and arguments (a string)")
        call_id = item.get("call_id") or item.get("id")
        call = {"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where} output")
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    elif kind not in ("reasoning", "item_reference"):
        raise WireError(f"{where}: unsupported input item {kind!r}")


def _read_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise WireError("'tools' must be a list")
    converted = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in HOSTED_TOOLS:
            continue
        if kind == "namespace" and isinstance(tool.get("tools"), list):
            converted.extend(_read_tools(tool["tools"]) or [])
            continue
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise WireError(f"tools[{i}]: only function tools are supported, not {kind!r}")
        function = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        converted.append({"type": "function", "function": function})
    return converted or None


def _namespaces(tools: Any) -> dict[str, str]:
    """The namespace of each function declared inside a `namespace` tool, by name."""
    found: dict[str, str] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[inner["name"]] = str(tool.get("name"))
    return found


def _content_of(turn: ModelTurn) -> str:
    extra = [bad.text for bad in turn.invalid_tool_calls]
    return "\n".join([turn.content, *extra]) if extra else turn.content


def responses_reply(turn: ModelTurn, *, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """The `response` object for `turn` (fields the request set, such as `tools` and
    `instructions`, echoed back as the API does)."""
    output: list[dict[str, Any]] = []
    if turn.reasoning:
        summary = [{"type": "summary_text", "text": turn.reasoning}]
        output.append({"type": "reasoning", "id": f"rs_{secrets.token_hex(12)}",
                       "summary": summary})  # fmt: skip
    text = _content_of(turn)
    if text or not turn.tool_calls:
        output.append({
            "type": "message",
            "id": f"msg_{secrets.token_hex(12)}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        })  # fmt: skip
    namespaces = _namespaces(body.get("tools"))
    for call in turn.tool_calls:
        item = {
            "type": "function_call",
            "id": f"fc_{secrets.token_hex(12)}",
            "call_id": call.id or f"call_{secrets.token_hex(12)}",
            "name": call.name,
            "arguments": call.text,
            "status": "completed",
        }
        if call.name in namespaces:
            item["namespace"] = namespaces[call.name]
        output.append(item)
    cut = turn.finish_reason == "length" and not turn.tool_calls
    usage = turn.usage
    return {
        "id": f"resp_{secrets.token_hex(12)}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": bool(body.get("store", False)),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "metadata": body.get("metadata") or {},
        "user": None,
        "usage": {
            "input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        },
    }


def assistant_of(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as the OpenAI-form assistant message the next request will carry."""
    messages: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    for i, item in enumerate(reply["output"]):
        if item["type"] == "message":
            messages[0]["content"] = _text(item["content"], "output")
        elif item["type"] == "function_call":
            _read_item(item, i, messages)
    return messages[0]


def responses_events(reply: dict[str, Any]) -> list[str]:
    """`reply` as Responses stream events: created, in_progress, each output item (added, its
    text or arguments in one delta, done), completed (or incomplete); numbered in order."""
    events: list[dict[str, Any]] = []
    start = {**reply, "status": "in_progress", "output": [], "usage": None}
    events.append({"type": "response.created", "response": start})
    events.append({"type": "response.in_progress", "response": start})
    for index, item in enumerate(reply["output"]):
        events.extend(_item_events(index, item))
    final = "response.incomplete" if reply["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": reply})
    return [
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n}, ensure_ascii=False)}"
        "\n\n"
        for n, e in enumerate(events)
    ]


def _item_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    at = {"output_index": index}
    kind, item_id = item["type"], item["id"]
    if kind == "message":
        opened = {**item, "status": "in_progress", "content": []}
    elif kind == "function_call":
        opened = {**item, "status": "in_progress", "arguments": ""}
    else:
        opened = {**item, "summary": []}
    events: list[dict[str, Any]] = [{"type": "response.output_item.added", **at, "item": opened}]
    if kind == "message":
        part = item["content"][0]
        where = {"item_id": item_id, **at, "content_index": 0}
        empty = {**part, "text": ""}
        events += [
            {"type": "response.content_part.added", **where, "part": empty},
            {"type": "response.output_text.delta", **where, "delta": part["text"],
             "logprobs": []},
            {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": []},
            {"type": "response.content_part.done", **where, "part": part},
        ]  # fmt: skip
    elif kind == "function_call":
        where = {"item_id": item_id, **at}
        events += [
            {"type": "response.function_call_arguments.delta", **where,
             "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "name": item["name"],
             "arguments": item["arguments"]},
        ]  # fmt: skip
    else:
        for n, part in enumerate(item["summary"]):
            where = {"item_id": item_id, **at, "summary_index": n}
            events += [
                {"type": "response.reasoning_summary_part.added", **where,
                 "part": {**part, "text": ""}},
                {"type": "response.reasoning_summary_text.delta", **where,
                 "delta": part["text"]},
                {"type": "response.reasoning_summary_text.done", **where, "text": part["text"]},
                {"type": "response.reasoning_summary_part.done", **where, "part": part},
            ]  # fmt: skip
    events.append({"type": "response.output_item.done", **at, "item": item})
    return events


def responses_error(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status, "param": None}}
