"""Pull a model's reasoning out of the places providers put it."""

from __future__ import annotations

import re
from typing import Any

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


def split_reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """Return (reasoning, content without <think> blocks).

    Looks at `reasoning_content` (vLLM, DeepSeek), `reasoning` (OpenRouter, Ollama),
    `reasoning_details[].text` (OpenRouter) and `<think>...</think>` in the content, in that
    order; think blocks are always removed from the content.
    """
    content = message.get("content")
    if isinstance(content, list):  # content parts: keep the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    think_parts: list[str] = []
    if isinstance(content, str) and "<think>" in content:
        think_parts = [m.strip() for m in _THINK.findall(content)]
        content = _THINK.sub("", content).strip()
    elif isinstance(content, str) and "</think>" in content:
        # Some templates open the think block in the prompt: only the closing tag is generated.
        head, _, content = content.partition("</think>")
        think_parts = [head.strip()]
        content = content.strip()
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if not reasoning:
        details = message.get("reasoning_details") or []
        texts = [d.get("text") for d in details if isinstance(d, dict) and d.get("text")]
        reasoning = "\n".join(texts) if texts else None
    if not reasoning and think_parts:
        reasoning = "\n".join(p for p in think_parts if p) or None
    return (reasoning if isinstance(reasoning, str) else None), content
