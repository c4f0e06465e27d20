# ruff: noqa: RUF001, RUF002 -- DeepSeek's special tokens are spelled with U+FF5C and U+2581.
"""DeepSeek V3 / R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
```json
{...}
```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>` (calls separated by a newline).

vLLM (`deepseek_v3`, DeepSeekV3ToolParser): one regex per call,
`<｜tool▁call▁begin｜>(.*)<｜tool▁sep｜>(.*)\\n```json\\n(.*)\\n```<｜tool▁call▁end｜>`, without
DOTALL, so arguments spanning several lines (any pretty-printed JSON, any multi-line string
written raw) never match and the call silently disappears; the argument text is passed on
unchecked. Content is the text before `<｜tool▁calls▁begin｜>`.

We differ: arguments are decoded with a JSON decoder, so they may span lines and contain the
markers, and must be an object; the fence is optional; a call that cannot be read is an error
(not dropped) and the other calls stand; text after the section is content too.
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import Malformed, skip_space
from clotho.chat.parsers.sections import FENCE, SectionParser


class DeepSeekV3Parser(SectionParser):
    name = "deepseek_v3"
    SECTION_BEGINS = ("<｜tool▁calls▁begin｜>",)
    SECTION_ENDS = ("<｜tool▁calls▁end｜>",)
    CALL_BEGIN = "<｜tool▁call▁begin｜>"
    CALL_END = "<｜tool▁call▁end｜>"
    SEP = "<｜tool▁sep｜>"
    markers = (*SECTION_BEGINS, *SECTION_ENDS, CALL_BEGIN, CALL_END, SEP)
    format_hint = (
        "Write the calls as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        "<tool name>\n```json\n{<arguments as a JSON object>}\n```<｜tool▁call▁end｜>"
        "<｜tool▁calls▁end｜>."
    )

    def _read_call(self, text: str, body: int) -> tuple[str, Any, str | None, int]:
        sep = self._marker(text, self.SEP, body, self.SEP)
        i = sep + len(self.SEP)
        ends = [j for j in (text.find("\n", i), text.find(FENCE, i), text.find("{", i)) if j >= 0]
        name_end = min(ends) if ends else len(text)
        name = text[i:name_end].strip()
        args, end = self._arguments(text, skip_space(text, name_end), name)
        if not name:
            raise Malformed(f"the tool name after {self.SEP} is missing")
        return name, args, None, end

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        body = "\n".join(
            f"{self.CALL_BEGIN}function{self.SEP}{name}\n{FENCE}json\n"
            f"{json.dumps(args, ensure_ascii=False)}\n{FENCE}{self.CALL_END}"
            for name, args in calls
        )
        return f"{content or ''}{self.SECTION_BEGINS[0]}{body}{self.SECTION_ENDS[0]}"
