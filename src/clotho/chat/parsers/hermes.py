"""Hermes 2 Pro style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

vLLM (`hermes`, Hermes2ProToolParser): finds `<tool_call>(.*?)</tool_call>` or an unclosed
`<tool_call>(.*)` at the end (DOTALL), `json.loads` each body, and `json.dumps` the
`arguments` value back into a string, so a string-valued `arguments` is encoded twice. Any
failure (one bad call, a missing key) drops every call of the turn and returns the whole
text as content. Content is only the text before the first `<tool_call>`.

We differ: a bad call is reported alone and the others stand; a string `arguments` is decoded
once and must hold an object; missing `arguments` means no arguments; `parameters` is read like
`arguments`; content is all text outside calls (the text after the calls too). Like vLLM, a
complete JSON object whose `</tool_call>` is missing at the very end of the text is a call; a
body cut off mid-JSON is an error, not content. The JSON decoder, not a search for
`</tool_call>`, decides where the body ends, so arguments may contain the tags.
"""

from __future__ import annotations

from clotho.chat.parsers.tagged_json import TaggedJsonParser


class HermesParser(TaggedJsonParser):
    name = "hermes"
    START = "<tool_call>"
    END = "</tool_call>"
    markers = (START, END)
    format_hint = (
        'Write each call as <tool_call>{"name": "<tool name>", "arguments": {<arguments as a '
        "JSON object>}}</tool_call>."
    )
