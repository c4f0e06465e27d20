"""JSON POSTs to model servers: several endpoints round-robin, retries with backoff.

Shared by the chat client (phase 1) and the token clients (phase 2). An endpoint that fails
is skipped for a cool-down. 429, 5xx, malformed bodies and connection errors are retried
with exponential backoff; what still fails becomes a `ModelError`, an infrastructure error,
never an agent failure.

A model server is trusted to answer, not to be well-behaved: every reply is read as a stream
and counted (after decompression, which is bounded too), so more than `max_reply_bytes` stops
the read with `ReplyTooLarge`; and each request as a whole, however its bytes trickle in,
ends at `request_timeout_s` with `RequestDeadline` (`timeout_s` bounds each read only). Both
are `ModelError`s raised at once, not retried: a second try would cost as much again.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import zlib
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

from clotho.chat.overflow import ContextOverflow, is_context_overflow
from clotho.errors import ModelError

T = TypeVar("T")

DEFAULT_MAX_REPLY_BYTES = 64 << 20
"""Far above any real completion (128k tokens with logprobs is ~15 MB of JSON)."""
DEFAULT_REQUEST_TIMEOUT_S = 1800.0
ERROR_BODY_BYTES = 64 << 10
"""An error reply is read this far only: its message is cut to a few hundred characters."""
OFF_LOOP_BYTES = 1 << 20
"""Replies this large are decoded and parsed in a worker thread, off the event loop."""


class ReplyTooLarge(ModelError):
    """The endpoint sent more than `max_reply_bytes`: reading stopped there, not retried.

    An infrastructure error: no completion the sampling settings allow comes near the cap,
    so only a broken server or proxy sends this, not the model being evaluated."""

    def __init__(self, message: str, *, received: int = 0, decoded: int = 0) -> None:
        super().__init__(message)
        self.received = received  # bytes off the wire when reading stopped
        self.decoded = decoded  # bytes they decompressed to


class RequestDeadline(ModelError):
    """A request as a whole outlived `request_timeout_s` (a reply dripping in, a generation
    that does not end): the connection was closed, not retried."""


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
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if api_key is None and api_key_env:
            api_key = (environ if environ is not None else os.environ).get(api_key_env)
        # Only what `_Inflater` can decode with a bound (no brotli, zstd).
        headers = {"Accept-Encoding": "gzip, deflate"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.max_reply_bytes = max_reply_bytes
        self.request_timeout_s = request_timeout_s
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
            async with asyncio.timeout(self.request_timeout_s):
                status, headers, data = await self._exchange(endpoint, url, body)
        except TimeoutError as exc:  # asyncio.timeout's: httpx's own are TransportErrors
            endpoint.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
            raise RequestDeadline(
                f"{url}: no complete reply within request_timeout_s="
                f"{self.request_timeout_s:g} s; the connection was closed"
            ) from exc
        if status == 429 or status >= 500:
            if status >= 500:
                endpoint.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
            retry_after = _parse_retry_after(headers.get("retry-after"))
            raise _Retryable(f"{url}: HTTP {status}: {_text(data, 300)}", retry_after)
        if status >= 400:
            text = _text(data, 500)
            if is_context_overflow(status, _text(data, len(data))):  # the agent's own doing
                raise ContextOverflow(f"the conversation exceeds the model's context: {text}")
            raise ModelError(f"{url}: HTTP {status}: {text}")
        try:
            if len(data) >= OFF_LOOP_BYTES:
                parsed = await asyncio.to_thread(_decode_and_parse, data, parse)
            else:
                parsed = _decode_and_parse(data, parse)
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise _Retryable(f"{url}: malformed response ({exc}): {_text(data, 300)}") from exc
        return parsed, time.perf_counter() - started

    async def _exchange(
        self, endpoint: _Endpoint, url: str, body: dict[str, Any]
    ) -> tuple[int, httpx.Headers, bytes]:
        """Status, headers and the (decompressed) body, read while counting: a success up
        to `max_reply_bytes` (more raises `ReplyTooLarge`), an error's first bytes only."""
        try:
            async with self._http.stream("POST", url, json=body) as response:
                status = response.status_code
                limit = self.max_reply_bytes if status < 400 else ERROR_BODY_BYTES
                declared = _content_length(response.headers)
                if status < 400 and declared is not None and declared > limit:
                    raise ReplyTooLarge(
                        f"{url}: the reply announces {declared} bytes, more than "
                        f"max_reply_bytes={limit}; not read"
                    )
                try:
                    inflater = _Inflater(response.headers.get("content-encoding", ""))
                    data = await _read_capped(response, inflater, limit, truncate=status >= 400)
                except _Overflow as exc:
                    raise ReplyTooLarge(
                        f"{url}: the reply passed max_reply_bytes={limit} ({exc}); "
                        "reading stopped and the connection was closed",
                        received=exc.received,
                        decoded=exc.decoded,
                    ) from None
                except (zlib.error, MalformedResponse) as exc:
                    raise _Retryable(f"{url}: undecodable reply body: {exc}") from exc
                return status, response.headers, data
        except httpx.TransportError as exc:
            endpoint.unhealthy_until = time.monotonic() + self.unhealthy_cooldown_s
            raise _Retryable(f"{url}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self._http.aclose()


def _parse_retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


class _Overflow(Exception):
    """More than the limit arrived."""

    def __init__(self, received: int, decoded: int) -> None:
        super().__init__(f"{received} bytes received, {decoded} decoded")
        self.received, self.decoded = received, decoded


class _Inflater:
    """Undoes a gzip or deflate Content-Encoding without ever producing more than asked."""

    def __init__(self, encoding: str) -> None:
        codings = [c.strip().lower() for c in encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        self.wbits: int | None
        if not codings:
            self.wbits = None
        elif codings in (["gzip"], ["x-gzip"]):
            self.wbits = zlib.MAX_WBITS | 16
        elif codings == ["deflate"]:
            self.wbits = zlib.MAX_WBITS
        else:
            raise MalformedResponse(f"content encoding {encoding!r} was not asked for")
        self._z = zlib.decompressobj(self.wbits) if self.wbits is not None else None
        self._started = False

    def feed(self, chunk: bytes, room: int) -> bytes:
        """At most `room + 1` bytes of output (one more than fits tells the caller to stop)."""
        if self._z is None:
            return chunk
        if not self._started and self.wbits == zlib.MAX_WBITS:
            self._started = True
            try:  # "deflate" is zlib-wrapped by the RFC, raw by some servers
                return self._z.decompress(chunk, room + 1)
            except zlib.error:
                self.wbits = -zlib.MAX_WBITS
                self._z = zlib.decompressobj(self.wbits)
        out = self._z.decompress(chunk, room + 1)
        while self._z.eof and self._z.unused_data and len(out) <= room:  # gzip members
            rest = self._z.unused_data
            self._z = zlib.decompressobj(self.wbits)
            out += self._z.decompress(rest, room + 1 - len(out))
        return out

    def finish(self, room: int) -> bytes:
        if self._z is None:
            return b""
        out = self._z.decompress(b"", room + 1)
        return out + (b"" if len(out) > room else self._z.flush())


async def _read_capped(
    response: httpx.Response, inflater: _Inflater, limit: int, *, truncate: bool
) -> bytes:
    """The body, decompressed, counting raw and decoded bytes against `limit`.

    Past it, `_Overflow` (or, with `truncate`, the first `limit` bytes): at most one network
    chunk and `limit + 1` decoded bytes are ever held."""
    parts: list[bytes] = []
    raw = size = 0
    async for chunk in response.aiter_raw():
        raw += len(chunk)
        out = inflater.feed(chunk, limit - size)
        size += len(out)
        parts.append(out)
        if size > limit or raw > limit:
            if truncate:
                return b"".join(parts)[:limit]
            raise _Overflow(raw, size)
    out = inflater.finish(limit - size)
    size += len(out)
    parts.append(out)
    if size > limit:
        if truncate:
            return b"".join(parts)[:limit]
        raise _Overflow(raw, size)
    return b"".join(parts)


def _decode_and_parse(data: bytes, parse: Callable[[Any], T]) -> T:
    return parse(json.loads(data))


def _text(data: bytes, limit: int) -> str:
    return data[: limit * 4].decode("utf-8", "replace")[:limit]


def _content_length(headers: httpx.Headers) -> int | None:
    if headers.get("content-encoding", "identity").strip().lower() != "identity":
        return None  # the decoded size is what counts
    try:
        return int(headers["content-length"])
    except (KeyError, ValueError):
        return None
