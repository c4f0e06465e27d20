"""What a tool gets when it runs: the rollout's sandbox and output limits."""

from __future__ import annotations

from dataclasses import dataclass

from clotho.sandbox.base import Sandbox


class ToolFailure(Exception):
    """A tool could not do what was asked; the message is shown to the model as is."""


@dataclass
class ToolRuntime:
    sandbox: Sandbox
    max_output_chars: int = 16_000
    default_timeout_s: float = 180.0
    max_timeout_s: float = 1800.0


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and the tail of `text`, with an explicit marker where the middle was."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters truncated ...]\n{text[-tail:]}"
