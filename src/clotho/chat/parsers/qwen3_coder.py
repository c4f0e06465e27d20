"""Qwen3-Coder XML calls: `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call>`.

vLLM (`qwen3_coder`, Qwen3CoderToolParser): regexes tolerant of every missing closing tag
(`<tool_call>` to the end, `<function=` to the end, a parameter ending at `</parameter>`, the
next `<parameter=`, `</function>` or the end), and without any `<tool_call>` it looks for
`<function=` in the whole text. One newline is removed at each end of a value. Values are
typed by the tool's schema, with fallbacks that guess: `null` becomes None for any type (even
a string parameter); an integer or number that does not parse stays a string; a boolean that is
not `true`/`false` becomes False; objects and arrays go through `json.loads` then
`ast.literal_eval`, and so do unknown types. Content is the text before the first call.

We differ: values follow the schema strictly (see `clotho.chat.parsers.schema_values`): a
string parameter keeps its text, `null` is None only where the schema allows null, and a value
that does not fit its type is an error for that call; a parameter without schema stays a
string. vLLM and SGLang end a value at its first `</parameter>`, so a file holding that tag is
cut short, and a whole `<tool_call>` block inside a value (a template, a test fixture) becomes
calls of its own; here a value ends only at a `</parameter>` followed by the next
`<parameter=NAME>` or `</function>`, never inside a block nested in the value, and a call inside
a value never runs (`clotho.chat.parsers.xml_calls` has the rules). A value that no closing
tag ends is an error; `<function=` outside `<tool_call>` is content; a call cut off is an
error (a complete `</function>` whose `</tool_call>` is missing at the very end is accepted);
content is all text outside calls. Booleans may be written `true`/`True` (the chat template
writes Python's `True`).
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import Malformed, ran_out, skip_space
from clotho.chat.parsers.xml_calls import Cursor, Function, Reading, Step, Value, XmlCallParser


class Qwen3CoderParser(XmlCallParser):
    name = "qwen3_coder"
    START = "<tool_call>"
    END = "</tool_call>"
    FUNCTION = "<function="
    FUNCTION_END = "</function>"
    PARAMETER = "<parameter="
    PARAMETER_END = "</parameter>"
    markers = (START, END, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END)
    STRAY = (END, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END)
    VALUE_OPEN = PARAMETER
    VALUE_CLOSE = PARAMETER_END
    RESUME = (PARAMETER, FUNCTION_END)
    format_hint = (
        "Write each call as <tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\n"
        "value\n</parameter>\n</function>\n</tool_call>, one <parameter> block per argument, "
        "with values of the type the tool's schema gives (JSON for objects and arrays)."
    )

    def _start(self, text: str, body: int) -> Step:
        i = skip_space(text, body)
        if not text.startswith(self.FUNCTION, i):
            return Malformed(
                f"{self.START} must be followed by {self.FUNCTION}TOOL_NAME>",
                truncated=ran_out(text, i, self.FUNCTION),
            )
        return self._function(text, i, [])

    def _function(self, text: str, begin: int, done: list[Function]) -> Step:
        try:
            name, i = self._tag_name(text, begin + len(self.FUNCTION), None)
        except Malformed as e:
            return e
        return self._advance(text, Cursor(i, name, begin, [], done))

    def _advance(self, text: str, cur: Cursor) -> Step:
        i = skip_space(text, cur.i)
        if text.startswith(self.FUNCTION_END, i):
            i += len(self.FUNCTION_END)
            functions = [*cur.done, Function(cur.name, cur.pairs, cur.begin, i)]
            j = skip_space(text, i)
            if text.startswith(self.FUNCTION, j):
                return self._function(text, j, functions)
            if text.startswith(self.END, j):
                return Reading(j + len(self.END), functions)
            if j == len(text):
                return Reading(j, functions)  # only </tool_call> missing at the very end
            found = text[j : j + 20]
            return Malformed(
                f"{self.FUNCTION_END} is followed by {found!r} instead of {self.END}",
                name=cur.name,
                truncated=ran_out(text, j, self.END, self.FUNCTION),
            )
        if not text.startswith(self.PARAMETER, i):
            found = text[i : i + 20]
            return Malformed(
                f"expected {self.PARAMETER}NAME> or {self.FUNCTION_END} but found {found!r}",
                name=cur.name,
                truncated=ran_out(text, i, self.PARAMETER, self.FUNCTION_END),
            )
        try:
            param, v = self._tag_name(text, i + len(self.PARAMETER), cur.name)
        except Malformed as e:
            return e
        cur.i = v
        return Value(cur, param)

    def _clean(self, value: str) -> str:
        """One newline is removed at each end (the template writes the value on its own
        lines)."""
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        return value

    def _opens(self, text: str, o: int, v: int, nested: int) -> bool:
        """At the start of the value, after a nested `</parameter>`, or after a
        `<function=NAME>` tag inside the value; and a whole tag."""
        gt = text.find(">", o)
        if gt < 0 or text.find("\n", o, gt) >= 0:
            return False
        k = o
        while k > v and text[k - 1].isspace():
            k -= 1
        if k in (v, nested):
            return True
        f = text.rfind(self.FUNCTION, v, k)
        return f >= 0 and text.find(">", f, k) == k - 1 and "\n" not in text[f:k]

    def _tag_name(self, text: str, i: int, tool: str | None) -> tuple[str, int]:
        """The NAME of `<function=NAME>` / `<parameter=NAME>` from `i`, and the index after `>`."""
        gt = text.find(">", i)
        newline = text.find("\n", i)
        if gt < 0 or 0 <= newline < gt:
            what = "tool name" if tool is None else "parameter name"
            raise Malformed(f"the {what} is not closed with '>'", name=tool, truncated=gt < 0)
        return text[i:gt].strip(), gt + 1

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        parts = [content] if content else []
        for name, args in calls:
            params = "".join(
                f"{self.PARAMETER}{k}>\n{_template_text(v)}\n{self.PARAMETER_END}\n"
                for k, v in args.items()
            )
            parts.append(
                f"{self.START}\n{self.FUNCTION}{name}>\n{params}{self.FUNCTION_END}\n{self.END}"
            )
        return "\n".join(parts)


def _template_text(value: Any) -> str:
    """A value as Qwen3-Coder's chat template writes it: JSON for objects and arrays, else
    Python's `str` (so booleans come out as `True`/`False`)."""
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
