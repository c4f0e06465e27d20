# ruff: noqa: RUF001, RUF002 -- DeepSeek's special tokens are spelled with U+FF5C and U+2581.
"""DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}
<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`, calls chained with no separator.

vLLM (`deepseek_v31`, DeepSeekV31ToolParser): one regex,
`<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>`, without DOTALL, so a call
whose arguments contain a newline does not match and silently disappears; the argument text
is passed on unchecked. Content is the text before `<｜tool▁calls▁begin｜>`.

We differ: arguments are decoded with a JSON decoder, so multi-line arguments parse, and must
be an object (a ```json fence, the V3 habit, is tolerated; nothing at all means no
arguments); a call that cannot be read is an error and the others stand; text after the
section is content too. Registered as `deepseek_v3_1` (vLLM says `deepseek_v31`).
"""

from __future__ import annotations

import json
from typing import Any

from clotho.chat.parsers.base import Malformed
from clotho.chat.parsers.deepseek_v3 import DeepSeekV3Parser


class DeepSeekV31Parser(DeepSeekV3Parser):
    name = "deepseek_v3_1"
    format_hint = (
        "Write the calls as <｜tool▁calls▁begin｜><｜tool▁call▁begin｜><tool name><｜tool▁sep｜>"
        "{<arguments as a JSON object>}<｜tool▁call▁end｜><｜tool▁calls▁end｜>."
    )

    def _read_call(self, text: str, body: int) -> tuple[str, Any, str | None, int]:
        sep = self._marker(text, self.SEP, body, self.SEP)
        name = text[body:sep].strip()
        args, end = self._arguments(text, sep + len(self.SEP), name)
        if not name:
            raise Malformed(f"the tool name before {self.SEP} is missing")
        return name, args, None, end

    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        body = "".join(
            f"{self.CALL_BEGIN}{name}{self.SEP}{json.dumps(args, ensure_ascii=False)}{self.CALL_END}"
            for name, args in calls
        )
        return f"{content or ''}{self.SECTION_BEGINS[0]}{body}{self.SECTION_ENDS[0]}"
