"""Serve any `TokenClient` over HTTP with SGLang's native `/generate` protocol, token ids only.

So the embedded model (or any token backend) can be used by tools that speak SGLang, and by
clotho's own `SglangTokenClient`. The shapes follow SGLang (`GenerateReqInput` and
`SamplingParams` in the request; `TokenizerManager._handle_batch_output` for the response):

    request:  {"input_ids": [ids] or [[ids], ...], "sampling_params": {...} or [{...}, ...],
               "return_logprob": bool, "rid": ...}
    response: {"output_ids": [...], "meta_info": {"id", "finish_reason", "prompt_tokens",
               "completion_tokens", "e2e_latency", "output_token_logprobs" (with
               return_logprob) as [[logprob, token_id, null], ...]}}, a list for a batch.

`finish_reason` is `{"type": "stop", "matched": <stop id>}` or `{"type": "length", "length": n}`.
`GET /v1/models` lists the one served model as vLLM and SGLang do, with its context as
`max_model_len` (the client's `n_ctx` unless given), so clients hold a conversation to it.
As with SGLang started with `--skip-tokenizer-init`, there is no "text" (this server has no
tokenizer): send `input_ids`, not `text`, and stop ids rather than stop strings. The sampled
stop id is the last output id. Logprobs are whatever the client returns; the embedded model's
are raw (before temperature), like SGLang with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`. Features this
server cannot honour (streaming, top logprobs, prompt logprobs, penalties, grammars) are refused
with HTTP 400 and SGLang's error shape `{"error": {"message": ...}}`, never silently ignored.

Access: with a token, every route but `/health` needs `Authorization: Bearer <token>` (SGLang's
`--api-key` does the same); without one, the server listens on a loopback address only and
answers only requests that name a loopback host (a DNS-rebinding page names its own). Requests
from web pages (an `Origin` header) are refused either way. A request body over
`max_request_bytes` is refused with 413 while it streams in.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import math
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from clotho.chat import access
from clotho.chat.tokens import TokenClient, TokenSampling
from clotho.errors import ModelError
from clotho.hosts import host_name, is_loopback

DEFAULT_HOST = "127.0.0.1"
DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
_UNLIMITED = 1 << 30  # max_new_tokens null: up to the context (the client clamps)
_SAMPLING_EPS = 1e-6  # SGLang: a lower temperature is greedy
_TOP_K_ALL = 1 << 30

# SGLang sampling parameters that only affect text, which this server does not return.
_TEXT_ONLY = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
_TEXT_ONLY |= {"stream_interval"}
# Parameters accepted only at their no-op value: {name: value that changes nothing}.
_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
}
_ABSENT = {"stop", "stop_regex", "json_schema", "regex", "ebnf", "structural_tag", "logit_bias"}
_ABSENT |= {"custom_params"}
_SUPPORTED = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids"}
_SUPPORTED |= {"ignore_eos", "sampling_seed"}
DEFAULT_MAX_REQUEST_BYTES = 16 << 20  # a 128k-token prompt as JSON ids is ~1 MB
_OPEN_PATHS = frozenset({"/health"})  # liveness probes carry no token


class BadRequest(ValueError):
    """The request asks for something this server cannot do, or is malformed."""


class RequestTooLarge(ValueError):
    """The request body passed `max_request_bytes` (HTTP 413)."""


def build_app(
    client: TokenClient,
    *,
    stop_token_ids: Sequence[int] = (),
    model_path: str = "",
    token: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_model_len: int | None = None,
) -> Starlette:
    """The ASGI app serving `client`: `POST /generate`, `GET /health`, `GET /get_model_info`,
    `GET /v1/models`.

    `stop_token_ids` are the model's own end-of-turn ids, added to each request's unless it
    sets `ignore_eos` (as SGLang adds the model's eos ids). With `token`, requests must carry
    it as a Bearer token; without, only loopback host names are answered. `max_model_len` is
    the context `/v1/models` reports: by default the client's `n_ctx` (the embedded model's),
    else null (not known).
    """
    default_stops = [int(i) for i in stop_token_ids]
    context = max_model_len if max_model_len is not None else _context_of(client)
    created = int(time.time())

    async def generate(request: Request) -> Response:
        try:
            body = await _read_body(request, max_request_bytes)
        except RequestTooLarge as exc:
            return _error(str(exc), 413)
        try:
            batch, items = _split_batch(json.loads(body))
            samplings = [_sampling(params, default_stops) for _, params, _, _ in items]
            results = [
                await _one(client, prompt, sampling, logprob, rid)
                for (prompt, _, logprob, rid), sampling in zip(items, samplings, strict=True)
            ]
        except (ValueError, ModelError) as exc:  # BadRequest, bad JSON, invalid sampling
            return _error(str(exc), 400)
        except Exception as exc:  # a broken client: report it, keep serving
            return _error(f"{type(exc).__name__}: {exc}", 500)
        return JSONResponse(results if batch else results[0])

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": model_path, "is_generation": True})

    async def models(_: Request) -> Response:
        card = {
            "id": model_path or "default",
            "object": "model",
            "created": created,
            "owned_by": "clotho",
            "root": model_path or "default",
            "parent": None,
            "max_model_len": context,
        }
        return JSONResponse({"object": "list", "data": [card]})

    routes = [
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/health", health, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
    ]
    return Starlette(routes=routes, middleware=[Middleware(TokenGuard, token=token)])


def _context_of(client: TokenClient) -> int | None:
    """The context of a client that knows it (the embedded model's `n_ctx`)."""
    n_ctx = getattr(client, "n_ctx", None)
    return n_ctx if _is_int(n_ctx) and n_ctx > 0 else None


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it (or its announced length) passes `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"the request body has {declared} bytes, more than {limit}")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"the request body passed {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


class TokenGuard:
    """Refuses web pages, requests without the token, and, with no token, requests that do
    not name a loopback host. `/health` needs no token (probes), but is guarded otherwise."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope, Headers(scope=scope))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        if headers.get("origin") is not None or headers.get("sec-fetch-site") in (
            "cross-site",
            "same-site",
        ):
            return _error("requests from web pages are refused: this serves model clients", 403)
        if self.token is None:
            if not is_loopback(host_name(headers.get("host", ""))):
                return _error("without a token only loopback host names are served", 403)
            return None
        if scope["path"] in _OPEN_PATHS:
            return None
        scheme, _, given = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), self.token
        ):
            what = "wrong token" if scheme else "authentication required"
            response = _error(
                f"{what}: send 'Authorization: Bearer <token>' with the token `clotho "
                "serve-model` was given (clotho clients: model.api_key_env names the "
                "environment variable that holds it)",
                401,
            )
            response.headers["WWW-Authenticate"] = 'Bearer realm="clotho serve-model"'
            return response
        return None


