"""Formats that wrap one JSON call object in a pair of tags (hermes, qwen, longcat).

The JSON decoder, not a search for the end tag, decides where a call's body ends, so strings
may hold the tags. A body that is not valid JSON ends at the first tag after where the decoder
stopped: a tag before that lay in the call's own text (a string quoting another call, say) and
neither ends this call nor starts one."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from clotho.chat.parsers.base import (
    Malformed,
    ToolCallParser,
    Turn,
    error_extent,
    ran_out,
    scan_blocks,
    skip_space,
)
from clotho.chat.parsers.json_args import ArgumentsProblem, JsonProblem, call_fields, decode_at


class TaggedJsonParser(ToolCallParser):
    """`START{"name": ..., "arguments": {...}}END`, any number of times, prose around them."""

    START: ClassVar[str]
    END: ClassVar[str]

    def _scan(self, text: str, turn: Turn) -> None:
        scan_blocks(text, turn, self.START, self._call)

    def _call(self, text: str, start: int, turn: Turn) -> int:
        body = start + len(self.START)
        try:
            obj, end = self._read(text, body)
        except (Malformed, JsonProblem) as e:
            stop, cut = error_extent(text, body, self.END, (self.START,), e.truncated, e.at)
            name = e.name if isinstance(e, Malformed) else None
            turn.error(text[start:stop], str(e), name, truncated=cut)
            return stop
        raw = text[start:end]
        try:
            name, args = call_fields(obj)
        except ArgumentsProblem as e:
            turn.error(raw, str(e), None)
            return end
        turn.call(name, args, raw)
        return end

    def _read(self, text: str, body: int) -> tuple[Any, int]:
        if not text.startswith("{", skip_space(text, body)):
            raise Malformed(
                f"{self.START} must be followed by a JSON object", truncated=ran_out(text, body)
            )
        obj, end = decode_at(text, body)
        close = skip_space(text, end)
        if close == len(text):
            return obj, close  # complete object, only the closing tag missing: as vLLM, a call
        if not text.startswith(self.END, close):
            after = text[close : close + 20]
            raise Malformed(
                f"the JSON object is followed by {after!r} instead of {self.END}",
                truncated=ran_out(text, close, self.END),
                at=close,
            )
        return obj, close + len(self.END)

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        parts = [content] if content else []
        for name, args in calls:
            body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
            parts.append(f"{self.START}\n{body}\n{self.END}")
        return "\n".join(parts)
