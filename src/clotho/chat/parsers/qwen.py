"""Qwen2.5 / Qwen3: the Hermes tags, `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`.

vLLM has no separate Qwen parser in its registry: Qwen2.5 and Qwen3 are served with `hermes`
(an old `qwen2` parser never landed), so upstream behaviour and our differences are those in
`clotho.chat.parsers.hermes`. The name exists so a model's config can say what it is.
"""

from __future__ import annotations

from clotho.chat.parsers.hermes import HermesParser


class QwenParser(HermesParser):
    name = "qwen"