# `listen_socket(host, port, token)`: the model's socket, loopback only without a token.
listen_socket = functools.partial(
    access.listen_socket,
    refusal="refusing to serve the model on {host} without a token: anyone who can reach it "
    "could use it; give one (--token-file or --token-env) or listen on 127.0.0.1",
)


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _split_batch(body: Any) -> tuple[bool, list[tuple[list[int], Any, bool, str]]]:
    """Whether the body is a batch, and (prompt ids, sampling params, return_logprob, rid) each."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("input_ids") is None:
        raise BadRequest("send input_ids: this server takes token ids only (no text)")
    if body.get("stream"):
        raise BadRequest("stream is not supported by this server")
    if body.get("top_logprobs_num") or body.get("token_ids_logprob") is not None:
        raise BadRequest("top_logprobs_num and token_ids_logprob are not supported")
    if body.get("logprob_start_len") not in (None, -1):
        raise BadRequest("prompt logprobs (logprob_start_len) are not supported")
    ids = body["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise BadRequest("input_ids must be a non-empty list of token ids")
    batch = isinstance(ids[0], list)
    prompts = ids if batch else [ids]
    for prompt in prompts:
        if not isinstance(prompt, list) or not prompt or not all(_is_int(i) for i in prompt):
            raise BadRequest("input_ids must hold non-empty lists of integer token ids")

    def per_item(key: str, default: Any) -> list[Any]:
        value = body.get(key)
        if batch and isinstance(value, list):
            if len(value) != len(prompts):
                raise BadRequest(f"{key} has {len(value)} entries for {len(prompts)} prompts")
            return [default if v is None else v for v in value]
        return [default if value is None else value] * len(prompts)

    params = per_item("sampling_params", {})
    logprobs = per_item("return_logprob", False)
    rid = body.get("rid")
    if batch and isinstance(rid, list):
        rids = [str(r) for r in per_item("rid", "")]
    elif rid is not None:
        rids = [str(rid)] if not batch else [f"{rid}-{i}" for i in range(len(prompts))]
    else:
        rids = [uuid.uuid4().hex for _ in prompts]
    return batch, list(zip(prompts, params, [bool(x) for x in logprobs], rids, strict=True))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _sampling(params: Any, default_stops: list[int]) -> TokenSampling:
    """SGLang sampling params as `TokenSampling`, with SGLang's defaults and checks."""
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be a JSON object")
    unknown = set(params) - _SUPPORTED - _TEXT_ONLY - set(_NEUTRAL) - _ABSENT
    if unknown:
        raise BadRequest(f"unknown sampling parameters {sorted(unknown)}")
    for key, neutral in _NEUTRAL.items():
        if params.get(key) is not None and params[key] != neutral:
            raise BadRequest(f"sampling parameter {key}={params[key]!r} is not supported")
    for key in _ABSENT:
        if params.get(key):
            raise BadRequest(f"sampling parameter {key} is not supported (token ids only)")

    def number(key: str, default: float) -> float:
        value = params.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(f"{key} must be a number, not {value!r}")
        return float(value)

    temperature = number("temperature", 1.0)
    top_p = number("top_p", 1.0)
    top_k = int(number("top_k", -1))
    if not math.isfinite(temperature) or temperature < 0:
        raise BadRequest(f"temperature must be a non-negative finite number, got {temperature}")
    if not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 1 and top_k != -1:
        raise BadRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if max_new is not None and (not _is_int(max_new) or max_new < 0):
        raise BadRequest(f"max_new_tokens must be an integer >= 0, got {max_new!r}")
    stops = params.get("stop_token_ids") or []
    if not isinstance(stops, list) or not all(_is_int(i) for i in stops):
        raise BadRequest("stop_token_ids must be a list of token ids")
    seed = params.get("sampling_seed")
    if seed is not None and not _is_int(seed):
        raise BadRequest(f"sampling_seed must be an integer, got {seed!r}")
    # SGLang: ignore_eos disables stop_token_ids too, not only the model's eos.
    stops = [] if params.get("ignore_eos") else list(dict.fromkeys([*stops, *default_stops]))
    return TokenSampling(
        max_tokens=_UNLIMITED if max_new is None else max_new,
        temperature=0.0 if temperature < _SAMPLING_EPS else temperature,
        top_p=top_p,
        top_k=0 if top_k in (-1, _TOP_K_ALL) else top_k,
        seed=seed,
        stop_token_ids=stops,
    )


