"""Llama 4 JSON tool calls: the Llama 3 JSON format.

vLLM registers `llama4_json` to the same Llama3JsonToolParser as `llama3_json` (see
`clotho.chat.parsers.llama3_json` for its behaviour and our differences). vLLM's Llama 4 JSON
chat template writes the calls back to back with no separator, right after any content. We
read calls written back to back, and render them so, but put `<|python_tag|>` between content
and calls: here only JSON at the start or after the tag is a call, so JSON written straight
after prose stays content.
"""

from __future__ import annotations

from clotho.chat.parsers.llama3_json import Llama3JsonParser


class Llama4JsonParser(Llama3JsonParser):
    name = "llama4_json"
    SEPARATOR = ""
