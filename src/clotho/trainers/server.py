"""`clotho api`: the Atropos trajectory API, served with Starlette + uvicorn (extra `api`).

Same endpoints, bodies and gzip handling as upstream `atroposlib` `run-api` (register,
register-env, disconnect-env, wandb_info, info, status, status-env, scored_data,
scored_data_list, batch, latest_example, reset_data), so a trainer or environment written
for Atropos works unchanged. State lives in one `ApiState` per server: two servers can run
in one process.

What is fixed relative to upstream, and how:

- **A group larger than the batch no longer blocks every batch.** Upstream packs groups by
  the largest size in the queue; one group above `batch_size` (or of a size that does not
  divide it) stops all batches for everyone. Here a batch is an exact subset sum over the
  queue that prefers the oldest groups (`batching.py`), so a group that does not fit waits
  without blocking the rest, and a group larger than the batch is refused with HTTP 422
  when posted (with `/scored_data_list`, the whole list, so nothing is half-queued).
- **A dead environment with a minimum allocation no longer blocks every batch.** Upstream
  never notices a dead environment, and one holding a `min_batch_allocation` with nothing
  queued holds back every batch forever. Here every request from an environment (status-env,
  scored data) is a heartbeat; one silent for `env_timeout_s` (default 120 s; our client
  heartbeats every 10 s, upstream envs poll ~10 times a second) counts as gone until it
  speaks again.
- **A crashed or disconnected environment's share is released.** A gone or disconnected
  environment no longer counts in other environments' `env_weight`, in
  `unallocated_fraction`, or as a minimum when forming batches; its queued groups are still
  served.
- **`step` counts batches served.** Upstream forms every possible batch at once, adds them
  all to the step, and serves them last-in-first-out. Here `/batch` forms one batch, oldest
  groups first, and the step grows by one per batch handed out.
- **`/reset_data` leaves a usable server** (upstream answers 500 to `/batch` afterwards):
  it returns to the unregistered state.
- **`/status-env` takes its `env_id` as a JSON body on GET (as upstream) or as a query
  string**; an unknown id is a 404 instead of a 500, and a zero total weight no longer
  divides by zero.

Other differences, all explicit: groups whose `tokens`, `masks` and `scores` do not line up
are refused with 422 (upstream queues them and the trainer crashes later); groups smaller
than the environment's declared size are queued directly rather than held in upstream's
"buffered" side list (that list existed to feed the power-of-two packer; groups larger than
declared were stranded there forever); a second `/register` with a different `batch_size`
is a 409 instead of being silently ignored; `register-env` with `group_size` above the
batch size is a 422; `--batch-size` presets the batch shape so environments can register
before any trainer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import zlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clotho.errors import ConfigError
from clotho.trainers.protocol import (
    EMPTY_EXAMPLE,
    NOT_REGISTERED,
    EnvIdentifier,
    RegisterEnv,
    Registration,
    ScoredData,
)
from clotho.trainers.state import ApiSettings, ApiState, Rejected

log = logging.getLogger(__name__)

GZIP_MIN_RESPONSE_BYTES = 1000
"""Responses this large are gzipped for clients that accept it (upstream's threshold)."""

_GROUPS = TypeAdapter(list[ScoredData])

# --- request decompression ---------------------------------------------------------------


class _TooLarge(Exception):
    pass


def gunzip(data: bytes, limit: int) -> bytes:
    """Decompress (possibly multi-member) gzip, refusing output beyond `limit` bytes."""
    out: list[bytes] = []
    total = 0
    while data:
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = decoder.decompress(data, limit - total + 1)
        total += len(chunk)
        out.append(chunk)
        if total > limit:
            raise _TooLarge
        if not decoder.eof:
            raise zlib.error("truncated gzip stream")
        data = decoder.unused_data
    return b"".join(out)


class GzipRequestMiddleware:
    """Accept request bodies sent with `Content-Encoding: gzip` (upstream clients do)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers") or []) if scope["type"] == "http" else {}
        if b"gzip" not in headers.get(b"content-encoding", b"").lower():
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            body = gunzip(b"".join(chunks), self.max_bytes)
        except _TooLarge:
            await PlainTextResponse("Request body too large", 413)(scope, receive, send)
            return
        except zlib.error:
            await PlainTextResponse("Invalid gzip payload", 400)(scope, receive, send)
            return
        kept = [
            (k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")
        ]
        scope = {**scope, "headers": [*kept, (b"content-length", str(len(body)).encode())]}
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


# --- the application ---------------------------------------------------------------------


def _json(model: BaseModel | dict[str, Any], status_code: int = 200) -> Response:
    if isinstance(model, BaseModel):
        return Response(model.model_dump_json(), status_code, media_type="application/json")
    return JSONResponse(model, status_code)


def _invalid(exc: ValidationError) -> Response:
    """FastAPI's shape for validation failures, which upstream clients expect."""
    return JSONResponse({"detail": json.loads(exc.json(include_url=False))}, 422)


Handler = Callable[[Request], Awaitable[Response]]


def _guard(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except ValidationError as exc:
            return _invalid(exc)
        except Rejected as exc:
            return JSONResponse({"status": "error", "message": exc.message}, exc.status_code)

    return run


class _Routes:
    """The endpoints, bound to one `ApiState`."""

    def __init__(self, state: ApiState) -> None:
        self.state = state

    async def root(self, request: Request) -> Response:
        return JSONResponse({"message": "AtroposLib API", "server": "clotho"})

    async def register(self, request: Request) -> Response:
        registration = Registration.model_validate_json(await request.body())
        return JSONResponse({"uuid": self.state.register(registration)})

    async def register_env(self, request: Request) -> Response:
        body = RegisterEnv.model_validate_json(await request.body())
        return _json(self.state.register_env(body).model_dump(exclude_none=True))

    async def disconnect_env(self, request: Request) -> Response:
        body = EnvIdentifier.model_validate_json(await request.body())
        return _json(self.state.disconnect_env(body.env_id).model_dump(exclude_none=True))

    async def wandb_info(self, request: Request) -> Response:
        return _json(self.state.wandb_info())

    async def info(self, request: Request) -> Response:
        return _json(self.state.info())

    async def status(self, request: Request) -> Response:
        return _json(self.state.status())

    async def status_env(self, request: Request) -> Response:
        body = await request.body()
        if body.strip():
            env_id = EnvIdentifier.model_validate_json(body).env_id
        else:
            env_id = EnvIdentifier.model_validate(dict(request.query_params)).env_id
        return _json(self.state.status_env(env_id))

    async def scored_data(self, request: Request) -> Response:
        group = ScoredData.model_validate_json(await request.body())
        self.state.add_groups([group])
        return JSONResponse({"status": "received"})

    async def scored_data_list(self, request: Request) -> Response:
        groups = _GROUPS.validate_json(await request.body())
        self.state.add_groups(groups)
        return JSONResponse({"status": "received", "groups_processed": len(groups)})

    async def batch(self, request: Request) -> Response:
        if self.state.registration is None:
            return JSONResponse({"status": "error", "message": NOT_REGISTERED, "batch": []})
        groups = self.state.next_batch()
        if groups is None:
            return JSONResponse({"batch": None})
        sequences = sum(g.size for g in groups)
        log.info(
            "serving batch %d: %d groups, %d sequences", self.state.step, len(groups), sequences
        )
        body = b'{"batch":' + _GROUPS.dump_json(groups) + b"}"
        return Response(body, media_type="application/json")

    async def latest_example(self, request: Request) -> Response:
        latest = self.state.latest
        return _json(latest) if latest is not None else JSONResponse(EMPTY_EXAMPLE)

    async def reset_data(self, request: Request) -> Response:
        self.state.reset()
        return PlainTextResponse("Reset successful")

    def table(self) -> list[Route]:
        endpoints: list[tuple[str, Handler, list[str]]] = [
            ("/", self.root, ["GET"]),
            ("/register", self.register, ["POST"]),
            ("/register-env", self.register_env, ["POST"]),
            ("/disconnect-env", self.disconnect_env, ["POST"]),
            ("/wandb_info", self.wandb_info, ["GET"]),
            ("/info", self.info, ["GET"]),
            ("/status", self.status, ["GET"]),
            ("/status-env", self.status_env, ["GET"]),
            ("/scored_data", self.scored_data, ["POST"]),
            ("/scored_data_list", self.scored_data_list, ["POST"]),
            ("/batch", self.batch, ["GET"]),
            ("/latest_example", self.latest_example, ["GET"]),
            ("/reset_data", self.reset_data, ["GET", "POST"]),
        ]
        return [Route(path, _guard(fn), methods=methods) for path, fn, methods in endpoints]


def create_app(state: ApiState) -> Starlette:
    """The ASGI application serving `state`."""
    return Starlette(
        routes=_Routes(state).table(),
        middleware=[
            Middleware(GzipRequestMiddleware, max_bytes=state.settings.max_request_bytes),
            Middleware(GZipMiddleware, minimum_size=GZIP_MIN_RESPONSE_BYTES),
            Middleware(
                CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"]
            ),
        ],
    )


# --- running it --------------------------------------------------------------------------


class _EmbeddedServer(uvicorn.Server):
    """uvicorn that leaves signals to the caller (the CLI's handlers, a test's event loop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class ApiServer:
    """An `ApiState` served over HTTP on the running event loop.

    `async with ApiServer(settings, port=0) as server:` binds (port 0 picks a free one),
    serves until the block ends, and exposes `server.url` and `server.state`.
    """

    def __init__(
        self,
        settings: ApiSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        access_log: bool = False,
    ) -> None:
        self.state = ApiState(settings)
        self.host = host
        self.port = port
        self.access_log = access_log
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _bind(self) -> socket.socket:
        # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it
        # every keep-alive response waits ~40 ms for a delayed ACK.
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                self.host, self.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )[0]
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc}") from exc
        self.port = sock.getsockname()[1]
        return sock

    async def start(self) -> None:
        config = uvicorn.Config(
            create_app(self.state),
            log_config=None,
            access_log=self.access_log,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        sock = self._bind()
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task
                raise ConfigError(f"the API server on {self.url} stopped during start-up")
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._server = self._task = None

    async def wait(self) -> None:
        """Serve until cancelled."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
