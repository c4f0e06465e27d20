"""GLM-4.7: the GLM-4.5 tags with nothing between the parts:
`<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`.

vLLM (`glm47`, and now `glm45` too: Glm47MoeModelToolParser) subclasses the GLM-4.5 parser
with `<tool_call>(.*?)(<arg_key>.*?)?</tool_call>` (no newline needed after the name; the name
is not stripped, so a newline before the first `<arg_key>` stays in it) and lets whitespace or
a literal `\\n` separate a key from its value. The rest is the GLM-4.5 behaviour.

Ours is the GLM-4.5 parser (`clotho.chat.parsers.glm45`, same differences), which already
reads both spellings; this name renders without newlines, as GLM-4.7 writes.
"""

from __future__ import annotations

from clotho.chat.parsers.glm45 import Glm45Parser


class Glm47Parser(Glm45Parser):
    name = "glm47"
    NEWLINE = ""
    format_hint = (
        "Write each call as <tool_call>TOOL_NAME<arg_key>PARAMETER_NAME</arg_key>"
        "<arg_value>value</arg_value></tool_call>, one key and value per argument, with values "
        "of the type the tool's schema gives (JSON for objects and arrays)."
    )
