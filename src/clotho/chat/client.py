"""`ChatClient`: OpenAI-compatible chat completions with tools (phase 1).

Works with any `/v1/chat/completions` server (vLLM, SGLang, OpenRouter, OpenAI). Balancing
and retries live in `clotho.chat.http`: what still fails becomes a `ModelError`. The reply is
read once, here, into a `ModelTurn`: reasoning split off, tool-call arguments parsed from
their JSON text (a model's malformed arguments are kept with the error, never retried).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from clotho.chat.http import DEFAULT_MAX_REPLY_BYTES, DEFAULT_REQUEST_TIMEOUT_S, BalancedPoster
from clotho.chat.reasoning import split_reasoning
from clotho.chat.types import InvalidToolCall, ModelTurn, ToolCall, Usage
from clotho.errors import ConfigError


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    temperature: float | None = 1.0
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None


ModelApi = Literal["chat", "vllm", "sglang", "local"]
EMBEDDED_MODEL = "SmolLM2-135M-Instruct"


class ModelConfig(BaseModel):
    """A model endpoint. `api` picks the protocol: OpenAI chat (phase 1), or token-in/token-out
    (phase 2: vLLM, SGLang, or `local`, the embedded llama.cpp model) with exact token ids."""

    model_config = ConfigDict(extra="forbid")

    model: str = EMBEDDED_MODEL
    api: ModelApi = Field(
        None,  # type: ignore[assignment]  # resolved by _default_api
        description="chat: /v1/chat/completions; vllm: /v1/completions with token ids; "
        "sglang: /generate; local: the embedded SmolLM2 model, in-process. Default: chat "
        "when a base_url or another model is given, else local",
        validate_default=False,
    )
    tokenizer: str | None = Field(
        None, description="token APIs: tokenizer.json or its folder (with the chat template)"
    )
    chat_template: str | None = Field(
        None, description="token APIs: a Jinja template file, instead of the tokenizer's own"
    )
    tool_parser: str = Field("hermes", description="token APIs: the model's tool-call format")
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="token APIs: extra template variables (enable_thinking)"
    )
    on_template_break: Literal["split", "error"] = Field(
        "split",
        description="token APIs: a template that rewrites earlier turns splits the trajectory "
        "into several training sequences (split) or fails the rollout (error)",
    )
    max_context_tokens: int | None = Field(
        None,
        gt=0,
        description="token APIs: the model's context; a full context ends the run as "
        "token_limit. Unset: the server's max_model_len (GET /v1/models), read once",
    )
    base_url: str | list[str] = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", description="name of the environment variable holding the key"
    )
    timeout_s: float = Field(
        600.0, gt=0, description="each read (and the connection): seconds without a byte"
    )
    request_timeout_s: float = Field(
        DEFAULT_REQUEST_TIMEOUT_S,
        gt=0,
        description="each request as a whole, however its bytes trickle in (a reply dripping "
        "in, a generation that does not end); then a ModelError. Default: 1800, or timeout_s "
        "if that is longer",
    )
    max_reply_bytes: int = Field(
        DEFAULT_MAX_REPLY_BYTES,
        ge=1024,
        description="largest reply body, counted while it streams in (after decompression); "
        "more stops the read with a ModelError",
    )
    max_retries: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    unhealthy_cooldown_s: float = 30.0
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("base_url")
    @classmethod
    def _urls(cls, value: str | list[str]) -> str | list[str]:
        """An endpoint is an http(s) URL with a host: a typo is refused now, not retried as
        an unreachable server for the whole run."""
        for url in [value] if isinstance(value, str) else value:
            try:
                parsed = httpx.URL(url)
            except (httpx.InvalidURL, TypeError) as exc:
                raise ValueError(f"{url!r} is not a URL: {exc}") from exc
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise ValueError(
                    f"{url!r} is not an http(s) URL with a host (e.g. http://127.0.0.1:8000/v1)"
                )
        return value

    @model_validator(mode="after")
    def _default_api(self) -> ModelConfig:
        """No protocol named: an endpoint or a model name means chat, neither the embedded model."""
        if self.api is None:
            named = "base_url" in self.model_fields_set or self.model != EMBEDDED_MODEL
            self.api = "chat" if named else "local"
        if "request_timeout_s" not in self.model_fields_set:
            # a config that raised timeout_s past the default means long requests
            self.request_timeout_s = max(self.request_timeout_s, self.timeout_s)
        return self

    @property
    def base_urls(self) -> list[str]:
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)
        if not urls:
            raise ConfigError("model.base_url needs at least one URL")
        return [u.rstrip("/") for u in urls]


class EndpointClient:
    """A client of one model config's endpoints: the retrying, balancing poster, and closing it."""

    def __init__(
        self,
        config: ModelConfig,
        *,
        api_key: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self._poster = BalancedPoster(
            config.base_urls,
            api_key_env=config.api_key_env,
            api_key=api_key,
            environ=environ,
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            backoff_initial_s=config.backoff_initial_s,
            backoff_max_s=config.backoff_max_s,
            unhealthy_cooldown_s=config.unhealthy_cooldown_s,
            max_reply_bytes=config.max_reply_bytes,
            request_timeout_s=config.request_timeout_s,
        )

    async def aclose(self) -> None:
        await self._poster.aclose()


class ChatClient(EndpointClient):
    """A `Model` and its own `ModelSession`: a chat endpoint keeps no state per rollout."""

    def build_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if tools:
            body["tools"] = tools
        body.update(self.config.sampling.model_dump(exclude_none=True))
        body.update(self.config.extra_body)
        return body

    def session(self) -> ChatClient:
        return self

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ModelTurn:
        turn, latency = await self._poster.post(
            "chat/completions", self.build_body(messages, tools), _parse_completion
        )
        turn.latency_s = latency
        return turn

    def sequences(self, messages: Sequence[dict[str, Any]]) -> None:
        """No exact tokens from a chat endpoint (scored data re-tokenizes with the template)."""
        return None


def _parse_completion(data: Any) -> ModelTurn:
    choice = data["choices"][0]
    message = choice["message"]
    if not isinstance(message, dict):
        raise TypeError("message is not an object")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise TypeError("usage is not an object")
    counts = Usage(**{k: int(usage.get(k) or 0) for k in Usage.model_fields})
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise TypeError("tool_calls is not a list")
    calls: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for raw in raw_calls:
        function = raw.get("function") if isinstance(raw, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str):
            error = "the tool call has no function name"
            invalid.append(InvalidToolCall(text=json.dumps(raw, ensure_ascii=False), error=error))
            continue
        call_id = raw.get("id") if isinstance(raw.get("id"), str) else None
        calls.append(ToolCall.from_arguments(call_id, name, function.get("arguments")))
    reasoning, content = split_reasoning(message)
    return ModelTurn(
        content=content or "",
        reasoning=reasoning,
        tool_calls=calls,
        invalid_tool_calls=invalid,
        finish_reason=choice.get("finish_reason"),
        usage=counts,
        model=data.get("model"),
    )
