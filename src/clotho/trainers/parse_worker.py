"""Validating large scored-group bodies in a separate process, so the API's event loop never waits.

Parsing 100 MB of JSON into Python lists takes about a second of CPU with the GIL held in
long stretches: in a thread of the server it still froze every other client for up to a
second. Here one child process (`python -m clotho.trainers.parse_worker`, started on the
first large body and kept) does it; the server only moves bytes through a pipe, and keeps
the child's answer: each group's wire JSON (`QueuedGroup`). One body at a time, so N huge
bodies at once cannot multiply the memory.

Pipe protocol, both ways length-prefixed: request `!QBq` (body length, list or single,
vocabulary size or -1) then the body; reply `!BQ` (status, payload length) then the payload:
status 0 = `!I` + JSON `[[size, env_id, length], ...]` + the groups' wire JSON concatenated;
1 = pydantic's errors as JSON (a 422); 2 = an unexpected error's text.
"""

from __future__ import annotations

import asyncio
import json
import signal
import struct
import sys
from typing import BinaryIO

from pydantic import TypeAdapter, ValidationError

from clotho.env.scored import WIRE_EXCLUDE, ScoredGroup
from clotho.trainers.state import QueuedGroup, Rejected

try:
    import orjson
except ImportError:  # optional: pydantic reads and writes JSON too, a little slower
    orjson = None  # type: ignore[assignment]

_REQUEST = struct.Struct("!QBq")
_REPLY = struct.Struct("!BQ")
_META = struct.Struct("!I")
OK, INVALID, FAILED = 0, 1, 2

_GROUPS = TypeAdapter(list[ScoredGroup])
WIRE_FIELDS = tuple(name for name in ScoredGroup.model_fields if name not in WIRE_EXCLUDE)


class InvalidGroups(Exception):
    """The body is not valid scored data; `errors_json` is pydantic's list of errors."""

    def __init__(self, errors_json: str) -> None:
        super().__init__(errors_json)
        self.errors_json = errors_json


def parse_groups(body: bytes, *, many: bool, vocab_size: int | None) -> list[QueuedGroup]:
    """Validate one group (or a JSON list of them) and keep each as its wire JSON.

    With orjson (the `api` extra) the JSON is read and written by it, about 20% faster than
    pydantic's own; what orjson refuses (NaN, ints beyond 64 bits, bad JSON) goes through
    pydantic, which says precisely what is wrong.
    """
    context = {"vocab_size": vocab_size}
    if orjson is not None:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        if data is not None:
            if many:
                groups = _GROUPS.validate_python(data, context=context)
            else:
                groups = [ScoredGroup.model_validate(data, context=context)]
            del data
            return [QueuedGroup(g.size, g.env_id, _wire_bytes(g)) for g in groups]
    if many:
        groups = _GROUPS.validate_json(body, context=context)
    else:
        groups = [ScoredGroup.model_validate_json(body, context=context)]
    return [QueuedGroup.of(group) for group in groups]


def _wire_bytes(group: ScoredGroup) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps({name: getattr(group, name) for name in WIRE_FIELDS})
        except orjson.JSONEncodeError:  # say, an int beyond 64 bits in `images`
            pass
    return group.wire_json()


# --- the child ----------------------------------------------------------------------------


def _answer(body: bytes, many: bool, vocab_size: int | None) -> tuple[int, list[bytes]]:
    try:
        groups = parse_groups(body, many=many, vocab_size=vocab_size)
    except ValidationError as exc:
        return INVALID, [exc.json(include_url=False, include_input=False).encode()]
    except Exception as exc:  # reported to the server as a 500, the child lives on
        return FAILED, [f"{type(exc).__name__}: {exc}".encode()]
    meta = json.dumps([[g.size, g.env_id, len(g.body)] for g in groups]).encode()
    return OK, [_META.pack(len(meta)), meta, *(g.body for g in groups)]


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def main() -> None:
    """Serve requests on stdin until it closes (the server stopped, or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server to handle
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = _read_exactly(stdin, _REQUEST.size)
        if header is None:
            return
        length, many, vocab_size = _REQUEST.unpack(header)
        body = _read_exactly(stdin, length)
        if body is None:
            return
        status, parts = _answer(body, bool(many), vocab_size if vocab_size >= 0 else None)
        del body
        stdout.write(_REPLY.pack(status, sum(len(p) for p in parts)))
        for part in parts:
            stdout.write(part)
        stdout.flush()
        del parts


# --- the server's side ----------------------------------------------------------------------


class GroupParser:
    """Parses scored-group bodies: small ones inline, larger than `inline_bytes` in the child
    process. One per server; `aclose` stops the child."""

    def __init__(self, inline_bytes: int) -> None:
        self.inline_bytes = inline_bytes
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The child's pid, once started."""
        return self._process.pid if self._process is not None else None

    async def parse(self, body: bytes, *, many: bool, vocab_size: int | None) -> list[QueuedGroup]:
        """The groups in `body`; raises `InvalidGroups` (a 422) or `Rejected`."""
        if len(body) <= self.inline_bytes:
            return parse_groups(body, many=many, vocab_size=vocab_size)
        async with self._lock:
            return await self._in_child(body, many, vocab_size)

    async def _in_child(self, body: bytes, many: bool, vocab_size: int | None) -> list[QueuedGroup]:
        process = await self._handed(body, many, vocab_size)
        assert process.stdout is not None
        try:
            status, length = _REPLY.unpack(await process.stdout.readexactly(_REPLY.size))
            payload = await process.stdout.readexactly(length)
        except (OSError, asyncio.IncompleteReadError) as exc:
            self._discard()  # started afresh for the next body
            raise Rejected(503, f"the group parser process died ({exc!r}): out of memory?") from exc
        except asyncio.CancelledError:
            self._discard()  # its reply would be read as the next body's
            raise
        if status == INVALID:
            raise InvalidGroups(payload.decode())
        if status != OK:
            raise Rejected(500, f"parsing the groups failed: {payload.decode()}")
        (meta_length,) = _META.unpack_from(payload)
        offset = _META.size + meta_length
        groups: list[QueuedGroup] = []
        for size, env_id, n in json.loads(payload[_META.size : offset]):
            groups.append(QueuedGroup(size, env_id, payload[offset : offset + n]))
            offset += n
        return groups

    async def _handed(
        self, body: bytes, many: bool, vocab_size: int | None
    ) -> asyncio.subprocess.Process:
        """The child, with the request written to it. A child that died before it took the
        request (killed while idle, and not yet reaped) costs nothing: it is replaced once and
        the request goes to the new one. Death after taking it is a 503 (`_in_child`)."""
        header = _REQUEST.pack(len(body), many, -1 if vocab_size is None else vocab_size)
        for attempt in range(2):
            process = await self._started()
            assert process.stdin is not None
            try:
                process.stdin.write(header)
                process.stdin.write(body)
                await process.stdin.drain()
                return process
            except OSError as exc:  # the pipe broke: nobody reads it any more
                self._discard()
                if attempt == 1:
                    raise Rejected(503, f"the group parser process died ({exc!r})") from exc
            except asyncio.CancelledError:
                self._discard()  # a partly written request would garble the next one
                raise
        raise AssertionError("unreachable")

    async def _started(self) -> asyncio.subprocess.Process:
        if self._process is None or self._process.returncode is not None:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "clotho.trainers.parse_worker",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 20,
            )
        return self._process

    def _discard(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            process.kill()

    async def aclose(self) -> None:
        """Stop the child: its stdin closes, it exits; killed if it does not within 5 s."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            process.kill()
            await process.wait()


if __name__ == "__main__":
    main()
