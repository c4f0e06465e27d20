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
- **A minimum allocation no longer starves the trainer.** Upstream never notices a dead
  environment, and one holding a `min_batch_allocation` with nothing queued (dead, or just
  slow: an agentic rollout takes minutes) holds back every batch for as long as it lasts.
  Here a minimum puts that environment's queued groups first, and holds back a batch the
  queue could fill for `min_allocation_wait_s` at most (default 5 s), after which the batch
  goes with what that environment has. Every request from an environment (status-env,
  scored data) is also a heartbeat; one silent for `env_timeout_s` (default 120 s; our
  client heartbeats every 10 s, upstream envs poll ~10 times a second) counts as gone until
  it speaks again.
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

**Access.** Upstream has no authentication and allows every web origin, and its
`GET /reset_data` wipes the queue: any web page the user opens, any process on the machine
(an agent's sandbox without its own network included) could wipe or poison training data.
Here (`AccessGuard`):

- with a token (`ApiSettings.token`; `clotho api` always has one unless `--no-auth`), every
  route but `/` needs `Authorization: Bearer <token>`, or HTTP Basic with the token as the
  password, which is what `requests` and `aiohttp` send for a URL such as
  `http://clotho:<token>@host:8000`: so upstream trainers, environments and `atropos-sft-gen`
  authenticate by putting the token in the URL they are given. A refusal is a 401 whose
  body says how to authenticate.
- without a token the server listens on a loopback address only (`ApiServer` refuses any
  other) and only for requests naming a loopback host (no DNS rebinding).
- a request from a web page (an `Origin` header, or `Sec-Fetch-Site: cross-site|same-site`)
  is refused with 403 unless its origin is listed in `cors_origins`; there is no wildcard
  CORS.
- `/reset_data` answers POST and GET (which upstream's sft/dpo tools and API tests send); a
  web page's GET (an image tag) carries `Sec-Fetch-Site` and is refused as above.

**Large bodies.** Every body (and every gzip body once decompressed) above
`max_request_bytes` is a 413, refused on its `Content-Length` before it is read when it
says so. Bodies above 1 MiB are decompressed in a worker thread (zlib lets go of the GIL)
and validated in a child process (`parse_worker.py`), one at a time (so N huge bodies at
once cannot multiply the memory), while the event loop keeps serving other clients. The
queue keeps each group as its JSON (`QueuedGroup`), about a tenth of the memory of Python
lists, and `/batch` joins those bytes instead of re-encoding; large responses are gzipped in
a worker thread too. Whatever the body's shape, memory stays bounded by multiples of the
body limit: each JSON object (a group, a message) counts `OBJECT_OVERHEAD_BYTES` (1 KiB)
against it, counted on the bytes before they are parsed (so a list holds at most
`max_request_bytes / 1 KiB` groups), and the parse child's memory is capped by the
kernel at `parse_memory_limit` = 128 MiB + 16 x `max_request_bytes` (`parse_worker.py`).
gzip is decoded in linear time (`gunzip`: at most `MAX_GZIP_MEMBERS` members, zlib fed
slices of a memoryview, never the whole rest of the body per member).

Other differences, all explicit: groups with a NaN or infinite float, or token ids below 0
or at or above the vocabulary size (`vocab_size`, from the server's settings or the trainer's
registration), are refused with 422; so are groups whose `tokens`, `masks` and `scores` do
not line up (upstream queues them and the trainer crashes later); groups smaller
than the environment's declared size are queued directly rather than held in upstream's
"buffered" side list (that list existed to feed the power-of-two packer; groups larger than
declared were stranded there forever); a second `/register` with a different `batch_size`
is a 409 instead of being silently ignored, once anything depends on the first (see
`ApiState.register`: until then the later registration replaces it, so whoever registered
first cannot lock the real trainer out); a `batch_size` above `max_batch_size` is a 422;
`register-env` with `group_size` above the batch size is a 422; `--batch-size` presets the
batch shape so environments can register before any trainer does (and then no registration
can change it).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hmac
import json
import logging
import socket
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clotho.chat.access import listen_socket, token_of
from clotho.errors import ConfigError
from clotho.hosts import host_name, is_loopback
from clotho.trainers.parse_worker import GroupParser, InvalidGroups
from clotho.trainers.protocol import (
    EMPTY_EXAMPLE,
    NOT_REGISTERED,
    OFF_LOOP_BYTES,
    EnvIdentifier,
    RegisterEnv,
    Registration,
)
from clotho.trainers.state import ApiSettings, ApiState, QueuedGroup, Rejected

log = logging.getLogger(__name__)

GZIP_MIN_RESPONSE_BYTES = 1000
"""Responses this large are gzipped for clients that accept it (upstream's threshold)."""

TOKEN_ENV = "CLOTHO_API_TOKEN"
"""Where `clotho api` reads the token when no flag gives it (clients: `ApiClientConfig.token`)."""


# --- access ------------------------------------------------------------------------------


def how_to_authenticate(what: str) -> str:
    return (
        f"{what}: send 'Authorization: Bearer <token>' with the token `clotho api` was given "
        f"(--token-file, --token-env or {TOKEN_ENV}), or made at start in the file it names; "
        "an Atropos trainer or environment "
        "can put it in the URL it is given: http://clotho:<token>@host:port"
    )


class _HttpMiddleware:
    """An ASGI middleware that handles HTTP requests and passes anything else through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, Headers(scope=scope), receive, send)

    async def handle(self, scope: Scope, headers: Headers, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class AccessGuard(_HttpMiddleware):
    """Refuses web pages (no wildcard CORS), unauthenticated requests, and, without a token,
    requests that do not name a loopback host (a DNS-rebinding page would name its own)."""

    def __init__(self, app: ASGIApp, token: str | None, origins: frozenset[str]) -> None:
        super().__init__(app)
        self.token = token.encode() if token else None
        self.origins = origins

    async def handle(self, scope: Scope, headers: Headers, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: Headers) -> Response | None:
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site", "")
        if (origin is not None or site in ("cross-site", "same-site")) and (
            origin not in self.origins
        ):
            return _error(
                403,
                f"requests from web pages (origin {origin or site!r}) are refused: the "
                "trajectory API is for trainers and environments; list a page's origin "
                "with --cors-origin to allow it",
            )
        if self.token is None:
            if not is_loopback(host_name(headers.get("host", ""))):
                return _error(403, "without a token only loopback host names are served")
            return None
        if scope["path"] == "/":
            return None
        given = token_of(headers.get("authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), self.token):
            what = "authentication required" if given is None else "wrong token"
            response = _error(401, how_to_authenticate(what))
            response.headers["WWW-Authenticate"] = 'Bearer realm="clotho api"'
            return response
        return None


# --- request bodies ----------------------------------------------------------------------


class _TooLarge(Exception):
    pass


class _TooManyMembers(Exception):
    pass


GZIP_SLICE_BYTES = 64 << 10
"""zlib gets the body in slices this large (views, not copies)."""

MAX_GZIP_MEMBERS = 64
"""More gzip members than this in one body is a 400 (clients send one)."""


@dataclass
class GunzipWork:
    """What a `gunzip` call cost: decoders made, and bytes handed to zlib (leftovers of a
    member that ended are handed again to the next decoder, so count them twice)."""

    decoders: int = 0
    bytes_fed: int = 0


def gunzip(data: bytes, limit: int, work: GunzipWork | None = None) -> bytes:
    """Decompress (possibly multi-member) gzip, refusing output beyond `limit` bytes and more
    than `MAX_GZIP_MEMBERS` members.

    Work is linear in the body: zlib is fed slices of `GZIP_SLICE_BYTES` of a memoryview, so
    when a member ends only the rest of its slice is copied (zlib's `unused_data`) and handed
    to the next member's decoder. Handing it the whole remaining body instead (as before)
    copied the body once per member: 7 MB of empty members took minutes."""
    work = work if work is not None else GunzipWork()
    view = memoryview(data)
    out: list[bytes] = []
    total = offset = members = 0
    decoder: Any = None
    leftover = b""
    while leftover or offset < len(view):
        if decoder is None:
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise _TooManyMembers
            decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            work.decoders += 1
        piece: bytes | memoryview
        if leftover:
            piece, leftover = leftover, b""
        else:
            piece = view[offset : offset + GZIP_SLICE_BYTES]
            offset += len(piece)
        work.bytes_fed += len(piece)
        chunk = decoder.decompress(piece, limit - total + 1)
        total += len(chunk)
        out.append(chunk)
        if total > limit:  # also the only way zlib keeps input back (unconsumed_tail)
            raise _TooLarge
        if decoder.eof:
            leftover = decoder.unused_data
            decoder = None
    if decoder is not None:
        raise zlib.error("truncated gzip stream")
    return b"".join(out)


def _too_large(limit: int) -> Response:
    return PlainTextResponse(
        f"Request body too large: the limit is {limit} bytes (clotho api --max-request-mb)", 413
    )


class RequestBody(_HttpMiddleware):
    """Reads every request body up to `max_bytes` (413 beyond, before reading when
    Content-Length says so) and undoes `Content-Encoding: gzip` (upstream clients send it),
    off the event loop when large."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def handle(self, scope: Scope, headers: Headers, receive: Receive, send: Send) -> None:
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(self.max_bytes)(scope, receive, send)
            return
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        if "gzip" in headers.get("content-encoding", "").lower():
            try:
                if len(body) > OFF_LOOP_BYTES // 8:  # zlib lets go of the GIL
                    body = await asyncio.to_thread(gunzip, body, self.max_bytes)
                else:
                    body = gunzip(body, self.max_bytes)
            except _TooLarge:
                await _too_large(self.max_bytes)(scope, receive, send)
                return
            except _TooManyMembers:
                message = f"gzip body of more than {MAX_GZIP_MEMBERS} members refused"
                await PlainTextResponse(message, 400)(scope, receive, send)
                return
            except zlib.error:
                await PlainTextResponse("Invalid gzip payload", 400)(scope, receive, send)
                return
            kept = [
                (k, v)
                for k, v in scope["headers"]
                if k not in (b"content-encoding", b"content-length")
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


def _error(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"status": "error", "message": message}, status_code)


def _json(model: BaseModel | dict[str, Any], status_code: int = 200) -> Response:
    if isinstance(model, BaseModel):
        return Response(model.model_dump_json(), status_code, media_type="application/json")
    return JSONResponse(model, status_code)


def _invalid(exc: ValidationError) -> Response:
    """FastAPI's shape for validation failures, which upstream clients expect, without the
    input (it could be a 100 MB group)."""
    return JSONResponse(
        {"detail": json.loads(exc.json(include_url=False, include_input=False))}, 422
    )


Handler = Callable[[Request], Awaitable[Response]]


def _guard(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except ValidationError as exc:
            return _invalid(exc)
        except InvalidGroups as exc:
            return JSONResponse({"detail": json.loads(exc.errors_json)}, 422)
        except Rejected as exc:
            return _error(exc.status_code, exc.message)

    return run


def endpoint(path: str, *methods: str) -> Callable[[Handler], Handler]:
    """Marks a `_Routes` method as the handler of `path` for `methods`."""

    def mark(handler: Handler) -> Handler:
        handler.route = (path, list(methods))  # type: ignore[attr-defined]
        return handler

    return mark


class _Routes:
    """The endpoints, bound to one `ApiState`."""

    def __init__(self, state: ApiState, parser: GroupParser) -> None:
        self.state = state
        self.parser = parser

    async def _groups(self, request: Request, *, many: bool) -> list[QueuedGroup]:
        body = await request.body()
        return await self.parser.parse(body, many=many, vocab_size=self.state.vocab_size)

    @staticmethod
    async def _json_bytes(request: Request, body: bytes) -> Response:
        """Large bodies are gzipped in a worker thread, not by the middleware on the loop."""
        if len(body) > OFF_LOOP_BYTES and "gzip" in request.headers.get("accept-encoding", ""):
            packed = await asyncio.to_thread(gzip.compress, body, 1)
            return Response(
                packed,
                media_type="application/json",
                headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
            )
        return Response(body, media_type="application/json")

    @endpoint("/", "GET")
    async def root(self, request: Request) -> Response:
        return JSONResponse({"message": "AtroposLib API", "server": "clotho"})

    @endpoint("/register", "POST")
    async def register(self, request: Request) -> Response:
        registration = Registration.model_validate_json(await request.body())
        return JSONResponse({"uuid": self.state.register(registration)})

    @endpoint("/register-env", "POST")
    async def register_env(self, request: Request) -> Response:
        body = RegisterEnv.model_validate_json(await request.body())
        return _json(self.state.register_env(body).model_dump(exclude_none=True))

    @endpoint("/disconnect-env", "POST")
    async def disconnect_env(self, request: Request) -> Response:
        body = EnvIdentifier.model_validate_json(await request.body())
        return _json(self.state.disconnect_env(body.env_id).model_dump(exclude_none=True))

    @endpoint("/wandb_info", "GET")
    async def wandb_info(self, request: Request) -> Response:
        return _json(self.state.wandb_info())

    @endpoint("/info", "GET")
    async def info(self, request: Request) -> Response:
        return _json(self.state.info())

    @endpoint("/status", "GET")
    async def status(self, request: Request) -> Response:
        return _json(self.state.status())

    @endpoint("/status-env", "GET")
    async def status_env(self, request: Request) -> Response:
        body = await request.body()
        if body.strip():
            env_id = EnvIdentifier.model_validate_json(body).env_id
        else:
            env_id = EnvIdentifier.model_validate(dict(request.query_params)).env_id
        return _json(self.state.status_env(env_id))

    @endpoint("/scored_data", "POST")
    async def scored_data(self, request: Request) -> Response:
        self.state.require_registration()  # before parsing what could not be queued
        self.state.add_groups(await self._groups(request, many=False))
        return JSONResponse({"status": "received"})

    @endpoint("/scored_data_list", "POST")
    async def scored_data_list(self, request: Request) -> Response:
        self.state.require_registration()
        groups = await self._groups(request, many=True)
        self.state.add_groups(groups)
        return JSONResponse({"status": "received", "groups_processed": len(groups)})

    @endpoint("/batch", "GET")
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
        body = b'{"batch":[' + b",".join(g.body for g in groups) + b"]}"
        return await self._json_bytes(request, body)

    @endpoint("/latest_example", "GET")
    async def latest_example(self, request: Request) -> Response:
        latest = self.state.latest
        if latest is None:
            return JSONResponse(EMPTY_EXAMPLE)
        return await self._json_bytes(request, latest.body)

    @endpoint("/reset_data", "GET", "POST")
    async def reset_data(self, request: Request) -> Response:
        # GET too, as Atropos' own tools send it: a web page's GET carries Sec-Fetch-Site or
        # Origin and is refused before it gets here (`_guard`), token or not.
        self.state.reset()
        return PlainTextResponse("Reset successful")

    def table(self) -> list[Route]:
        handlers = [getattr(self, name) for name in dir(type(self))]
        return [
            Route(h.route[0], _guard(h), methods=h.route[1])
            for h in handlers
            if hasattr(h, "route")
        ]


def create_app(state: ApiState, parser: GroupParser | None = None) -> Starlette:
    """The ASGI application serving `state`; large bodies go to `parser`'s child process
    (the caller closes it)."""
    settings = state.settings
    origins = frozenset(settings.cors_origins)
    middleware = [
        Middleware(
            AccessGuard,
            token=settings.token.get_secret_value() if settings.token else None,
            origins=origins,
        ),
        Middleware(RequestBody, max_bytes=settings.max_request_bytes),
        Middleware(GZipMiddleware, minimum_size=GZIP_MIN_RESPONSE_BYTES),
    ]
    if origins:  # preflights from the listed pages are answered before the guard
        cors = Middleware(
            CORSMiddleware,
            allow_origins=sorted(origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding"],
        )
        middleware.insert(0, cors)
    parser = parser or GroupParser(OFF_LOOP_BYTES, settings.max_request_bytes)
    return Starlette(routes=_Routes(state, parser).table(), middleware=middleware)


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
        self.parser = GroupParser(OFF_LOOP_BYTES, self.state.settings.max_request_bytes)
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
        sock = listen_socket(
            self.host,
            self.port,
            self.state.settings.token,
            refusal="refusing to serve {host} without a token: anyone who can reach it could "
            "wipe or poison the training data; give one (--token-file, --token-env or "
            f"{TOKEN_ENV}) or listen on 127.0.0.1",
        )
        self.port = sock.getsockname()[1]
        return sock

    async def start(self) -> None:
        config = uvicorn.Config(
            create_app(self.state, self.parser),
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
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            self._server = self._task = None
            await self.parser.aclose()

    async def wait(self) -> None:
        """Serve until cancelled."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def __aenter__(self) -> ApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
