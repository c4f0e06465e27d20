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
string. A parameter value ends at the first `</parameter>` (so it may contain `<parameter=`
and `</function>`); a value without `</parameter>` is an error; `<function=` outside
`<tool_call>` is content; a call cut off is an error (a complete `</function>` whose
`</tool_call>` is missing at the very end is accepted); content is all text outside calls.
Booleans may be written `true`/`True` (the chat template writes Python's `True`).
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import (
    Malformed,
    ToolCallParser,
    Turn,
    error_extent,
    ran_out,
    scan_blocks,
    skip_space,
)
from clotho.chat.parsers.xml_args import typed_arguments


class Qwen3CoderParser(ToolCallParser):
    name = "qwen3_coder"
    START = "<tool_call>"
    END = "</tool_call>"
    FUNCTION = "<function="
    FUNCTION_END = "</function>"
    PARAMETER = "<parameter="
    PARAMETER_END = "</parameter>"
    markers = (START, END, FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END)
    format_hint = (
        "Write each call as <tool_call>\n<function=TOOL_NAME>\n<parameter=PARAMETER_NAME>\n"
        "value\n</parameter>\n</function>\n</tool_call>, one <parameter> block per argument, "
        "with values of the type the tool's schema gives (JSON for objects and arrays)."
    )

    def _scan(self, text: str, turn: Turn) -> None:
        scan_blocks(text, turn, self.START, self._call)

    def _call(self, text: str, start: int, turn: Turn) -> int:
        body = start + len(self.START)
        try:
            functions, end = self._read(text, body)
        except Malformed as e:
            stop, cut = error_extent(text, body, self.END, (self.START,), e.truncated)
            turn.error(text[start:stop], e.problem, e.name, truncated=cut)
            return stop
        for name, args, raw in functions:
            turn.call(name, args, text[start:end] if len(functions) == 1 else raw)
        return end

    def _read(self, text: str, body: int) -> tuple[list[tuple[str, dict[str, Any], str]], int]:
        functions = []
        i = skip_space(text, body)
        if not text.startswith(self.FUNCTION, i):
            raise Malformed(
                f"{self.START} must be followed by {self.FUNCTION}TOOL_NAME>",
                truncated=ran_out(text, i, self.FUNCTION),
            )
        while text.startswith(self.FUNCTION, i):
            begin = i
            name, i = self._tag_name(text, i + len(self.FUNCTION), None)
            pairs: list[tuple[str, str]] = []
            while True:
                i = skip_space(text, i)
                if text.startswith(self.FUNCTION_END, i):
                    i += len(self.FUNCTION_END)
                    break
                if not text.startswith(self.PARAMETER, i):
                    found = text[i : i + 20]
                    raise Malformed(
                        f"expected {self.PARAMETER}NAME> or {self.FUNCTION_END} but found {found!r}",
                        name=name,
                        truncated=ran_out(text, i, self.PARAMETER, self.FUNCTION_END),
                    )
                param, i = self._tag_name(text, i + len(self.PARAMETER), name)
                close = text.find(self.PARAMETER_END, i)
                if close < 0:
                    raise Malformed(
                        f"parameter {param!r} is not closed with {self.PARAMETER_END}",
                        name=name,
                        truncated=True,  # a value runs until its closing tag: here, the end
                    )
                value = text[i:close]
                if value.startswith("\n"):
                    value = value[1:]
                if value.endswith("\n"):
                    value = value[:-1]
                pairs.append((param, value))
                i = close + len(self.PARAMETER_END)
            functions.append((name, typed_arguments(self.schemas, name, pairs), text[begin:i]))
            i = skip_space(text, i)
        if text.startswith(self.END, i):
            return functions, i + len(self.END)
        if i == len(text):
            return functions, i  # only </tool_call> missing at the very end
        found = text[i : i + 20]
        raise Malformed(
            f"{self.FUNCTION_END} is followed by {found!r} instead of {self.END}",
            truncated=ran_out(text, i, self.END, self.FUNCTION),
        )

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
