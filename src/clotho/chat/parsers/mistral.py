"""Mistral: `[TOOL_CALLS]` followed by either form its tokenizers have used.

- before v11: `[TOOL_CALLS] [{"name": ..., "arguments": {...}, "id": ...}, ...]` (v3+ add a
  9-character `id` to each object);
- v11 and later: `[TOOL_CALLS]NAME[ARGS]{...}`, repeated per call (v11 itself writes
  `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`; v13 dropped the id).

vLLM (`mistral`, MistralToolParser) picks one form from the tokenizer (`[ARGS]` in the vocab
means v11+). v11+: splits on `[TOOL_CALLS]`, takes the name up to the first `{` (removing
`[ARGS]`, but not `[CALL_ID]ID`, which ends up in the name) and passes the rest through as the
argument string unchecked; pieces without `{` are skipped. Pre-v11: exactly one
`[TOOL_CALLS]` or it raises; `raw_decode` of the array (text after it ignored), then
`json.dumps` of each `arguments`; on a JSON error, a regex fallback, else the whole text is
content. Content is the text before the first `[TOOL_CALLS]`. Ids are 9 random alphanumerics.

We differ: both forms are read whatever the tokenizer; `[CALL_ID]` is understood and the
model's id kept (when new in the trajectory); arguments are decoded and must be objects; a bad
call is reported alone; text after a call is content. Generated ids stay 9 alphanumerics
(`call00001`), which Mistral's templates require. `mistral` renders the pre-v11 form,
`mistral_v11` the v11+ form; both parse both.
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import Malformed, ToolCallParser, Turn, skip_space
from clotho.chat.parsers.json_args import ArgumentsProblem, JsonProblem, call_fields, decode_at

_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _nine_chars(n: int) -> str:
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = _BASE36[r] + digits
        if n == 0:
            break
    return "call" + digits.rjust(5, "0")[-5:]


def _one_word_to_the_end(text: str, i: int, limit: int) -> bool:
    """A name or id running to the end of the text, no spaces: it was being written when the
    output stopped."""
    return limit == len(text) and not any(c.isspace() for c in text[i:limit].strip())


class MistralParser(ToolCallParser):
    name = "mistral"
    BOT = "[TOOL_CALLS]"
    ARGS = "[ARGS]"
    CALL_ID = "[CALL_ID]"
    markers = (BOT, ARGS, CALL_ID)
    format_hint = (
        'Write the calls as [TOOL_CALLS] [{"name": "<tool name>", "arguments": {<arguments as '
        "a JSON object>}}] or as [TOOL_CALLS]<tool name>[ARGS]{<arguments as a JSON object>}."
    )

    def _fresh_id(self, n: int) -> str:
        return _nine_chars(n)

    def _reused_id(self, model_id: str, name: str, n: int) -> str:
        return _nine_chars(n)

    def _scan(self, text: str, turn: Turn) -> None:
        pos = 0
        while True:
            start = text.find(self.BOT, pos)
            if start < 0:
                turn.text(text[pos:])
                return
            turn.text(text[pos:start])
            nxt = text.find(self.BOT, start + len(self.BOT))
            limit = nxt if nxt >= 0 else len(text)
            body = skip_space(text, start + len(self.BOT))
            try:
                if text.startswith("[", body) and not text.startswith(
                    (self.ARGS, self.CALL_ID), body
                ):
                    pos = self._array(text, body, turn)
                else:
                    pos = self._v11(text, start, body, limit, turn)
            except (Malformed, JsonProblem) as e:
                # Cut off: the rest of the text is this call, even [TOOL_CALLS] in its strings.
                # Otherwise it ends at the next [TOOL_CALLS] after where the reader stopped (one
                # before that was inside this call's JSON, quoted, not a call of its own).
                pos = len(text) if e.truncated else self._next_call(text, limit, e.at)
                name = e.name if isinstance(e, Malformed) else None
                turn.error(text[start:pos], str(e), name, truncated=e.truncated)

    def _next_call(self, text: str, limit: int, at: int | None) -> int:
        if at is None or at <= limit:
            return limit
        nxt = text.find(self.BOT, at)
        return nxt if nxt >= 0 else len(text)

    def _array(self, text: str, body: int, turn: Turn) -> int:
        items, end = decode_at(text, body)
        if isinstance(items, dict):
            items = [items]
        if not isinstance(items, list):
            raise Malformed("[TOOL_CALLS] must be followed by a JSON array of call objects", at=end)
        for item in items:
            raw = json.dumps(item, ensure_ascii=False)
            try:
                name, args = call_fields(item)
            except ArgumentsProblem as e:
                turn.error(raw, str(e), None)
                continue
            model_id = item.get("id") if isinstance(item.get("id"), str) else None
            turn.call(name, args, raw, model_id)
        return end

    def _v11(self, text: str, start: int, body: int, limit: int, turn: Turn) -> int:
        marks = (self.ARGS, self.CALL_ID, "{")
        cuts = [i for i in (text.find(m, body, limit) for m in marks) if i >= 0]
        if not cuts:
            raise Malformed(
                "the tool name is not followed by [ARGS] and a JSON object",
                truncated=_one_word_to_the_end(text, body, limit),
            )
        name_end = min(cuts)
        name = text[body:name_end].strip()
        model_id = None
        i = name_end
        if text.startswith(self.CALL_ID, i):
            i += len(self.CALL_ID)
            id_end = text.find(self.ARGS, i, limit)
            if id_end < 0:
                raise Malformed(
                    "[CALL_ID] must be followed by the id and [ARGS]",
                    name=name or None,
                    truncated=_one_word_to_the_end(text, i, limit),
                )
            model_id = text[i:id_end].strip() or None
            i = id_end
        if text.startswith(self.ARGS, i):
            i += len(self.ARGS)
        j = skip_space(text, i)
        if not text.startswith("{", j):
            raise Malformed(
                "[ARGS] must be followed by a JSON object", name=name or None, truncated=j == limit
            )
        try:
            args, end = decode_at(text, i)
        except JsonProblem as e:
            raise Malformed(str(e), name=name or None, truncated=e.truncated, at=e.at) from None
        turn.call(name, args, text[start:end], model_id)
        return end

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        body = json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)
        return f"{content or ''}{self.BOT} {body}"


class MistralV11Parser(MistralParser):
    """Same parser; renders the v11+ form (Mistral Small 3.2, Magistral, Devstral)."""

    name = "mistral_v11"

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        return (content or "") + "".join(
            f"{self.BOT}{n}{self.ARGS}{json.dumps(a, ensure_ascii=False)}" for n, a in calls
        )
