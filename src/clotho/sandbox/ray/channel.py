"""The command channel: one TCP stream from the driver to each node's host actor.

A Ray actor call costs 1.0-1.4 ms here (two thread hops on each side and Ray's task
bookkeeping), more than a command in a warm sandbox. So commands and small files go over a
stream the host actor serves on its own event loop, many requests in flight on one
connection. The actor starts the server when the driver asks (a Ray call, the control
plane), on the address Ray reports for its node, and admits only a client that proves it
holds a secret the driver gave it in that call. Sandboxes are opened, closed and listed
through Ray calls; big files move as Ray objects.

Nothing read from the network is unpickled or run, before or after authentication:

1. Handshake, raw bytes of fixed sizes, nothing parsed. The server sends `MAGIC` and a
   random nonce; the client answers its own nonce and HMAC-SHA256(secret, "client" +
   both nonces); the server compares it in constant time with the MAC of every secret it
   admits, closes the connection on a mismatch (or after `HANDSHAKE_S`), and otherwise
   proves the secret back (HMAC of "server" + both nonces), which the client checks. The
   secret itself never travels on the channel.
2. Then frames: a 4-byte length and a msgpack body (no extension types), `[id, method,
   args]` one way and `[id, "ok", value]` or `[id, "err", error]` back. The server
   validates `args` against the method's pydantic schema before anything runs; an error
   travels as its type's name (from an allowlist: builtins and `clotho.errors`) and its
   message, and is re-made on the driver.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import hmac
import itertools
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from clotho import errors as clotho_errors

HEADER = struct.Struct("!I")
MAX_FRAME = 256 << 20
CANCEL = "__cancel__"
MAGIC = b"clotho-channel/2"  # 16 bytes: what this server speaks
NONCE = 32
MAC = hashlib.sha256().digest_size
HANDSHAKE_S = 10.0


class ChannelLost(ConnectionError):
    """The stream to a host ended: the node or its actor may be gone."""


class ChannelRefused(ChannelLost):
    """The handshake failed: a wrong secret on either side, or not a channel server."""


# -- the schema of requests -----------------------------------------------------------------


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExecArgs(_Options):
    """`Sandbox.exec`'s keyword options (`base.ExecOptions`)."""

    timeout: float | None = None
    cwd: str | None = None
    env: dict[str, str] | None = None
    user: str | None = None


class FreshArgs(_Options):
    """`Sandbox.exec_fresh`'s keyword options (`base.FreshCall.options`)."""

    timeout: float
    env: dict[str, str] | None = None
    cwd: str | None = None
    stdin: bytes | None = None
    max_output_bytes: int = 1 << 20


# What may travel over the channel, each with the schema of its positional arguments (the
# first is the sandbox id): the calls of a sandbox in use, nothing that opens, closes or
# lists sandboxes.
SCHEMAS: dict[str, TypeAdapter[Any]] = {
    "exec": TypeAdapter(tuple[str, str, ExecArgs]),
    "exec_fresh": TypeAdapter(tuple[str, str, FreshArgs]),
    "stop_agent": TypeAdapter(tuple[str]),
    "digests": TypeAdapter(tuple[str, list[str]]),
    "read_file": TypeAdapter(tuple[str, str, int]),
    "write_file": TypeAdapter(tuple[str, str, bytes]),
}
METHODS = frozenset(SCHEMAS)


def parse_args(method: str, args: Any) -> tuple[Any, ...]:
    """`args` as `method` takes them (options as a dict of the fields that were sent);
    ValueError when they do not fit its schema."""
    schema = SCHEMAS.get(method)
    if schema is None:
        raise ValueError(f"{method} is not served on the channel")
    if not isinstance(args, list):
        raise ValueError(f"the arguments of {method} are not a list")
    try:
        parsed = schema.validate_python(tuple(args), strict=False)
    except ValidationError as exc:
        raise ValueError(f"bad arguments for {method}: {exc.error_count()} problem(s)") from None
    return tuple(
        a.model_dump(exclude_unset=True) if isinstance(a, BaseModel) else a for a in parsed
    )


