"""TEST DOUBLE for a hosted OpenAI-compatible model (vLLM, SGLang, OpenRouter, OpenAI).

The real model is a hosted service that cannot run in the test environment, so this module
stands in for it: `ScriptedOpenAIServer` is a real HTTP server on 127.0.0.1 (the standard
library's `ThreadingHTTPServer` in a background thread, on a free port) that implements
`POST /v1/chat/completions` and replays a scripted list of replies, one per request:

* a `dict`: the assistant message to return (`content`, optional `tool_calls`,
  `reasoning_content` / `reasoning` / `reasoning_details`, ...);
* `Reply(message, usage=..., finish_reason=...)`: the same with `usage`;
* `HTTPError(status, body, headers)`: an error status with a raw body;
* `RawBody(body, status=200)`: any raw body, e.g. malformed JSON;
* a callable taking the request JSON and returning any of the above.

A callable entry runs on the request's own server thread: to hold a request in flight, it
waits on an event the test sets (no entry sleeps: a test orders events, it does not race a
delay). When the script runs out, `default` is replayed; without a default the server
answers HTTP 500 and counts it in `exhausted`, so a test that made more requests than
scripted fails loudly.
Every request body (parsed JSON) and its headers are recorded in `requests` / `headers`.

Nothing here talks to a real model; the replies are exactly what the script says.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clotho.chat import ChatClient, ModelConfig


@dataclass
class Reply:
    """A successful completion: the assistant `message`, and optionally `usage`."""

    message: dict[str, Any]
    usage: dict[str, int] | None = None
    finish_reason: str | None = None


@dataclass
class HTTPError:
    """An HTTP error status with a raw body (and optional headers such as Retry-After)."""

    status: int
    body: str = '{"error": {"message": "scripted error"}}'
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RawBody:
    """Any raw body with any status, e.g. malformed JSON with status 200."""

    body: str | bytes
    status: int = 200
    content_type: str = "application/json"


ScriptEntry = dict[str, Any] | Reply | HTTPError | RawBody | Callable[[Any], Any]

CHAT_PATH = "/v1/chat/completions"


def tool_call(name: str, arguments: Any = None, id: str | None = None) -> dict[str, Any]:
    """An OpenAI tool call; `arguments` that are not a string are JSON-encoded."""
    if arguments is None:
        arguments = {}
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": raw}}
    if id is not None:
        call["id"] = id
    return call


def assistant(
    content: str | None = "", tool_calls: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    """An assistant message; `extra` adds fields such as `reasoning_content`."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", **c} if "id" not in c else c for i, c in enumerate(tool_calls)
        ]
    message.update(extra)
    return message


class ScriptedOpenAIServer:
    """Test double for a hosted OpenAI-compatible chat-completions endpoint (see module doc)."""

    def __init__(
        self,
        script: Iterable[ScriptEntry] = (),
        *,
        default: ScriptEntry | None = None,
        model: str = "scripted-model",
        path: str | None = None,
    ) -> None:
        self.path = path or CHAT_PATH  # e.g. "/v1/completions" to stand in for vLLM's token API
        self.script: list[ScriptEntry] = list(script)
        self.default = default
        self.model = model
        self.requests: list[Any] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.exhausted = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> ScriptedOpenAIServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # no 40 ms delayed-ACK stalls per request

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                # A client that gave up (timeout) leaves nobody to answer.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    owner._handle(self, raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and records -------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None, "server not started"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self.script)

    def messages(self, index: int = -1) -> list[dict[str, Any]]:
        """The `messages` of the request number `index` (default: the last one)."""
        return self.requests[index]["messages"]

    # -- serving ---------------------------------------------------------------------------

    def _next(self, body: Any) -> ScriptEntry | None:
        with self._lock:
            self.requests.append(body)
            if self.script:
                entry: ScriptEntry | None = self.script.pop(0)
            else:
                entry = self.default
                if entry is None:
                    self.exhausted += 1
        if callable(entry):
            entry = entry(body)
        return entry

    def _handle(self, handler: BaseHTTPRequestHandler, raw: bytes) -> None:
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        with self._lock:
            self.headers.append({k.lower(): v for k, v in handler.headers.items()})
            self.paths.append(handler.path)
        if handler.path != self.path:
            _send(handler, 404, b'{"error": {"message": "not found"}}')
            return
        entry = self._next(body)
        if entry is None:
            _send(handler, 500, b'{"error": {"message": "scripted server: script exhausted"}}')
            return
        if isinstance(entry, dict):
            entry = Reply(entry)
        if isinstance(entry, HTTPError):
            _send(handler, entry.status, entry.body.encode(), entry.headers)
        elif isinstance(entry, RawBody):
            data = entry.body.encode() if isinstance(entry.body, str) else entry.body
            _send(handler, entry.status, data, {"Content-Type": entry.content_type})
        elif isinstance(entry, Reply):
            _send(handler, 200, json.dumps(self._completion(entry)).encode())
        else:
            raise TypeError(f"unknown script entry: {entry!r}")

    def _completion(self, reply: Reply) -> dict[str, Any]:
        message = {"role": "assistant", **reply.message}
        finish = reply.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
        data: dict[str, Any] = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        if reply.usage is not None:
            data["usage"] = reply.usage
        return data


def _send(
    handler: BaseHTTPRequestHandler,
    status: int,
    data: bytes,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    headers = {"Content-Type": "application/json", **(headers or {})}
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
    handler.wfile.flush()


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def unused_url() -> str:
    """A base URL on a port where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def fast_config(*base_urls: str, **overrides: Any) -> ModelConfig:
    """A `ModelConfig` with tiny backoffs so retry tests stay fast."""
    settings: dict[str, Any] = {
        "model": "scripted-model",
        "base_url": list(base_urls) if len(base_urls) != 1 else base_urls[0],
        "api_key_env": None,
        "timeout_s": 10.0,
        "max_retries": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    settings.update(overrides)
    return ModelConfig(**settings)


@contextlib.asynccontextmanager
async def chat_client(config: ModelConfig, **kwargs: Any) -> AsyncIterator[ChatClient]:
    client = ChatClient(config, **kwargs)
    try:
        yield client
    finally:
        await client.aclose()
