"""JSON POSTs to model servers: several endpoints round-robin, retries with backoff.

Shared by the chat client (phase 1) and the token clients (phase 2). An endpoint that fails
is skipped for a cool-down. 429, 5xx, malformed bodies and connection errors are retried
with exponential backoff; what still fails becomes a `ModelError`, an infrastructure error,
never an agent failure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from clotho.errors import ModelError

T = TypeVar("T")


class MalformedResponse(ValueError):
    """A reply that parsed as HTTP but not as what the API promises: retried."""


class _Retryable(Exception):
    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class _Endpoint:
    def __init__(self, url: str) -> None:
        self.url = url
        self.unhealthy_until = 0.0


class BalancedPoster:
    """POSTs JSON to one of several base URLs and parses the reply, retrying what is transient."""

    def __init__(
        self,
        base_urls: list[str],
        *,
        api_key_env: str | None,
        api_key: str | None = None,
        environ: dict[str, str] | None = None,
        timeout_s: float,
        max_retries: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        unhealthy_cooldown_s: float,
    ) -> None:
        if api_key is None and api_key_env:
            api_key = (environ if environ is not None else os.environ).get(api_key_env)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )
        self._endpoints = [_Endpoint(u) for u in base_urls]
        self._next = 0
        self.max_retries = max_retries
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.unhealthy_cooldown_s = unhealthy_cooldown_s

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
        initial, cap = self.backoff_initial_s, self.backoff_max_s
        # Exponential from `initial`, with jitter of the same scale so small settings stay small.
        backoff = min(
            cap, (wait_exponential(multiplier=initial, max=cap) + wait_random(0, initial))(state)
        )
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            return max(backoff, min(exc.retry_after, self.backoff_max_s))
        return backoff

    async def post(
        self, path: str, body: dict[str, Any], parse: Callable[[Any], T]
    ) -> tuple[T, float]:
        """The parsed reply and the latency of the attempt that succeeded.

        `parse` gets the decoded JSON and raises `MalformedResponse` (or KeyError, IndexError,
        TypeError, ValueError) when it is not what the API promises.
        """
        attempts = self.max_retries + 1
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=self._wait,
                retry=retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:
                    return await self._post_once(self._pick(), path, body, parse)
        except _Retryable as exc:
            raise ModelError(f"model request failed after {attempts} attempts: {exc}") from exc
        raise AssertionError("unreachable")

    async def _post_once(
        self, endpoint: _Endpoint, path: str, body: dict[str, Any], parse: Callable[[Any], T]
    ) -> tuple[T, float]:
        url = f"{endpoint.url}/{path.lstrip('/')}"
        started = time.perf_counter()
        try:
            response = await self._http.post(url, json=body)
        except httpx.TransportError as exc:
            endpoint.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
            raise _Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            if response.status_code >= 500:
                endpoint.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
            retry_after = _parse_retry_after(response.headers.get("retry-after"))
            raise _Retryable(
                f"{url}: HTTP {response.status_code}: {response.text[:300]}", retry_after
            )
        if response.status_code >= 400:
            raise ModelError(f"{url}: HTTP {response.status_code}: {response.text[:500]}")
        try:
            parsed = parse(response.json())
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise _Retryable(f"{url}: malformed response ({exc}): {response.text[:300]}") from exc
        return parsed, time.perf_counter() - started

    async def aclose(self) -> None:
        await self._http.aclose()


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