# -- errors as data -------------------------------------------------------------------------


def _allowed_errors() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module in (builtins, clotho_errors):
        for name, value in vars(module).items():
            if (
                isinstance(value, type)
                and issubclass(value, Exception)
                and not issubclass(value, Warning)
                and value.__module__ == module.__name__
            ):
                found[name] = value
    return found


ERRORS = _allowed_errors()


def encode_error(exc: BaseException) -> dict[str, Any]:
    """An exception as data: the nearest allowed class in its MRO, its message, and an
    OSError's errno, text and file name."""
    name = next(
        (c.__name__ for c in type(exc).__mro__ if ERRORS.get(c.__name__) is c), "SandboxError"
    )
    data: dict[str, Any] = {"type": name, "message": str(exc)}
    if isinstance(exc, OSError) and exc.errno is not None:
        data.update(
            errno=exc.errno,
            strerror=exc.strerror,
            filename=None if exc.filename is None else str(exc.filename),
        )
    elif name != type(exc).__name__:
        data["message"] = f"{type(exc).__name__}: {exc}"
    return data


def decode_error(data: Any) -> BaseException:
    """The exception `encode_error` described; a SandboxError if it does not fit."""
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        return clotho_errors.SandboxError(f"the sandbox host sent a malformed error: {data!r:.200}")
    cls = ERRORS.get(data["type"], clotho_errors.SandboxError)
    message = str(data.get("message", ""))
    errno_ = data.get("errno")
    if issubclass(cls, OSError) and isinstance(errno_, int):
        args: list[Any] = [errno_, str(data.get("strerror") or "")]
        if isinstance(data.get("filename"), str):
            args.append(data["filename"])
        return cls(*args)
    try:
        return cls(message)
    except Exception:
        return clotho_errors.SandboxError(f"{data['type']}: {message}")


# -- frames ---------------------------------------------------------------------------------


def _no_extensions(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} refused")


def pack(obj: Any) -> bytes:
    body: bytes = msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogateescape")
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes refused")
    body = await reader.readexactly(size)
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            ext_hook=_no_extensions,
            unicode_errors="surrogateescape",
        )
    except Exception as exc:  # malformed data ends the connection, nothing else
        raise ConnectionError(f"malformed frame: {exc}") from None


def _mac(secret: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(secret, role + first + second, hashlib.sha256).digest()


# -- the two ends ---------------------------------------------------------------------------


Reply = tuple[str, Any]


class ChannelServer:
    """Serves `handler(method, *args) -> ("ok", value) | ("err", exception)` to clients
    that prove they hold one of the admitted secrets."""

    def __init__(
        self, handler: Callable[..., Awaitable[Reply]], *, handshake_s: float = HANDSHAKE_S
    ) -> None:
        self._handler = handler
        self._handshake_s = handshake_s
        self._secrets: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, secret: bytes) -> int:
        """Listen on `host` (once; an ephemeral port) and admit `secret`; the port."""
        if len(secret) < 16:
            raise ValueError("a channel secret has at least 16 bytes")
        if secret not in self._secrets:
            self._secrets.append(secret)
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def bound(self) -> list[tuple[str, int]]:
        """The addresses the server listens on."""
        if self._server is None:
            return []
        return [tuple(s.getsockname()[:2]) for s in self._server.sockets]  # type: ignore[misc]

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        ours = os.urandom(NONCE)
        writer.write(MAGIC + ours)
        answer = await reader.readexactly(NONCE + MAC)
        theirs, mac = answer[:NONCE], answer[NONCE:]
        secret = _match(mac, [(s, _mac(s, b"client", ours, theirs)) for s in self._secrets])
        if secret is None:
            return False
        writer.write(_mac(secret, b"server", theirs, ours))
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        running: dict[int, asyncio.Task[Any]] = {}
        self._writers.add(writer)
        try:
            if not await asyncio.wait_for(self._authenticate(reader, writer), self._handshake_s):
                return
            while True:
                request = await read_frame(reader)
                if not (
                    isinstance(request, list)
                    and len(request) == 3
                    and isinstance(request[0], int)
                    and isinstance(request[1], str)
                ):
                    return  # not a request: the client is broken, the stream ends
                rid, method, args = request
                if method == CANCEL:
                    task = running.get(rid)
                    if task is not None:
                        task.cancel()
                    continue
                task = asyncio.ensure_future(self._answer(rid, method, args, writer, running))
                running[rid] = task
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, EOFError):
            pass
        finally:
            for task in running.values():
                task.cancel()
            self._writers.discard(writer)
            writer.close()

    async def _answer(
        self,
        rid: int,
        method: str,
        args: Any,
        writer: asyncio.StreamWriter,
        running: dict[int, asyncio.Task[Any]],
    ) -> None:
        try:
            try:
                status, value = await self._handler(method, *parse_args(method, args))
            except Exception as exc:  # bad arguments, or a handler that broke
                status, value = "err", exc
            if status == "err":
                frame = pack([rid, "err", encode_error(value)])
            else:
                try:
                    frame = pack([rid, "ok", value])
                except (TypeError, ValueError) as exc:  # a value with no msgpack form
                    frame = pack([rid, "err", encode_error(exc)])
            with contextlib.suppress(ConnectionError):
                writer.write(frame)
        finally:
            running.pop(rid, None)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):  # the clients see the stream end
            writer.close()


