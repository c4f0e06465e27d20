"""What the agent loop talks to, and the one place that turns a `ModelConfig` into it.

A `Model` is shared by every rollout and gives each rollout a `ModelSession`: a `ChatClient` is
its own session (an endpoint keeps no per-rollout state); a `TokenModel` gives a fresh
`TokenChatSession` with the rollout's token ledger. A session's `complete` returns a parsed
`ModelTurn`; `sequences` returns the rollout's exact training sequences (token backends) or
None (chat endpoints).

`build_model` is async because loading is slow: the embedded llama.cpp model (~2.5 s), its
GGUF tokenizer (~3.7 s), a `tokenizer.json` with its template, even an HTTP client's TLS
context (~30 ms) are loaded in a worker thread, the one edge where blocking work leaves the
event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from clotho.chat.client import ChatClient, ModelConfig, SamplingParams
from clotho.chat.ledger import TokenSequence
from clotho.chat.token_model import TokenModel
from clotho.chat.tokens import TokenClient, TokenSampling
from clotho.chat.types import ModelTurn
from clotho.errors import ConfigError

DEFAULT_MAX_TOKENS = 1024
# The embedded model runs on this CPU at about 100 tokens/s and one context serves every
# rollout in turn: a shorter default reply keeps `clotho eval --agent llm` to minutes.
EMBEDDED_DEFAULT_MAX_TOKENS = 256


class ModelSession(Protocol):
    """One rollout's view of a model."""

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ModelTurn:
        """The next assistant turn for the conversation so far, parsed."""
        ...

    def sequences(self, messages: Sequence[dict[str, Any]]) -> list[TokenSequence] | None:
        """The exact training sequences of the rollout (token backends), else None."""
        ...


class Model(Protocol):
    """A model shared by many rollouts; each rollout talks to its own session."""

    def session(self) -> ModelSession: ...

    async def aclose(self) -> None: ...


def token_sampling(params: SamplingParams) -> TokenSampling:
    """Chat sampling settings as a token backend takes them."""
    if params.stop:
        raise ConfigError(
            "stop strings are not supported with token APIs (the stop is the template's "
            "end-of-turn token); remove sampling.stop"
        )
    extra = params.model_extra or {}
    return TokenSampling(
        max_tokens=params.max_tokens or DEFAULT_MAX_TOKENS,
        temperature=1.0 if params.temperature is None else params.temperature,
        top_p=1.0 if params.top_p is None else params.top_p,
        top_k=int(extra.get("top_k") or 0),
        seed=params.seed,
    )


async def build_model(config: ModelConfig) -> ChatClient | TokenModel:
    """A `ChatClient` (api=chat) or a `TokenModel` (vllm, sglang, local), loaded off the loop."""
    return await asyncio.to_thread(load_model, config)


def load_model(config: ModelConfig) -> ChatClient | TokenModel:
    """`build_model`'s blocking half: seconds for a token backend's model and tokenizer, tens
    of milliseconds for a chat client's TLS context. Call it from a worker thread, or before
    an event loop runs."""
    if config.api == "chat":
        return ChatClient(config)
    sampling = token_sampling(config.sampling)
    client: TokenClient
    if config.api == "local":
        if config.sampling.max_tokens is None:
            sampling = sampling.model_copy(update={"max_tokens": EMBEDDED_DEFAULT_MAX_TOKENS})
        from clotho.chat.local_model import load_embedded_model

        client, tokenizer = load_embedded_model()
        context = config.max_context_tokens or client.n_ctx
    elif config.api in ("vllm", "sglang"):
        from clotho.chat.token_http import token_client_for
        from clotho.chat.tokenizer import TemplateTokenizer

        if not config.tokenizer:
            raise ConfigError(
                f"api {config.api!r} needs the model's tokenizer: set model.tokenizer to its "
                "tokenizer.json or folder (--tokenizer)"
            )
        tokenizer = TemplateTokenizer.from_path(
            config.tokenizer, chat_template=config.chat_template
        )
        client = token_client_for(config.api, config)
        context = config.max_context_tokens
    else:
        raise ConfigError(f"api {config.api!r} is not a token API (vllm, sglang, local)")
    return TokenModel(
        client,
        tokenizer,
        tool_parser=config.tool_parser,
        sampling=sampling,
        max_context_tokens=context,
        on_break=config.on_template_break,
        template_kwargs=config.template_kwargs,
    )
