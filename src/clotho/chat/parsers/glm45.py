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
an error; a bad call is reported alone; content is all text outside calls. The name ends at
a newline or at the two characters `\\n` some GLM outputs carry instead (SGLang's reading;
vLLM's GLM-4.7 regex keeps them in the name). Values may hold the format's own tags: a value
ends only at an `</arg_value>` followed by `<arg_key>` or `</tool_call>`, never inside a block
nested in the value, and a call inside a value never runs (`clotho.chat.parsers.xml_calls`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from clotho.chat.parsers.base import Malformed, ran_out, skip_space
from clotho.chat.parsers.xml_calls import Cursor, Function, Reading, Step, Value, XmlCallParser

_NAME_END = re.compile(r"\n|\\n|<arg_key>|</tool_call>")


class Glm45Parser(XmlCallParser):
    name = "glm45"
    START = "<tool_call>"
    END = "</tool_call>"
    KEY = "<arg_key>"
    KEY_END = "</arg_key>"
    VALUE = "<arg_value>"
    VALUE_END = "</arg_value>"
    markers = (START, END, KEY, KEY_END, VALUE, VALUE_END)
    STRAY = (END, KEY, KEY_END, VALUE, VALUE_END)
    VALUE_OPEN = VALUE
    VALUE_CLOSE = VALUE_END
    RESUME = (KEY, END)
    NEWLINE = "\n"
    """What the model writes between the parts of a call (GLM-4.7 writes nothing)."""
    format_hint = (
        "Write each call as <tool_call>TOOL_NAME\n<arg_key>PARAMETER_NAME</arg_key>\n"
        "<arg_value>value</arg_value>\n</tool_call>, one key and value per argument, with "
        "values of the type the tool's schema gives (JSON for objects and arrays)."
    )

    def _start(self, text: str, body: int) -> Step:
        i = skip_space(text, body)
        # The name ends at a newline, at the literal `\\n` some GLM outputs carry instead (as
        # SGLang reads it), or at the first tag.
        end = _NAME_END.search(text, i)
        if end is None:
            return Malformed(
                f"the tool name is not followed by {self.KEY} or {self.END}", truncated=True
            )
        cut = end.start()
        return self._advance(text, Cursor(cut, text[i:cut].strip(), body, [], []))

    def _advance(self, text: str, cur: Cursor) -> Step:
        name = cur.name
        i = _gap(text, cur.i)
        if text.startswith(self.END, i):
            fn = Function(name, cur.pairs, cur.begin, i)
            return Reading(i + len(self.END), [fn])
        if not text.startswith(self.KEY, i):
            found = text[i : i + 20]
            return Malformed(
                f"expected {self.KEY} or {self.END} but found {found!r}",
                name=name,
                truncated=ran_out(text, i, self.KEY, self.END),
            )
        key_end = text.find(self.KEY_END, i)
        if key_end < 0:
            return Malformed(
                f"{self.KEY} is not closed with {self.KEY_END}", name=name, truncated=True
            )
        key = text[i + len(self.KEY) : key_end].strip()
        j = _gap(text, key_end + len(self.KEY_END))
        if not text.startswith(self.VALUE, j):
            return Malformed(
                f"argument {key!r} has no {self.VALUE}",
                name=name,
                truncated=ran_out(text, j, self.VALUE),
            )
        cur.i = j + len(self.VALUE)
        return Value(cur, key)

    def _skip(self, text: str, i: int) -> int:
        return _gap(text, i)

    def _opens(self, text: str, o: int, v: int, nested: int) -> bool:
        """After `<arg_key>K</arg_key>`, itself at the start of the value, after a nested
        `</arg_value>`, or after a `<tool_call>NAME` inside the value."""
        k = _gap_back(text, o, v)
        if not text.endswith(self.KEY_END, v, k):
            return False
        key = text.rfind(self.KEY, v, k)
        if key < 0:
            return False
        k = _gap_back(text, key, v)
        if k in (v, nested):
            return True
        call = text.rfind(self.START, v, k)
        return call >= 0 and "<" not in text[call + len(self.START) : k]

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


def _gap_back(text: str, i: int, low: int) -> int:
    """`_gap` backwards: the start of the whitespace and literal `\\n` ending at `i`."""
    while i > low:
        if text[i - 1].isspace():
            i -= 1
        elif text.endswith("\\n", low, i):
            i -= 2
        else:
            break
    return i