async def _one(
    client: TokenClient, prompt: list[int], sampling: TokenSampling, logprob: bool, rid: str
) -> dict[str, Any]:
    started = time.perf_counter()
    generation = await client.generate(prompt, sampling)
    ids = generation.token_ids
    if generation.finish_reason == "stop" and ids:
        finish: dict[str, Any] = {"type": "stop", "matched": ids[-1]}
    else:
        finish = {"type": "length", "length": len(ids)}  # below max_new_tokens if clamped
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "completion_tokens": len(ids),
        "e2e_latency": time.perf_counter() - started,
    }
    if logprob:
        meta["output_token_logprobs"] = [
            [lp, tid, None] for lp, tid in zip(generation.logprobs, ids, strict=True)
        ]
    return {"output_ids": ids, "meta_info": meta}


class TokenServer:
    """uvicorn serving an ASGI app on 127.0.0.1 from a background thread.

    `port=0` takes a free port; `base_url` says which. Use as a context manager, or
    `start()`/`stop()`. For a foreground server (`clotho serve-model`) use `serve`.
    """

    def __init__(
        self, app: Any, *, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"
    ) -> None:
        self.host, self.port = host, port
        self._server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off"))
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> TokenServer:
        """Bind (a free port if 0), serve from a daemon thread, return once accepting."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self._socket, self.port = sock, sock.getsockname()[1]
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ModelError(f"the token server on {self.base_url} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def __enter__(self) -> TokenServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def serve(
    client: TokenClient,
    *,
    host: str = DEFAULT_HOST,
    port: int = 30000,
    stop_token_ids: Sequence[int] = (),
    model_path: str = "",
    log_level: str = "info",
    token: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    sock: socket.socket | None = None,
    max_model_len: int | None = None,
) -> None:
    """Serve `client` in the foreground until interrupted (port 30000 is SGLang's default).

    On `sock` if given (from `listen_socket`), else on `host:port`; without `token`, a host
    that is not loopback is refused (`ConfigError`)."""
    if sock is None:
        sock = listen_socket(host, port, token)
    app = build_app(
        client,
        stop_token_ids=stop_token_ids,
        model_path=model_path,
        token=token,
        max_request_bytes=max_request_bytes,
        max_model_len=max_model_len,
    )
    config = uvicorn.Config(app, log_level=log_level, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        asyncio.run(client.aclose())
