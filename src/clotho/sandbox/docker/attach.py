"""A hijacked `POST /exec/{id}/start` connection, demultiplexed straight into two readers.

Docker multiplexes an exec's stdout and stderr into one socket as frames (an 8-byte header:
stream type, three zero bytes, a big-endian length). aiodocker parses them into a queue that
a pump task drains; on a hot path of thousands of commands per second that extra hop costs
more than the command. This protocol parses the frames in `data_received` and feeds the
shell's stream readers directly. Used when the Engine API is a unix socket.
"""

from __future__ import annotations

import asyncio
import json
import struct

from clotho.errors import SandboxError

_HEADER = struct.Struct(">BxxxL")


class AttachProtocol(asyncio.Protocol):
    def __init__(self, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._headers_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._headers_done:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status_line = bytes(self._buffer[: self._buffer.find(b"\r\n")])
            del self._buffer[: end + 4]
            parts = status_line.split()
            if len(parts) < 2 or parts[1] not in (b"101", b"200"):
                if not self.upgraded.done():
                    self.upgraded.set_exception(
                        SandboxError(f"exec attach refused: {status_line.decode(errors='replace')}")
                    )
                return
            self._headers_done = True
            if not self.upgraded.done():
                self.upgraded.set_result(None)
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= _HEADER.size:
            kind, size = _HEADER.unpack_from(buffer, offset)
            start = offset + _HEADER.size
            if len(buffer) - start < size:
                break
            payload = bytes(buffer[start : start + size])
            (self.stderr if kind == 2 else self.stdout).feed_data(payload)
            offset = start + size
        if offset:
            del buffer[:offset]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(SandboxError(f"exec attach connection lost: {exc}"))
        self.stdout.feed_eof()
        self.stderr.feed_eof()


async def attach_exec(
    socket_path: str, exec_id: str, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader
) -> tuple[asyncio.Transport, AttachProtocol]:
    """Start the exec with stdin attached; returns the raw transport to write stdin to."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_unix_connection(
        lambda: AttachProtocol(stdout, stderr), socket_path
    )
    body = json.dumps({"Detach": False, "Tty": False}).encode()
    request = (
        f"POST /exec/{exec_id}/start HTTP/1.1\r\nHost: docker\r\n"
        "Content-Type: application/json\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    transport.write(request)
    try:
        await asyncio.wait_for(protocol.upgraded, 30)
    except BaseException:
        transport.close()
        raise
    return transport, protocol  # type: ignore[return-value]
