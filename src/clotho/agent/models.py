"""One place that turns a `ModelConfig` into what the agent loop talks to."""

from __future__ import annotations

from typing import Any

from clotho.agent.token_model import TokenModel
from clotho.chat.client import ChatClient, ModelConfig, SamplingParams
from clotho.chat.tokens import TokenSampling
from clotho.errors import ConfigError

DEFAULT_MAX_TOKENS = 1024


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


def build_model(config: ModelConfig) -> Any:
    """A `ChatClient` (api=chat) or a `TokenModel` (vllm, sglang, local). Both have `aclose`."""
    if config.api == "chat":
        return ChatClient(config)
    sampling = token_sampling(config.sampling)
    if config.api == "local":
        from clotho.chat.local_model import load_embedded_model

        client, tokenizer = load_embedded_model()
        context = config.max_context_tokens or getattr(client, "n_ctx", None)
    else:
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
    return TokenModel(
        client,
        tokenizer,
        tool_parser=config.tool_parser,
        sampling=sampling,
        max_context_tokens=context,
        on_break=config.on_template_break,
        template_kwargs=config.template_kwargs,
    )
