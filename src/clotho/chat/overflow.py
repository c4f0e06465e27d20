"""Recognising a model server's "the conversation no longer fits" answer.

An agent that floods its own context (a huge tool output it asked for, endless turns) has hit
a limit of its own making: that is the agent's failure, scored, never an infrastructure
error that is retried and left out of the pass rate. Servers word it differently; these are
the answers of OpenAI-compatible APIs, vLLM, SGLang, llama.cpp's server and TGI.
"""

from __future__ import annotations

import re

from clotho.errors import AgentLimit

# Matched case-insensitively against the error reply's text (its JSON as sent).
_OVERFLOW = re.compile(
    "|".join(
        [
            r"context_length_exceeded",  # OpenAI's error code
            r"maximum context length",  # OpenAI, vLLM ("This model's maximum context length is")
            r"exceeds? (?:the )?(?:model'?s? )?(?:maximum )?(?:context|model) (?:length|size)",
            r"longer than the (?:maximum model length|model'?s context length)",  # vLLM, SGLang
            r"exceed_context_size_error",  # llama.cpp's server
            r"exceeds the available context size",  # llama.cpp's server
            r"context (?:size|window) (?:exceeded|is full)",
            r"prompt is too long",
            r"inputs` tokens \+ `max_new_tokens` must be",  # TGI
            r"does not fit the context of",  # clotho serve-model (the embedded model)
        ]
    ),
    re.IGNORECASE,
)

# Statuses servers answer an overflow with: 400 (most), 413 and 422 (some proxies, TGI).
_STATUSES = frozenset({400, 413, 422})


class ContextOverflow(AgentLimit):
    """The server refused the request because the conversation exceeds its context."""


def is_context_overflow(status: int, text: str) -> bool:
    """Whether an error reply says the prompt (plus the reply's room) exceeds the context."""
    return status in _STATUSES and _OVERFLOW.search(text) is not None
