"""Kimi K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX
<|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>`.

vLLM (`kimi_k2`, KimiK2ToolParser): a DOTALL regex over the whole output wanting an id of the
form `[^<]+:\\d+`; the name is `id.split(":")[0].split(".")[-1]` (so a dotted tool name loses
its head), the id is returned as is (so a `functions.x:0` written again in a later turn
repeats an id of the trajectory) and the argument text is passed on unchecked. Any exception makes
the whole output content. Content is the text before the section. Streaming also accepts the
singular `<|tool_call_section_begin|>` / `_end|>` variants.

We differ: the name is the id without the `functions.` prefix and the `:IDX` suffix (an id
without an index is accepted too); the model's id is kept when new in this parser's
trajectory, otherwise it is renumbered `functions.NAME:N` with the trajectory's call count, so
ids stay unique and in Kimi's own shape; arguments are decoded and must be an object; a bad
call is reported alone; both section-marker spellings are accepted.
"""

from __future__ import annotations

import json
import re
from typing import Any

from clotho.chat.parsers.base import Malformed
from clotho.chat.parsers.sections import SectionParser

_ID = re.compile(r"(?:functions\.)?(?P<name>.*?)(?::\d+)?", re.DOTALL)


class KimiK2Parser(SectionParser):
    name = "kimi_k2"
    SECTION_BEGINS = ("<|tool_calls_section_begin|>", "<|tool_call_section_begin|>")
    SECTION_ENDS = ("<|tool_calls_section_end|>", "<|tool_call_section_end|>")
    CALL_BEGIN = "<|tool_call_begin|>"
    CALL_END = "<|tool_call_end|>"
    ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
    markers = (*SECTION_BEGINS, *SECTION_ENDS, CALL_BEGIN, CALL_END, ARGUMENT_BEGIN)
    format_hint = (
        "Write the calls as <|tool_calls_section_begin|><|tool_call_begin|>functions.<tool "
        "name>:<call number><|tool_call_argument_begin|>{<arguments as a JSON object>}"
        "<|tool_call_end|><|tool_calls_section_end|>."
    )

    def _reused_id(self, model_id: str, name: str, n: int) -> str:
        return f"functions.{name}:{n - 1}"

    def _read_call(self, text: str, body: int) -> tuple[str, Any, str | None, int]:
        arg = self._marker(text, self.ARGUMENT_BEGIN, body, self.ARGUMENT_BEGIN)
        model_id = text[body:arg].strip()
        if not model_id:
            raise Malformed(
                f"the call id (functions.<tool name>:<n>) before {self.ARGUMENT_BEGIN} is missing"
            )
        name = _ID.fullmatch(model_id).group("name")  # type: ignore[union-attr]
        args, end = self._arguments(text, arg + len(self.ARGUMENT_BEGIN), name)
        return name, args, model_id, end

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        body = "".join(
            f"{self.CALL_BEGIN}functions.{name}:{i}{self.ARGUMENT_BEGIN}"
            f"{json.dumps(args, ensure_ascii=False)}{self.CALL_END}"
            for i, (name, args) in enumerate(calls)
        )
        return f"{content or ''}{self.SECTION_BEGINS[0]}{body}{self.SECTION_ENDS[0]}"
