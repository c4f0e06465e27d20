"""LongCat-Flash: `<longcat_tool_call>{"name": ..., "arguments": ...}</longcat_tool_call>`.

vLLM (`longcat`, LongcatFlashToolParser) subclasses the Hermes parser and only swaps the tags,
so it has the Hermes behaviour and faults (see `clotho.chat.parsers.hermes`); ours is the
Hermes parser with these tags, with the same differences.
"""

from __future__ import annotations

from clotho.chat.parsers.tagged_json import TaggedJsonParser


class LongcatParser(TaggedJsonParser):
    name = "longcat"
    START = "<longcat_tool_call>"
    END = "</longcat_tool_call>"
    markers = (START, END)
    format_hint = (
        'Write each call as <longcat_tool_call>{"name": "<tool name>", "arguments": '
        "{<arguments as a JSON object>}}</longcat_tool_call>."
    )
