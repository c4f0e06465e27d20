"""The command channel: one TCP stream from the driver to each node's host actor.

A Ray actor call costs 1.0-1.4 ms here (two thread hops on each side and Ray's task
bookkeeping), more than a command in a warm sandbox. So commands and small files go over a
stream the host actor serves on its own event loop: length-prefixed pickled frames,
`(request id, method, args)` one way and `(request id, reply)` back, many requests in
flight on one connection. The actor starts the server when the driver asks (a Ray call,
the control plane) and admits only connections that first send the token the driver gave
it then. Sandboxes are opened, closed and listed through Ray calls; big files move as Ray
objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import pickle
import struct
from collections.abc import Awaitable, Callable
from typing import Any

HEADER = struct.Struct("!I")
MAX_FRAME = 256 << 20
CANCEL = "__cancel__"
# What may travel over the channel: the calls of a sandbox in use, nothing that opens,
# closes or lists sandboxes.
METHODS = frozenset({"exec", "exec_fresh", "stop_agent", "digests", "read_file", "write_file"})


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes refused")
    return pickle.loads(await reader.readexactly(size))


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


class ChannelServer:
    """Serves `handler(method, *args)` for clients that present `token` first."""

    def __init__(self, handler: Callable[..., Awaitable[Any]]) -> None:
        self._handler = handler
        self._tokens: set[str] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, token: str) -> int:
        self._tokens.add(token)
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        running: dict[int, asyncio.Task[Any]] = {}
        self._writers.add(writer)
        try:
            hello = await asyncio.wait_for(_read_frame(reader), 10)
            if not isinstance(hello, str) or not any(
                hmac.compare_digest(hello, t) for t in self._tokens
            ):
                return
            while True:
                rid, method, args = await _read_frame(reader)
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
        args: tuple[Any, ...],
        writer: asyncio.StreamWriter,
        running: dict[int, asyncio.Task[Any]],
    ) -> None:
        try:
            if method not in METHODS:
                reply: Any = ("err", ValueError(f"{method} is not served on the channel"))
            else:
                reply = await self._handler(method, *args)
            with contextlib.suppress(ConnectionError):
                writer.write(_frame((rid, reply)))
        finally:
            running.pop(rid, None)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):  # the clients see the stream end
            writer.close()


class ChannelLost(ConnectionError):
    """The stream to a host ended: the node or its actor may be gone."""


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
    async def connect(cls, host: str, port: int, token: str) -> ChannelClient:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(_frame(token))
        return cls(reader, writer)

    @property
    def lost(self) -> bool:
        return self._lost is not None

    async def _read(self) -> None:
        try:
            while True:
                rid, reply = await _read_frame(self._reader)
                future = self._pending.pop(rid, None)
                if future is not None and not future.done():
                    future.set_result(reply)
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

    async def call(self, method: str, *args: Any) -> Any:
        if self._lost is not None:
            raise ChannelLost(f"the stream to the host ended: {self._lost}")
        rid = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        self._writer.write(_frame((rid, method, args)))
        try:
            return await future
        except asyncio.CancelledError:
            self._pending.pop(rid, None)
            if self._lost is None:
                with contextlib.suppress(Exception):
                    self._writer.write(_frame((rid, CANCEL, ())))
            raise

    async def aclose(self) -> None:
        self._pump.cancel()
        with contextlib.suppress(BaseException):
            await self._pump
