"""Formats with a tool-call section holding delimited calls (DeepSeek V3 / V3.1, Kimi K2):
`SECTION_BEGIN CALL_BEGIN ... CALL_END CALL_BEGIN ... CALL_END SECTION_END`.

Calls are read one after another; each format only says how to read the inside of one call.
Text outside sections is content; so is stray text inside a section (it is the model's words,
not a call). A section the model did not close still yields its complete calls; a call the
text ends inside is an error.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

from clotho.chat.parsers.base import (
    Malformed,
    ToolCallParser,
    Turn,
    error_extent,
    find_first,
    ran_out,
    skip_space,
)
from clotho.chat.parsers.json_args import JsonProblem, decode_at

FENCE = "```"


class SectionParser(ToolCallParser):
    SECTION_BEGINS: ClassVar[tuple[str, ...]]
    SECTION_ENDS: ClassVar[tuple[str, ...]]
    CALL_BEGIN: ClassVar[str]
    CALL_END: ClassVar[str]

    @abstractmethod
    def _read_call(self, text: str, body: int) -> tuple[str, Any, str | None, int]:
        """Read the call whose body starts at `body`: (name, arguments, model id, end after
        CALL_END). Raise Malformed or JsonProblem when it cannot be read."""

    def _scan(self, text: str, turn: Turn) -> None:
        openers = (*self.SECTION_BEGINS, self.CALL_BEGIN)
        pos = 0
        while True:
            start, marker = find_first(text, openers, pos)
            if start < 0:
                turn.text(text[pos:])
                return
            turn.text(text[pos:start])
            # A call without its section opener is still a call.
            pos = self._section(
                text, start if marker == self.CALL_BEGIN else start + len(marker), turn
            )

    def _section(self, text: str, i: int, turn: Turn) -> int:
        stops = (self.CALL_BEGIN, *self.SECTION_ENDS)
        while True:
            i = skip_space(text, i)
            if i >= len(text):
                return i
            if text.startswith(self.CALL_BEGIN, i):
                i = self._call(text, i, turn)
                continue
            for end in self.SECTION_ENDS:
                if text.startswith(end, i):
                    return i + len(end)
            nxt, _ = find_first(text, stops, i)
            stop = nxt if nxt >= 0 else len(text)
            turn.text(text[i:stop])
            i = stop

    def _call(self, text: str, start: int, turn: Turn) -> int:
        body = start + len(self.CALL_BEGIN)
        try:
            name, args, model_id, end = self._read_call(text, body)
        except (Malformed, JsonProblem) as e:
            stops = (self.CALL_BEGIN, *self.SECTION_ENDS)
            stop, cut = error_extent(text, body, self.CALL_END, stops, e.truncated, e.at)
            name = e.name if isinstance(e, Malformed) else None
            turn.error(text[start:stop], str(e), name, truncated=cut)
            return stop
        turn.call(name, args, text[start:end], model_id)
        return end

    def _marker(self, text: str, marker: str, body: int, what: str) -> int:
        """Index of `marker` inside the call starting at `body` (before its CALL_END)."""
        at = text.find(marker, body)
        close = text.find(self.CALL_END, body)
        if at < 0 or 0 <= close < at:
            raise Malformed(f"{what} is missing")
        return at

    def _arguments(self, text: str, i: int, name: str) -> tuple[Any, int]:
        """The JSON arguments from `i` up to CALL_END, optionally in a ```json fence; nothing
        at all means no arguments. Returns (value, end after CALL_END)."""
        i = skip_space(text, i)
        if text.startswith(self.CALL_END, i):
            return {}, i + len(self.CALL_END)
        fenced = text.startswith(FENCE, i)
        if fenced:
            i += len(FENCE)
            if text.startswith("json", i):
                i += len("json")
            elif ran_out(text, i, "json"):
                raise Malformed("the text ends inside the call", name=name, truncated=True)
        try:
            value, end = decode_at(text, i)
        except JsonProblem as e:
            cut = e.truncated or ran_out(text, i, FENCE + "json", self.CALL_END)
            raise Malformed(str(e), name=name, truncated=cut, at=e.at) from None
        end = skip_space(text, end)
        if fenced and text.startswith(FENCE, end):
            end = skip_space(text, end + len(FENCE))
        if not text.startswith(self.CALL_END, end):
            after = text[end : end + 20]
            raise Malformed(
                f"the arguments are followed by {after!r} instead of {self.CALL_END}",
                name=name,
                truncated=ran_out(text, end, self.CALL_END, FENCE + self.CALL_END),
                at=end,
            )
        return value, end + len(self.CALL_END)
