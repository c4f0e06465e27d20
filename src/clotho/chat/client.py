"""`ChatClient`: OpenAI-compatible chat completions with tools (phase 1).

Works with any `/v1/chat/completions` server (vLLM, SGLang, OpenRouter, OpenAI). Several
base URLs are balanced round-robin; an endpoint that fails is skipped for a cool-down.
429, 5xx, malformed bodies and connection errors are retried with exponential backoff;
what still fails becomes a `ModelError`, an infrastructure error, never an agent failure.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from clotho.chat.types import ChatResponse, Usage
from clotho.errors import ConfigError, ModelError


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="allow")

    temperature: float | None = 1.0
    top_p: float | None = None
    max_tokens: int | None = None
    stop: list[str] | None = None
    seed: int | None = None


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    base_url: str | list[str] = "http://127.0.0.1:8000/v1"
    api_key_env: str | None = Field(
        "OPENAI_API_KEY", description="name of the environment variable holding the key"
    )
    timeout_s: float = Field(600.0, description="per request")
    max_retries: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    unhealthy_cooldown_s: float = 30.0
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    extra_body: dict[str, Any] = Field(default_factory=dict)

    @property
    def base_urls(self) -> list[str]:
        urls = [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)
        if not urls:
            raise ConfigError("model.base_url needs at least one URL")
        return [u.rstrip("/") for u in urls]


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Endpoint:
    def __init__(self, url: str) -> None:
        self.url = url
        self.unhealthy_until = 0.0


class ChatClient:
    def __init__(
        self,
        config: ModelConfig,
        *,
        api_key: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        if api_key is None and config.api_key_env:
            api_key = (environ if environ is not None else os.environ).get(config.api_key_env)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=min(10.0, config.timeout_s)),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        self._endpoints = [_Endpoint(u) for u in config.base_urls]
        self._next = 0

    def _pick(self) -> _Endpoint:
        now = time.monotonic()
        n = len(self._endpoints)
        for i in range(n):
            endpoint = self._endpoints[(self._next + i) % n]
            if endpoint.unhealthy_until <= now:
                self._next = (self._next + i + 1) % n
                return endpoint
        # Everything is cooling down: try the one that recovers first.
        return min(self._endpoints, key=lambda e: e.unhealthy_until)

    def _wait(self, state: RetryCallState) -> float:
        initial, cap = self.config.backoff_initial_s, self.config.backoff_max_s
        # Exponential from `initial`, with jitter of the same scale so small settings stay small.
        backoff = min(
            cap, (wait_exponential(multiplier=initial, max=cap) + wait_random(0, initial))(state)
        )
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return max(backoff, min(exc.retry_after, self.config.backoff_max_s))
        return backoff

    def build_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": messages}
        if tools:
            body["tools"] = tools
        body.update(self.config.sampling.model_dump(exclude_none=True))
        body.update(self.config.extra_body)
        return body

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ChatResponse:
        body = self.build_body(messages, tools)
        attempts = self.config.max_retries + 1
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=self._wait,
                retry=retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:
                    return await self._post(self._pick(), body)
        except _Retryable as exc:
            raise ModelError(f"model request failed after {attempts} attempts: {exc}") from exc
        raise AssertionError("unreachable")

    async def _post(self, endpoint: _Endpoint, body: dict[str, Any]) -> ChatResponse:
        url = f"{endpoint.url}/chat/completions"
        started = time.perf_counter()
        try:
            response = await self._http.post(url, json=body)
        except httpx.TransportError as exc:
            endpoint.unhealthy_until = time.monotonic() + self.config.unhealthy_cooldown_s
            raise _Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            if response.status_code >= 500:
                endpoint.unhealthy_until = time.monotonic() + self.config.unhealthy_cooldown_s
            retry_after = _parse_retry_after(response.headers.get("retry-after"))
            raise _Retryable(
                f"{url}: HTTP {response.status_code}: {response.text[:300]}", retry_after
            )
        if response.status_code >= 400:
            raise ModelError(f"{url}: HTTP {response.status_code}: {response.text[:500]}")
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
            usage = data.get("usage") or {}
            if not isinstance(usage, dict):
                raise TypeError("usage is not an object")
            counts = Usage(**{k: int(usage.get(k) or 0) for k in Usage.model_fields})
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise _Retryable(f"{url}: malformed response ({exc}): {response.text[:300]}") from exc
        return ChatResponse(
            message=message,
            finish_reason=choice.get("finish_reason"),
            usage=counts,
            model=data.get("model"),
            latency_s=time.perf_counter() - started,
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
