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
1 = pydantic's errors as JSON (a 422); 2 = an unexpected error's text; 3 = `!H` HTTP status
then the refusal's text (a body over the group budget, or one that needs more memory to
parse than the child may take).

Bounded whatever the body's shape. Parsed Python objects take far more room than their JSON
(a 44-byte group became about 9 KB of lists and models: 65 MB of tiny groups took 12.5 GB),
so: (1) each JSON object in a body (a group, a message) counts `OBJECT_OVERHEAD_BYTES`
against the body limit (`max_request_bytes`), counted on the bytes (`{` outside strings)
before the JSON is read, so a body holds at most `max_request_bytes / OBJECT_OVERHEAD_BYTES`
groups; (2) groups are
validated one at a time, each model dropped once its wire JSON is made; (3) the kernel caps
the child's data memory (RLIMIT_DATA) so its resident size stays under
`parse_memory_limit(max_request_bytes)` = `PARSE_MEMORY_BASE` + `PARSE_MEMORY_MULTIPLE` x the
body limit: a body that would need more (say, megabytes of nested empty lists) is a 413, or
at worst a 503 when the child dies, and the next body gets a fresh child.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

import pydantic_core
from pydantic import TypeAdapter, ValidationError

from clotho.env.scored import WIRE_EXCLUDE, ScoredGroup
from clotho.trainers.state import QueuedGroup, Rejected

try:
    import orjson
except ImportError:  # optional: pydantic reads and writes JSON too, a little slower
    orjson = None  # type: ignore[assignment]

_REQUEST = struct.Struct("!QBqQ")
_REPLY = struct.Struct("!BQ")
_META = struct.Struct("!I")
_STATUS = struct.Struct("!H")
OK, INVALID, FAILED, REFUSED = 0, 1, 2, 3

OBJECT_OVERHEAD_BYTES = 1024
"""What each JSON object of a body (a group, a message) counts against the body limit, over
its own bytes: as Python objects a 44-byte group took about 9 KB."""

_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')

PARSE_MEMORY_BASE = 128 << 20
PARSE_MEMORY_MULTIPLE = 16
_FILE_BACKED_ROOM = 64 << 20  # the interpreter's and libraries' mapped files, the stack


def parse_memory_limit(max_body_bytes: int) -> int:
    """The parse child's resident memory stays under this, whatever the body holds."""
    return PARSE_MEMORY_BASE + PARSE_MEMORY_MULTIPLE * max_body_bytes


_GROUPS = TypeAdapter(list[ScoredGroup])
WIRE_FIELDS = tuple(name for name in ScoredGroup.model_fields if name not in WIRE_EXCLUDE)


class InvalidGroups(Exception):
    """The body is not valid scored data; `errors_json` is pydantic's list of errors."""

    def __init__(self, errors_json: str) -> None:
        super().__init__(errors_json)
        self.errors_json = errors_json


def parse_groups(
    body: bytes, *, many: bool, vocab_size: int | None, budget: int | None = None
) -> list[QueuedGroup]:
    """Validate one group (or a JSON list of them) and keep each as its wire JSON.

    `budget` (the body limit): a body whose bytes plus `OBJECT_OVERHEAD_BYTES` per JSON
    object exceed it is refused (413) before it is read. Groups are validated one at a
    time, each raw item and model dropped once its wire JSON is made. JSON is read by orjson
    (the `api` extra) where it can, else by pydantic-core (NaN, ints beyond 64 bits), so the
    errors are pydantic's either way.
    """
    context = {"vocab_size": vocab_size}
    check_object_budget(body, budget)
    data = _loaded(body)
    if data is _NOT_JSON:  # pydantic says precisely what is wrong, before building anything
        if many:
            return [QueuedGroup.of(g) for g in _GROUPS.validate_json(body, context=context)]
        return [QueuedGroup.of(ScoredGroup.model_validate_json(body, context=context))]
    if not many:
        return [_queued(ScoredGroup.model_validate(data, context=context))]
    if not isinstance(data, list):
        _GROUPS.validate_python(data, context=context)  # raises: "a valid list"
        raise AssertionError("unreachable")
    queued: list[QueuedGroup] = []
    for i in range(len(data)):
        item, data[i] = data[i], None
        try:
            group = ScoredGroup.model_validate(item, context=context)
        except ValidationError as exc:
            raise InvalidGroups(_errors_at(i, exc)) from None
        del item
        queued.append(_queued(group))
    return queued


def check_object_budget(body: bytes, budget: int | None) -> None:
    """413 for a body whose JSON objects, at `OBJECT_OVERHEAD_BYTES` each, take it over the
    body limit. Counted on the bytes (C speed, one copy at most): every `{`, then, only if
    that is too many, every `{` outside strings."""
    if budget is None:
        return
    room = (budget - len(body)) // OBJECT_OVERHEAD_BYTES
    if body.count(b"{") <= room:
        return
    objects = _JSON_STRING.sub(b'""', body).count(b"{")
    if objects > room:
        raise Rejected(
            413,
            f"{objects} JSON objects (groups, messages) in {len(body)} bytes: each counts "
            f"{OBJECT_OVERHEAD_BYTES} bytes against the body limit of {budget} bytes "
            "(clotho api --max-request-mb); send fewer groups per request",
        )


