"""The model gateway: an HTTP server a third-party agent takes for its model provider.

It speaks OpenAI Chat Completions (`/v1/chat/completions`), the OpenAI Responses API
(`/v1/responses`, responses.py) and Anthropic Messages (`/v1/messages`), streaming or not,
tool calls included, and forwards each call to the run's model through its `ModelSession`
(a chat endpoint, a token API or the embedded model: the same session clotho's own agent
uses). Each trial gets a `GatewayTrial`: a bearer token of its own
(the real provider key stays in the host's `ModelConfig`, never in the sandbox), its budget
(`GatewayLimits`: turns, tokens, wall clock; a call past it is refused with a 401 whose
message names the limit), its usage count and its `GatewayRecord`.

Listeners are uvicorn servers on the running event loop (Starlette + uvicorn, the `api`
extra): a unix socket per sandbox (`channel.py` puts it where the sandbox can reach it), or
TCP on 127.0.0.1. A listener made for one trial answers that trial's token only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
import stat
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from clotho.chat.models import Model, ModelSession
from clotho.chat.types import Usage
from clotho.errors import AgentLimit, ConfigError, ModelError
from clotho.gateway import responses, wire
from clotho.gateway.record import (
    ExchangeError,
    GatewayApi,
    GatewayExchange,
    GatewayLimits,
    GatewayRecord,
    LimitName,
)

TOKEN_PREFIX = "clotho-gw-"
# A call past the trial's budget: 401, the one status every client takes as final (the token
# is spent). With 403 or 429, litellm (mini-swe-agent) and the SDKs retry with backoff for
# minutes; the message says which limit, and the record keeps it.
LIMIT_STATUS = 401
_LIMIT_TEXT = {
    "turns": "the trial's model-call limit ({} calls) is used up",
    "tokens": "the trial's token budget ({} tokens) is used up",
    "wall_clock": "the trial's time limit ({} s) is over",
    "context": "the conversation no longer fits the model's context",
}


def _digest(token: str) -> bytes:
    """Tokens are looked up by digest: no comparison that leaks how much of a guess matched."""
    return hashlib.sha256(token.encode()).digest()


class GatewayTrial:
    """One trial's access to the model: its token, budget, usage and record."""

    def __init__(self, session: ModelSession, limits: GatewayLimits, model_name: str) -> None:
        self.token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.session = session
        self.limits = limits
        self.record = GatewayRecord(model=model_name)
        self.closed = False
        self._started = time.monotonic()
        self._calls = 0  # indexes handed out, forwarded or not
        self._last_conversation: list[dict[str, Any]] | None = None
        self._responses = responses.ResponseStore()  # for `previous_response_id`

    def env(self, base_url: str) -> dict[str, str]:
        """What an agent reads to find its model: `base_url` is the gateway as the agent
        reaches it (e.g. http://127.0.0.1:PORT, the relay in its sandbox)."""
        root = base_url.rstrip("/")
        return {
            "OPENAI_BASE_URL": f"{root}/v1",
            "OPENAI_API_BASE": f"{root}/v1",
            "OPENAI_API_KEY": self.token,
            "ANTHROPIC_BASE_URL": root,
            "ANTHROPIC_API_KEY": self.token,
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def remaining_s(self) -> float | None:
        if self.limits.timeout_s is None:
            return None
        return self.limits.timeout_s - self.elapsed_s()

    def refusal(self) -> LimitName | None:
        """The budget a new call would exceed, if any."""
        remaining = self.remaining_s()
        if remaining is not None and remaining <= 0:
            return "wall_clock"
        if self.limits.max_turns is not None and self.record.turns >= self.limits.max_turns:
            return "turns"
        tokens = self.limits.max_tokens
        if tokens is not None and self.record.usage.total_tokens >= tokens:
            return "tokens"
        return None

    def limit_message(self, limit: LimitName) -> str:
        value = {
            "turns": self.limits.max_turns,
            "tokens": self.limits.max_tokens,
            "wall_clock": self.limits.timeout_s,
        }.get(limit)
        return "clotho gateway: " + _LIMIT_TEXT[limit].format(value)

    def agent_limit(self) -> AgentLimit | None:
        """The error that ends the trial when the agent ran out of a budget (None: it did not)."""
        if self.record.limit is None:
            return None
        return AgentLimit(self.limit_message(self.record.limit))

    def _hit(self, limit: LimitName) -> None:
        if self.record.limit is None:
            self.record.limit = limit

    def _next_index(self) -> int:
        index, self._calls = self._calls, self._calls + 1
        return index

    def finish(self) -> GatewayRecord:
        """Close the trial to new calls and return its record; on a token API the record gets
        the exact training sequences of the last conversation the agent sent."""
        self.closed = True
        sequences = getattr(self.session, "sequences", None)
        if self._last_conversation is not None and sequences is not None:
            found = sequences(self._last_conversation)
            if found is not None:
                self.record.sequences = list(found)
        return self.record


class _EmbeddedServer:
    """A uvicorn server that leaves signals to the caller (made lazily: uvicorn is an extra)."""

    @staticmethod
    def make(config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                yield

        return Server(config)


class Listener:
    """One uvicorn server on one socket; `close` stops it and removes its socket file."""

    def __init__(self, server: Any, task: asyncio.Task[None], sock: socket.socket) -> None:
        self._server = server
        self._task = task
        self._sock = sock
        self.url: str | None = None
        self._unlink: tuple[int, str] | None = None  # (dir fd, name) of a unix socket

    async def close(self) -> None:
        self._server.should_exit = True
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        finally:
            self._sock.close()
            if self._unlink is not None:
                fd, name = self._unlink
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)  # a name in its folder: no link followed
                os.close(fd)
                self._unlink = None


class Gateway:
    """The gateway of one run: forwards to `model`; trials come and go."""

    def __init__(self, model: Model, *, model_name: str) -> None:
        self.model = model
        self.model_name = model_name
        self._trials: dict[bytes, GatewayTrial] = {}
        self._listeners: list[Listener] = []

    # -- trials -------------------------------------------------------------------------------

    def open_trial(
        self, limits: GatewayLimits | None = None, *, session: ModelSession | None = None
    ) -> GatewayTrial:
        trial = GatewayTrial(session or self.model.session(), limits or GatewayLimits(),
                             self.model_name)  # fmt: skip
        self._trials[_digest(trial.token)] = trial
        return trial

    def close_trial(self, trial: GatewayTrial) -> GatewayRecord:
        """The trial's token stops working; its record, finished."""
        self._trials.pop(_digest(trial.token), None)
        return trial.finish()

    # -- listeners ----------------------------------------------------------------------------

    async def listen_tcp(
        self, host: str = "127.0.0.1", port: int = 0, *, trial: GatewayTrial | None = None
    ) -> Listener:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"the gateway cannot listen on {host}:{port}: {exc}") from exc
        listener = await self._serve(sock, trial)
        listener.url = f"http://{host}:{sock.getsockname()[1]}"
        return listener

    async def listen_unix(
        self,
        folder: str | os.PathLike[str],
        name: str,
        *,
        trial: GatewayTrial | None = None,
        owner_uid: int | None = None,
        mode: int | None = None,
    ) -> Listener:
        """Listen on the socket `folder/name`. The folder is opened once (no link followed)
        and the socket bound through that fd, so a long host path (past the 108 bytes of a
        socket address) works and a folder the sandbox can write cannot redirect the bind.
        `owner_uid` gives the socket to the sandbox's uid (connecting needs write access to
        it); `mode` is set only where the folder is the host's alone."""
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(f"/proc/self/fd/{fd}/{name}")
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISSOCK(info.st_mode):
                raise OSError(f"{name} in {folder} is not the socket just bound")
            if owner_uid is not None:
                os.chown(name, owner_uid, owner_uid, dir_fd=fd, follow_symlinks=False)
            if mode is not None:
                os.chmod(name, mode, dir_fd=fd)
            listener = await self._serve(sock, trial)
        except BaseException:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
            os.close(fd)
            raise
        listener._unlink = (fd, name)
        return listener

    async def _serve(self, sock: socket.socket, trial: GatewayTrial | None) -> Listener:
        try:
            import uvicorn
        except ImportError as exc:  # pragma: no cover - the extra is part of dev installs
            raise ConfigError(
                "the model gateway needs Starlette and uvicorn: pip install 'clotho-rl[api]'"
            ) from exc
        config = uvicorn.Config(
            self._app(trial),
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        server = _EmbeddedServer.make(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                await task
                raise ConfigError("the gateway's server stopped during start-up")
            await asyncio.sleep(0.005)
        listener = Listener(server, task, sock)
        self._listeners.append(listener)
        return listener

    async def aclose(self) -> None:
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            await listener.close()

    async def close_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)
        await listener.close()

    # -- HTTP ---------------------------------------------------------------------------------

    def _app(self, only: GatewayTrial | None) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        async def chat(request: Any) -> Any:
            return await self._handle(request, "openai-chat", only)

        async def messages(request: Any) -> Any:
            return await self._handle(request, "anthropic-messages", only)

        async def responses_route(request: Any) -> Any:
            return await self._handle(request, "openai-responses", only)

        async def models(request: Any) -> Any:
            from starlette.responses import JSONResponse

            if self._trial_of(request, only) is None:
                return JSONResponse(wire.openai_error(401, "unknown token", "auth"), 401)
            data = [{"id": self.model_name, "object": "model", "owned_by": "clotho"}]
            return JSONResponse({"object": "list", "data": data})

        routes = [
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses_route, methods=["POST"]),
            Route("/responses", responses_route, methods=["POST"]),
            Route("/v1/messages", messages, methods=["POST"]),
            Route("/messages", messages, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
        return Starlette(routes=routes)

    def _trial_of(self, request: Any, only: GatewayTrial | None) -> GatewayTrial | None:
        token = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if token is None and auth[:7].lower() == "bearer ":
            token = auth[7:].strip()
        if not token:
            return None
        trial = self._trials.get(_digest(token))
        if trial is None or trial.closed or (only is not None and trial is not only):
            return None
        return trial

    async def _handle(self, request: Any, api: GatewayApi, only: GatewayTrial | None) -> Any:
        from starlette.responses import JSONResponse

        def error(status: int, message: str, kind: str) -> Any:
            if api == "anthropic-messages":
                return JSONResponse(wire.anthropic_error(message, kind), status)
            if api == "openai-responses":
                return JSONResponse(responses.responses_error(status, message, kind), status)
            return JSONResponse(wire.openai_error(status, message, kind), status)

        trial = self._trial_of(request, only)
        if trial is None:
            return error(401, "clotho gateway: unknown or expired token", "authentication_error")
        body = await _read_body(request, trial.limits.max_request_bytes)
        if body is None:
            limit = trial.limits.max_request_bytes
            return error(
                413, f"clotho gateway: request body over {limit} bytes", "request_too_large"
            )
        exchange = GatewayExchange(
            index=trial._next_index(),
            api=api,
            path=request.url.path,
            started_s=trial.elapsed_s(),
            status=0,
            request=body,
        )
        started = time.monotonic()
        try:
            return await self._exchange(trial, exchange, error)
        finally:
            exchange.latency_s = time.monotonic() - started
            trial.record.exchanges.append(exchange)

    async def _exchange(self, trial: GatewayTrial, exchange: GatewayExchange, error: Any) -> Any:
        from starlette.responses import JSONResponse, StreamingResponse

        def refuse(status: int, failure: ExchangeError, kind: str) -> Any:
            exchange.status, exchange.error = status, failure
            return error(status, failure.message, kind)

        api, body = exchange.api, exchange.request
        if isinstance(body, WireFailure):
            exchange.request = body.text
            return refuse(400, ExchangeError(kind="agent", message=body.message),
                          "invalid_request_error")  # fmt: skip
        limit = trial.refusal()
        if limit is not None:
            trial._hit(limit)
            failure = ExchangeError(kind="limit", message=trial.limit_message(limit), limit=limit)
            return refuse(LIMIT_STATUS, failure, "clotho_limit_reached")
        try:
            if api == "openai-responses":
                messages, tools = responses.read_responses(body, trial._responses)
            elif api == "anthropic-messages":
                messages, tools = wire.read_anthropic(body)
            else:
                messages, tools = wire.read_openai(body)
        except (wire.WireError, TypeError, ValueError) as exc:
            message = f"clotho gateway: {exc}"
            return refuse(400, ExchangeError(kind="agent", message=message),
                          "invalid_request_error")  # fmt: skip
        exchange.forwarded, exchange.tools = messages, tools
        exchange.stream = bool(body.get("stream"))
        trial.record.turns += 1
        remaining = trial.remaining_s()
        timer = asyncio.timeout(remaining)
        try:
            async with timer:
                turn = await trial.session.complete(messages, tools)
        except TimeoutError:
            if not timer.expired():
                raise
            trial._hit("wall_clock")
            failure = ExchangeError(
                kind="limit", message=trial.limit_message("wall_clock"), limit="wall_clock"
            )
            return refuse(LIMIT_STATUS, failure, "clotho_limit_reached")
        except AgentLimit as exc:  # the context is full (token APIs)
            trial._hit("context")
            message = f"{trial.limit_message('context')}: {exc}"
            failure = ExchangeError(kind="limit", message=message, limit="context")
            return refuse(400, failure, "context_length_exceeded")
        except ModelError as exc:
            trial.record.infra_errors += 1
            failure = ExchangeError(
                kind="infra", message=f"clotho gateway: the model failed: {exc}"
            )
            return refuse(502, failure, "api_error")
        trial.record.usage = trial.record.usage + turn.usage
        exchange.turn = turn
        exchange.status = 200
        name = body.get("model") if isinstance(body.get("model"), str) else self.model_name
        if api == "anthropic-messages":
            reply = wire.anthropic_reply(turn, model=name)
            assistant = _assistant_of_anthropic(reply)
        elif api == "openai-responses":
            reply = responses.responses_reply(turn, model=name, body=body)
            assistant = responses.assistant_of(reply)
            trial._responses.put(reply["id"], [*messages, assistant])
        else:
            reply = wire.openai_reply(turn, model=name)
            assistant = reply["choices"][0]["message"]
        exchange.response = reply
        trial._last_conversation = [*messages, assistant]
        if not exchange.stream:
            return JSONResponse(reply)
        if api == "anthropic-messages":
            events = wire.anthropic_events(reply)
        elif api == "openai-responses":
            events = responses.responses_events(reply)
        else:
            options = body.get("stream_options")
            include = isinstance(options, dict) and bool(options.get("include_usage"))
            events = wire.openai_events(reply, include_usage=include)
        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(_aiter(events), media_type="text/event-stream", headers=headers)


async def _aiter(events: list[str]) -> AsyncIterator[str]:
    """The events as an async iterator (a plain one would be walked in a worker thread)."""
    for event in events:
        yield event


class WireFailure:
    """A body that is not JSON: kept as text (cut) for the record."""

    def __init__(self, text: str, message: str) -> None:
        self.text, self.message = text, message


async def _read_body(request: Any, limit: int) -> Any:
    """The parsed JSON body, a `WireFailure` for one that is not JSON, None past `limit` bytes
    (counted as it arrives: a client cannot make the gateway hold more)."""
    import json

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except ValueError as exc:
        text = raw[:4096].decode(errors="replace")
        return WireFailure(text, f"clotho gateway: the body is not JSON ({exc})")


def _assistant_of_anthropic(reply: dict[str, Any]) -> dict[str, Any]:
    """The Messages reply as the OpenAI-form assistant message the next request will carry."""
    return wire.read_anthropic({"messages": [{"role": "assistant", "content": reply["content"]}]})[
        0
    ][0]


def usage_of(records: list[GatewayRecord]) -> Usage:
    """Usage summed over several trials' records (a run's total)."""
    total = Usage()
    for record in records:
        total = total + record.usage
    return total
