"""A Chrome DevTools Protocol client over the browser's pipe: NUL-separated JSON messages.

The host end of `browser_launch`'s pump. Everything read here comes from inside the sandbox
(the agent could stand in for Chromium), so a message is bounded in size, every command has a
timeout, and a reply that is not what CDP sends is an error, never trusted further.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Callable
from typing import Any

MAX_MESSAGE = 48 << 20  # a full-page screenshot in base64 fits; anything larger is refused


class CdpError(Exception):
    """A command failed, timed out, or the connection ended."""


class CdpConnection:
    """Commands and events on one pipe; `closed` is set once the other end is gone."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: list[Callable[[str, dict[str, Any], str | None], None]] = []
        self.closed = asyncio.Event()
        self._task = asyncio.create_task(self._read_loop())

    def listen(self, callback: Callable[[str, dict[str, Any], str | None], None]) -> None:
        """`callback(method, params, session_id)` for every event."""
        self._listeners.append(callback)

    async def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 60.0,
    ) -> dict[str, Any]:
        if self.closed.is_set():
            raise CdpError("the browser is gone")
        message_id = next(self._ids)
        message: dict[str, Any] = {"id": message_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        try:
            self._writer.write(json.dumps(message).encode() + b"\0")
            await self._writer.drain()
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError as exc:
            raise CdpError(f"{method} got no answer within {timeout:g} s") from exc
        except (ConnectionError, OSError) as exc:
            raise CdpError(f"the browser is gone ({exc})") from exc
        finally:
            self._pending.pop(message_id, None)

    async def _read_loop(self) -> None:
        try:
            while True:
                try:
                    raw = await self._reader.readuntil(b"\0")
                except asyncio.LimitOverrunError:
                    return  # a message past the bound: the connection is not trusted further
                except (asyncio.IncompleteReadError, ConnectionError, OSError):
                    return
                try:
                    message = json.loads(raw[:-1])
                except ValueError:
                    return
                if not isinstance(message, dict):
                    return
                self._deliver(message)
        finally:
            self.closed.set()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(CdpError("the browser is gone"))
            with contextlib.suppress(Exception):
                self._writer.close()

    def _deliver(self, message: dict[str, Any]) -> None:
        message_id = message.get("id")
        if isinstance(message_id, int):
            future = self._pending.get(message_id)
            if future is None or future.done():
                return
            error = message.get("error")
            result = message.get("result")
            if error is not None:
                detail = error.get("message") if isinstance(error, dict) else error
                future.set_exception(CdpError(str(detail)[:500]))
            elif isinstance(result, dict):
                future.set_result(result)
            else:
                future.set_exception(CdpError("a reply without a result"))
            return
        method = message.get("method")
        params = message.get("params")
        if isinstance(method, str) and isinstance(params, dict):
            session = message.get("sessionId")
            for callback in list(self._listeners):
                callback(method, params, session if isinstance(session, str) else None)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self.closed.set()