_NOT_JSON = object()


def _loaded(body: bytes) -> Any:
    if orjson is not None:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    try:
        return pydantic_core.from_json(body, allow_inf_nan=True)
    except ValueError:
        return _NOT_JSON


def _errors_at(index: int, exc: ValidationError) -> str:
    """pydantic's errors for list item `index`, located as a whole-list validation does."""
    errors = json.loads(exc.json(include_url=False, include_input=False))
    for error in errors:
        error["loc"] = [index, *error.get("loc", [])]
    return json.dumps(errors)


def _queued(group: ScoredGroup) -> QueuedGroup:
    return QueuedGroup(group.size, group.env_id, _wire_bytes(group))


def _wire_bytes(group: ScoredGroup) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps({name: getattr(group, name) for name in WIRE_FIELDS})
        except orjson.JSONEncodeError:  # say, an int beyond 64 bits in `images`
            pass
    return group.wire_json()


# --- the child ----------------------------------------------------------------------------


def _answer(
    body: bytes, many: bool, vocab_size: int | None, budget: int | None
) -> tuple[int, list[bytes]]:
    try:
        groups = parse_groups(body, many=many, vocab_size=vocab_size, budget=budget)
    except ValidationError as exc:
        return INVALID, [exc.json(include_url=False, include_input=False).encode()]
    except InvalidGroups as exc:
        return INVALID, [exc.errors_json.encode()]
    except Rejected as exc:
        return REFUSED, [_STATUS.pack(exc.status_code), exc.message.encode()]
    except (MemoryError, SystemError) as exc:  # the kernel's cap (RLIMIT_DATA); lives on
        if not _out_of_memory(exc):
            return FAILED, [f"{type(exc).__name__}: {exc}".encode()]
        limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
        message = (
            f"parsing this body needs more than the {limit} bytes the group parser may use: "
            "send fewer or smaller groups per request"
        )
        return REFUSED, [_STATUS.pack(413), message.encode()]
    except Exception as exc:  # reported to the server as a 500, the child lives on
        return FAILED, [f"{type(exc).__name__}: {exc}".encode()]
    meta = json.dumps([[g.size, g.env_id, len(g.body)] for g in groups]).encode()
    return OK, [_META.pack(len(meta)), meta, *(g.body for g in groups)]


def _out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or an extension's SystemError raised while one was pending (orjson)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, MemoryError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def main() -> None:
    """Serve requests on stdin until it closes (the server stopped, or died)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the server to handle
    parser = argparse.ArgumentParser()
    parser.add_argument("--memory-bytes", type=int, default=0)
    args = parser.parse_args()
    if args.memory_bytes > 0:  # anonymous memory, brk and mmap alike (Linux >= 4.7)
        cap = max(args.memory_bytes - _FILE_BACKED_ROOM, PARSE_MEMORY_BASE // 2)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = _read_exactly(stdin, _REQUEST.size)
        if header is None:
            return
        length, many, vocab_size, budget = _REQUEST.unpack(header)
        body = _read_exactly(stdin, length)
        if body is None:
            return
        status, parts = _answer(
            body, bool(many), vocab_size if vocab_size >= 0 else None, budget or None
        )
        del body
        stdout.write(_REPLY.pack(status, sum(len(p) for p in parts)))
        for part in parts:
            stdout.write(part)
        stdout.flush()
        del parts


# --- the server's side ----------------------------------------------------------------------


class GroupParser:
    """Parses scored-group bodies: small ones inline, larger than `inline_bytes` in the child
    process. One per server; `aclose` stops the child. With `max_body_bytes` (the server's
    body limit) JSON objects count against it (`OBJECT_OVERHEAD_BYTES` each), the child's memory
    is capped at `parse_memory_limit(max_body_bytes)`."""

    def __init__(self, inline_bytes: int, max_body_bytes: int | None = None) -> None:
        self.inline_bytes = inline_bytes
        self.max_body_bytes = max_body_bytes
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The child's pid, once started."""
        return self._process.pid if self._process is not None else None

    async def parse(self, body: bytes, *, many: bool, vocab_size: int | None) -> list[QueuedGroup]:
        """The groups in `body`; raises `InvalidGroups` (a 422) or `Rejected`."""
        if len(body) <= self.inline_bytes:
            return parse_groups(body, many=many, vocab_size=vocab_size, budget=self.max_body_bytes)
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
        if status == REFUSED:
            (code,) = _STATUS.unpack_from(payload)
            raise Rejected(code, payload[_STATUS.size :].decode())
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
        header = _REQUEST.pack(
            len(body), many, -1 if vocab_size is None else vocab_size, self.max_body_bytes or 0
        )
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
                *self._limit_args(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=1 << 20,
            )
        return self._process

    def _limit_args(self) -> list[str]:
        if self.max_body_bytes is None:
            return []
        return ["--memory-bytes", str(parse_memory_limit(self.max_body_bytes))]

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
