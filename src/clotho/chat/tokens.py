"""Token-in / token-out generation (phase 2): the interface every token backend implements.

A `TokenClient` takes prompt token ids and returns the ids it sampled, each with the logprob
the sampler saw, so training data holds exactly what the model produced. Backends: vLLM and
SGLang over HTTP (`clotho.chat.token_http`) and the embedded llama.cpp model
(`clotho.chat.local_model`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length"]

# A position that is not trained on (prompt, tool output): the label trainers ignore.
MASKED = -100
# The logprob placed at positions the model did not sample (a trainer never reads it).
NOT_SAMPLED = 1.0


class TokenSampling(BaseModel):
    """What a token backend needs to sample one assistant turn."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: list[int] = Field(
        default_factory=list, description="end-of-turn ids; a stop id is sampled and returned"
    )


class Generation(BaseModel):
    """One sampled continuation: ids and their logprobs, position by position."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    latency_s: float = 0.0

    def model_post_init(self, _context: object) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


@runtime_checkable
class TokenClient(Protocol):
    """Generates from token ids. Errors that survive retries are `ModelError`s."""

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation: ...

    async def aclose(self) -> None: ...