def _match(mac: bytes, expected: list[tuple[bytes, bytes]]) -> bytes | None:
    """The secret whose MAC is `mac`; every one is compared, in constant time."""
    found = None
    for secret, candidate in expected:
        if hmac.compare_digest(mac, candidate) and found is None:
            found = secret
    return found


class ChannelClient:
    """The driver's end: requests in flight matched to replies by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._lost: BaseException | None = None
        self._pump = asyncio.ensure_future(self._read())

    @classmethod
    async def connect(cls, host: str, port: int, secret: bytes) -> ChannelClient:
        """Connect and authenticate both ways; `ChannelRefused` when the server does not
        prove it holds `secret` (or refuses ours)."""
        reader, writer = await asyncio.open_connection(host, port)
        try:
            hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + NONCE), HANDSHAKE_S)
            if hello[: len(MAGIC)] != MAGIC:
                raise ChannelRefused(f"{host}:{port} does not speak {MAGIC.decode()}")
            theirs, ours = hello[len(MAGIC) :], os.urandom(NONCE)
            writer.write(ours + _mac(secret, b"client", theirs, ours))
            proof = await asyncio.wait_for(reader.readexactly(MAC), HANDSHAKE_S)
            if not hmac.compare_digest(proof, _mac(secret, b"server", ours, theirs)):
                raise ChannelRefused(f"{host}:{port} did not prove it holds the secret")
        except asyncio.IncompleteReadError as exc:
            writer.close()
            raise ChannelRefused(f"{host}:{port} refused the channel's secret") from exc
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer)

    @property
    def lost(self) -> bool:
        return self._lost is not None

    async def _read(self) -> None:
        try:
            while True:
                reply = await read_frame(self._reader)
                if not (isinstance(reply, list) and len(reply) == 3):
                    raise ConnectionError("malformed reply")
                rid, status, value = reply
                future = self._pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(
                        ("err", decode_error(value)) if status == "err" else ("ok", value)
                    )
        except (ConnectionError, asyncio.IncompleteReadError, EOFError, OSError) as exc:
            self._lost = exc
        except asyncio.CancelledError:
            self._lost = ChannelLost("the channel was closed")
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ChannelLost(f"the stream to the host ended: {self._lost}"))
            self._pending.clear()
            self._writer.close()

    async def call(self, method: str, *args: Any) -> Reply:
        """`("ok", value)` or `("err", exception)`, as the host's handler answered."""
        if self._lost is not None:
            raise ChannelLost(f"the stream to the host ended: {self._lost}")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._writer.write(pack([rid, method, list(args)]))
        try:
            result: Reply = await future
            return result
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
            if self._lost is None:
                with contextlib.suppress(Exception):
                    self._writer.write(pack([rid, CANCEL, []]))
            raise

    async def aclose(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(BaseException):
            await self._pump
