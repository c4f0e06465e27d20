"""GLM-4.5 / 4.6: `<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n...
</tool_call>`.

vLLM: the `glm45` name first went to Glm4MoeModelToolParser, whose
`<tool_call>([^\\n]*)\\n(.*)</tool_call>` needs a newline after the name (a call without
arguments written `<tool_call>NAME</tool_call>` raises, and then every call of the turn is
dropped and the whole text becomes content); current vLLM maps both `glm45` and `glm47` to
Glm47MoeModelToolParser (see `clotho.chat.parsers.glm47`). Keys and values are stripped; a
value is kept as a string only when the schema says `string`, otherwise (no schema included)
it is guessed with `json.loads`, then `ast.literal_eval`, then left a string. Only complete
`<tool_call>...</tool_call>` blocks count: a cut-off call vanishes. Content is the text before
the first `<tool_call>`.

We differ: one parser for both spellings (newlines between the parts optional); values follow
the schema strictly (`clotho.chat.parsers.schema_values`): a string parameter keeps its text
exactly as written between the tags (not stripped), a parameter without schema stays a
string, and a value that does not fit its type is an error for that call; a call cut off is
an error; a bad call is reported alone; content is all text outside calls. A value ends at
the first `</arg_value>`, so it may contain the other tags.
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import (
    Malformed,
    ToolCallParser,
    Turn,
    error_extent,
    find_first,
    ran_out,
    scan_blocks,
)
from clotho.chat.parsers.xml_args import typed_arguments


class Glm45Parser(ToolCallParser):
    name = "glm45"
    START = "<tool_call>"
    END = "</tool_call>"
    KEY = "<arg_key>"
    KEY_END = "</arg_key>"
    VALUE = "<arg_value>"
    VALUE_END = "</arg_value>"
    markers = (START, END, KEY, KEY_END, VALUE, VALUE_END)
    NEWLINE = "\n"
    """What the model writes between the parts of a call (GLM-4.7 writes nothing)."""
    format_hint = (
        "Write each call as <tool_call>TOOL_NAME\n<arg_key>PARAMETER_NAME</arg_key>\n"
        "<arg_value>value</arg_value>\n</tool_call>, one key and value per argument, with "
        "values of the type the tool's schema gives (JSON for objects and arrays)."
    )

    def _scan(self, text: str, turn: Turn) -> None:
        scan_blocks(text, turn, self.START, self._call)

    def _call(self, text: str, start: int, turn: Turn) -> int:
        body = start + len(self.START)
        try:
            name, args, end = self._read(text, body)
        except Malformed as e:
            stop, cut = error_extent(text, body, self.END, (self.START,), e.truncated)
            turn.error(text[start:stop], e.problem, e.name, truncated=cut)
            return stop
        turn.call(name, args, text[start:end])
        return end

    def _read(self, text: str, body: int) -> tuple[str, dict[str, Any], int]:
        name_end, _ = find_first(text, (self.KEY, self.END), body)
        if name_end < 0:
            raise Malformed(
                f"the tool name is not followed by {self.KEY} or {self.END}", truncated=True
            )
        name = text[body:name_end].strip()
        i = name_end
        pairs: list[tuple[str, str]] = []
        while True:
            i = _gap(text, i)
            if text.startswith(self.END, i):
                i += len(self.END)
                break
            if not text.startswith(self.KEY, i):
                found = text[i : i + 20]
                raise Malformed(
                    f"expected {self.KEY} or {self.END} but found {found!r}",
                    name=name,
                    truncated=ran_out(text, i, self.KEY, self.END),
                )
            key_end = text.find(self.KEY_END, i)
            if key_end < 0:
                raise Malformed(
                    f"{self.KEY} is not closed with {self.KEY_END}", name=name, truncated=True
                )
            key = text[i + len(self.KEY) : key_end].strip()
            i = _gap(text, key_end + len(self.KEY_END))
            if not text.startswith(self.VALUE, i):
                raise Malformed(
                    f"argument {key!r} has no {self.VALUE}",
                    name=name,
                    truncated=ran_out(text, i, self.VALUE),
                )
            value_end = text.find(self.VALUE_END, i)
            if value_end < 0:
                raise Malformed(
                    f"the value of {key!r} is not closed with {self.VALUE_END}",
                    name=name,
                    truncated=True,  # a value runs until its closing tag: here, the end
                )
            pairs.append((key, text[i + len(self.VALUE) : value_end]))
            i = value_end + len(self.VALUE_END)
        return name, typed_arguments(self.schemas, name, pairs), i

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        nl = self.NEWLINE
        out = [content or ""]
        for name, args in calls:
            out.append(f"{nl}{self.START}{name}")
            for key, value in args.items():
                text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
                out.append(
                    f"{nl}{self.KEY}{key}{self.KEY_END}{nl}{self.VALUE}{text}{self.VALUE_END}"
                )
            out.append(f"{nl}{self.END}")
        return "".join(out)


def _gap(text: str, i: int) -> int:
    """Skip whitespace between tags, and the literal `\\n` some GLM outputs carry there."""
    n = len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("\\n", i):
            i += 2
        else:
            break
    return i
