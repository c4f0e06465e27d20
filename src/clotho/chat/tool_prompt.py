"""Tool descriptions for chat templates that have no place for tools.

Many templates (SmolLM2's, most base models') render only roles and contents, so the `tools`
given to them vanish and the model never learns what it may call. For those, the tools go
into the system message as text: their JSON schemas, and an example call written in the
format the configured parser reads, so what the model is shown is what clotho can parse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clotho.chat.parsers import get_parser
from clotho.chat.tokenizer import TemplateTokenizer

_PROBE = "clotho_probe_tool_7f3a"
_EXAMPLE_VALUES: dict[str, Any] = {"integer": 1, "number": 1.0, "boolean": True}


def renders_tools(tokenizer: TemplateTokenizer, template_kwargs: dict[str, Any]) -> bool:
    """Whether the chat template writes the `tools` it is given into the prompt."""
    probe = [{"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "hi"}]
    text = tokenizer.render(messages, probe, add_generation_prompt=True, **template_kwargs)
    return _PROBE in text


def tools_text(tools: Sequence[dict[str, Any]], tool_parser: str) -> str:
    """The system-message block describing `tools` and how to call them."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    function = tools[0].get("function", {})
    example = get_parser(tool_parser, tools=list(tools)).render(
        [(function.get("name", "tool"), _example_arguments(function.get("parameters") or {}))]
    )
    return (
        "# Tools\n\nYou may call one or more functions to do the task. The functions, as JSON "
        f"schemas:\n<tools>\n{schemas}\n</tools>\n\nTo call a function, write the call exactly "
        f"in this form, then stop and wait for its result:\n{example}"
    )


def with_tools_text(messages: Sequence[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` appended to the system message (or in a new one, first)."""
    out = [dict(m) for m in messages]
    if out and out[0].get("role") == "system":
        content = out[0].get("content") or ""
        out[0]["content"] = f"{content}\n\n{text}" if content else text
        return out
    return [{"role": "system", "content": text}, *out]


def _example_arguments(parameters: dict[str, Any]) -> dict[str, Any]:
    properties = parameters.get("properties") or {}
    names = list(parameters.get("required") or []) or list(properties)[:1]
    return {
        name: _EXAMPLE_VALUES.get((properties.get(name) or {}).get("type", "string"), "...")
        for name in names
    }
