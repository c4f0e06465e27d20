"""Llama 3.x JSON tool calls: `{"name": ..., "parameters": {...}}`, several separated by `;`,
optionally after `<|python_tag|>`.

vLLM (`llama3_json`, Llama3JsonToolParser, also registered as `llama4_json`): in the full
response, tries `raw_decode` at every `{` (skipping those inside an object already read),
wants `name` and `arguments` or `parameters`, and `json.dumps` the arguments back. A JSON
object anywhere, even one quoted in a sentence or a code block, is taken; any object without
those keys, or any other error, turns the whole response into content with no calls. When
there are calls, content is None: the prose around them is dropped. (Streaming only starts
on text that begins with `<|python_tag|>` or `{`.)

We differ: only JSON at the start of the text (after whitespace) or right after
`<|python_tag|>` is a call, so JSON the model quotes in prose or code blocks is content; at
the start without the tag, an object counts only if it has `name` and `arguments` or
`parameters` (otherwise the model answered in JSON: content). After the tag, and after a first
call, any object must be such a call, and one that is not is an error. Text before the tag and
after the calls is content. Calls may be separated by `;`, whitespace or nothing. A call cut
off mid-JSON is an error.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from clotho.chat.parsers.base import ToolCallParser, Turn, skip_space
from clotho.chat.parsers.json_args import ArgumentsProblem, JsonProblem, call_fields, decode_at

_CALL_KEYS = ("parameters", "arguments")


class Llama3JsonParser(ToolCallParser):
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"
    markers = (PYTHON_TAG,)
    SEPARATOR: ClassVar[str] = "; "
    format_hint = (
        'Reply with only the call as JSON, {"name": "<tool name>", "parameters": {<arguments '
        "as a JSON object>}}, several calls separated by ';'."
    )

    def _scan(self, text: str, turn: Turn) -> None:
        i = skip_space(text, 0)
        if text.startswith(self.PYTHON_TAG, i):
            explicit, i = True, i + len(self.PYTHON_TAG)
        elif text.startswith("{", i):
            explicit = False
        else:
            tag = text.find(self.PYTHON_TAG, i)
            if tag < 0:
                turn.text(text)
                return
            turn.text(text[:tag])
            explicit, i = True, tag + len(self.PYTHON_TAG)
        first = True
        while True:
            j = skip_space(text, i)
            if not first and text.startswith(";", j):
                j = skip_space(text, j + 1)
            if not text.startswith("{", j):
                if explicit and first:
                    problem = f"{self.PYTHON_TAG} must be followed by a JSON call"
                    raw = text[i - len(self.PYTHON_TAG) :]
                    turn.error(raw, problem, None, truncated=not text[i:].strip())
                    return
                break
            try:
                obj, end = decode_at(text, j)
            except JsonProblem as e:
                if first and not explicit and not _starts_like_call(text, j):
                    turn.text(text)  # prose that happens to open with a brace
                    return
                turn.error(text[j:], str(e), None, truncated=e.truncated)
                return
            if first and not explicit and not _is_call_object(obj):
                turn.text(text)  # the model answered in JSON
                return
            raw = text[j:end]
            try:
                if not _is_call_object(obj):
                    raise ArgumentsProblem(
                        'the call must be an object with "name" and "parameters"'
                    )
                name, args = call_fields(obj, keys=_CALL_KEYS)
            except ArgumentsProblem as e:
                turn.error(raw, str(e), None)
            else:
                turn.call(name, args, raw)
            first, i = False, end
        turn.text(text[i:])

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        body = self.SEPARATOR.join(
            json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls
        )
        return f"{content}{self.PYTHON_TAG}{body}" if content else body


def _is_call_object(obj: Any) -> bool:
    return isinstance(obj, dict) and "name" in obj and any(k in obj for k in _CALL_KEYS)


def _starts_like_call(text: str, i: int) -> bool:
    """A broken object that opens with `{"name"` was meant as a call."""
    j = skip_space(text, i + 1)
    return text.startswith('"name"', j)
