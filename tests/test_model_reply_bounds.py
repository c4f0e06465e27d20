"""Model replies are bounded in bytes and in time, against real hostile HTTP servers.

Every server here is real: an asyncio HTTP/1.1 server on 127.0.0.1 that writes its reply by
hand (an endless body, a gzip bomb, a reply dripping one byte at a time), and stops by
itself (a byte bound) or when the client hangs up, which it notices by reading EOF. The
clients are the real ones (`ChatClient`, the vLLM and SGLang token clients, the `endless`
environment's generator). Assertions are on bytes and on what happened in which order: the
server saw the hang-up, the client raised the typed error, no second attempt was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import tracemalloc
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, fast_config
from tests.support import wait_until

from clotho.chat.client import ChatClient, ModelConfig
from clotho.chat.http import ReplyTooLarge, RequestDeadline
from clotho.chat.token_http import token_client_for
from clotho.chat.tokens import TokenSampling
from clotho.errors import ErrorInfo, ModelError

CAP = 1 << 20  # max_reply_bytes in these tests
CHUNK = 64 << 10
SERVER_BOUND = 256 << 20  # an endless body still ends here: a client without a cap reads it all
DRIP_BOUND = 100_000  # drips before a dripping server gives up on its own
DRIP_PACE_S = 0.02  # between drips; far below every read timeout here

Respond = Callable[["RawServer", asyncio.StreamWriter, asyncio.Event], Awaitable[None]]


class RawServer:
    """HTTP/1.1 on 127.0.0.1 that reads each request and lets `respond` write the reply.

    Counts connections, body bytes written, and connections the client hung up on (EOF read
    while the reply was still being written)."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.connections = 0
        self.sent = 0
        self.hung_up = 0
        self.finished = 0  # replies written to their end (or their bound)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        hung_up = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)

            async def watch() -> None:
                """EOF (FIN) or a reset (RST, unread data): the client closed the connection."""
                with contextlib.suppress(ConnectionError):
                    await reader.read()
                hung_up.set()

            watcher = asyncio.create_task(watch())
            await self.respond(self, writer, hung_up)
            if not hung_up.is_set():  # it wrote its whole reply (or up to its bound)
                self.finished += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if watcher is not None:
                with contextlib.suppress(ConnectionError, TimeoutError):
                    await asyncio.wait_for(hung_up.wait(), 30)  # generous: a stuck test only
                if hung_up.is_set():
                    self.hung_up += 1
                watcher.cancel()
            writer.close()
            self._handlers.discard(task)


def head(status: int = 200, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Content-Type: application/json"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def framed(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def endless_json(
    server: RawServer, writer: asyncio.StreamWriter, hung_up: asyncio.Event
) -> None:
    """200 and a JSON string that never closes, 64 KiB a chunk, until the client hangs up."""
    writer.write(head(Transfer_Encoding="chunked"))
    writer.write(framed(b'{"choices": [{"message": {"content": "'))
    await repeat_until_hung_up(server, writer, hung_up, b"x")


async def repeat_until_hung_up(
    server: RawServer, writer: asyncio.StreamWriter, hung_up: asyncio.Event, byte: bytes
) -> None:
    """`byte` CHUNK times a chunk, until the client hangs up (or the server's bound)."""
    chunk = framed(byte * CHUNK)
    while not hung_up.is_set() and server.sent < SERVER_BOUND:
        writer.write(chunk)
        server.sent += CHUNK
        await writer.drain()


async def endless_error(
    server: RawServer, writer: asyncio.StreamWriter, hung_up: asyncio.Event
) -> None:
    writer.write(head(400, Transfer_Encoding="chunked"))
    await repeat_until_hung_up(server, writer, hung_up, b"e")


async def gzip_bomb(
    server: RawServer, writer: asyncio.StreamWriter, hung_up: asyncio.Event
) -> None:
    """A gzip stream of zeros: ~1 KB on the wire per MiB decoded, until the client hangs up."""
    writer.write(head(Transfer_Encoding="chunked", Content_Encoding="gzip"))
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    zeros = b"0" * (1 << 20)
    while not hung_up.is_set() and server.sent < SERVER_BOUND:
        data = packer.compress(zeros) + packer.flush(zlib.Z_SYNC_FLUSH)
        writer.write(framed(data))
        server.sent += len(zeros)
        await writer.drain()


async def announces_10_gib(
    server: RawServer, writer: asyncio.StreamWriter, _: asyncio.Event
) -> None:
    writer.write(head(Content_Length=str(10 << 30)))
    writer.write(b"{")
    await writer.drain()


async def drip(server: RawServer, writer: asyncio.StreamWriter, hung_up: asyncio.Event) -> None:
    """200, then one byte of JSON whitespace at a time, until the client hangs up."""
    writer.write(head(Transfer_Encoding="chunked"))
    writer.write(framed(b"{"))
    while not hung_up.is_set() and server.sent < DRIP_BOUND:
        writer.write(framed(b" "))
        server.sent += 1
        await writer.drain()
        with contextlib.suppress(TimeoutError):  # the pace, cut short by the hang-up
            await asyncio.wait_for(hung_up.wait(), DRIP_PACE_S)


def chat_reply(content: str) -> bytes:
    return json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": content}}], "usage": {}}
    ).encode()


def encoded_reply(encoding: str) -> Respond:
    body = chat_reply("small " * 1000)
    packed = {
        "identity": body,
        "gzip": gzip.compress(body),
        "deflate": zlib.compress(body),
        "raw-deflate": zlib.compress(body, wbits=-zlib.MAX_WBITS),
        # two gzip members, as a server that flushes members would send
        "gzip-members": gzip.compress(body[:100]) + gzip.compress(body[100:]),
    }[encoding]
    header = {"identity": "identity", "raw-deflate": "deflate", "gzip-members": "gzip"}
    sent_as = header.get(encoding, encoding)

    async def respond(server: RawServer, writer: asyncio.StreamWriter, _: asyncio.Event) -> None:
        writer.write(head(Content_Length=str(len(packed)), Content_Encoding=sent_as))
        writer.write(packed)
        await writer.drain()

    return respond


# -- clients --------------------------------------------------------------------------------


def config(server: RawServer, **overrides: Any) -> ModelConfig:
    settings: dict[str, Any] = {"max_reply_bytes": CAP, "max_retries": 3, "timeout_s": 30.0}
    settings.update(overrides)
    return fast_config(server.base_url, **settings)


async def ask(kind: str, model: ModelConfig) -> None:
    """One request through the named real client."""
    if kind == "chat":
        chat = ChatClient(model)
        try:
            await chat.complete([{"role": "user", "content": "hi"}])
        finally:
            await chat.aclose()
        return
    tokens = token_client_for(kind, model)  # type: ignore[arg-type]
    try:
        await tokens.generate([1, 2, 3], TokenSampling(max_tokens=8))
    finally:
        await tokens.aclose()


CLIENTS = ["chat", "vllm", "sglang"]


@pytest.mark.parametrize("kind", CLIENTS)
async def test_an_endless_body_stops_at_the_cap_with_bounded_memory(kind: str) -> None:
    async with RawServer(endless_json) as server:
        tracemalloc.start()
        try:
            with pytest.raises(ReplyTooLarge) as info:
                await ask(kind, config(server))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert await wait_until(lambda: server.hung_up == 1), "the client closed the connection"
    error = info.value
    assert isinstance(error, ModelError) and ErrorInfo.of(error).kind == "infra"
    assert f"max_reply_bytes={CAP}" in str(error)
    # Reading stopped at the cap: at most one network chunk past it.
    assert CAP < error.received <= CAP + CHUNK, error.received
    assert server.finished == 0 and server.sent < SERVER_BOUND  # it stopped on the hang-up
    assert server.connections == 1, "a reply too large is not asked for again"
    # The client held about the cap (the body, then one join), never the stream.
    assert peak < 8 * CAP, peak


async def test_a_gzip_bomb_is_bounded_by_its_decoded_size() -> None:
    async with RawServer(gzip_bomb) as server:
        tracemalloc.start()
        try:
            with pytest.raises(ReplyTooLarge) as info:
                await ask("chat", config(server))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert await wait_until(lambda: server.hung_up == 1)
    error = info.value
    # A few KB on the wire already decode past the cap: the decoded count stops it.
    assert error.received < CAP // 16 and error.decoded == CAP + 1, (error.received, error.decoded)
    assert peak < 8 * CAP, peak
    assert server.connections == 1


async def test_an_announced_length_over_the_cap_is_refused_unread() -> None:
    async with RawServer(announces_10_gib) as server:
        with pytest.raises(ReplyTooLarge, match="announces 10737418240 bytes") as info:
            await ask("chat", config(server))
    assert info.value.received == 0
    assert server.connections == 1


async def test_an_endless_error_body_is_read_only_for_its_message() -> None:
    async with RawServer(endless_error) as server:
        with pytest.raises(ModelError, match="HTTP 400: eeee") as info:
            await ask("chat", config(server))
        assert await wait_until(lambda: server.hung_up == 1)
    assert not isinstance(info.value, ReplyTooLarge)
    assert len(str(info.value)) < 1000
    assert server.sent < SERVER_BOUND and server.connections == 1


@pytest.mark.parametrize("encoding", ["identity", "gzip", "deflate", "raw-deflate", "gzip-members"])
async def test_replies_under_the_cap_are_read_whatever_their_encoding(encoding: str) -> None:
    async with RawServer(encoded_reply(encoding)) as server:
        client = ChatClient(config(server))
        try:
            turn = await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()
    assert turn.content == "small " * 1000


async def test_a_reply_exactly_at_the_cap_is_read() -> None:
    """The cap is inclusive: a body of exactly max_reply_bytes is accepted, one more is not."""
    body = chat_reply("")
    content = "y" * (CAP - len(body))
    exact = chat_reply(content)
    assert len(exact) == CAP

    def sender(data: bytes) -> Respond:
        async def respond(
            server: RawServer, writer: asyncio.StreamWriter, _: asyncio.Event
        ) -> None:
            writer.write(head(Transfer_Encoding="chunked", Content_Encoding="gzip"))
            writer.write(framed(gzip.compress(data)) + framed(b""))
            await writer.drain()

        return respond

    async with RawServer(sender(exact)) as server:
        client = ChatClient(config(server))
        try:
            turn = await client.complete([{"role": "user", "content": "hi"}])
        finally:
            await client.aclose()
    assert turn.content == content
    async with RawServer(sender(chat_reply(content + "y"))) as server:
        with pytest.raises(ReplyTooLarge):
            await ask("chat", config(server))


@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_dripping_reply_ends_at_the_request_deadline(kind: str) -> None:
    # Each read gets a byte long before timeout_s: only the deadline on the whole can end it.
    async with RawServer(drip) as server:
        with pytest.raises(RequestDeadline) as info:
            await ask(kind, config(server, timeout_s=60.0, request_timeout_s=0.5))
        assert await wait_until(lambda: server.hung_up == 1), "the stream was closed"
    error = info.value
    assert isinstance(error, ModelError) and ErrorInfo.of(error).kind == "infra"
    assert "request_timeout_s=0.5" in str(error)
    assert server.sent >= 1, "bytes were arriving: no read ever timed out"
    assert server.finished == 0 and server.sent < DRIP_BOUND, "it dripped until the hang-up"
    assert server.connections == 1, "a request past its deadline is not sent again"


def test_request_deadline_defaults_cover_a_longer_read_timeout() -> None:
    """A config that raised timeout_s past the default deadline keeps requests that long."""
    assert ModelConfig(timeout_s=3600).request_timeout_s == 3600
    assert ModelConfig().request_timeout_s == 1800
    assert ModelConfig(timeout_s=3600, request_timeout_s=10).request_timeout_s == 10
    assert ModelConfig().max_reply_bytes == 64 << 20


@requires_bwrap
async def test_the_endless_generator_is_bounded_too() -> None:
    """The `endless` environment's task generator: an endless reply is a model_error
    candidate (not a hang, not an out-of-memory), and the generation gives up as a
    ModelError after its attempts."""
    from clotho.envs.endless import EndlessConfig, EndlessEnv

    async with RawServer(endless_json) as generator:
        with ScriptedOpenAIServer() as agent:
            agent_config = fast_config(agent.base_url)
            env = EndlessEnv(
                EndlessConfig(
                    model=agent_config,
                    generator_model=config(generator, max_retries=0),
                    max_generation_attempts=2,
                    generate_ahead=0,
                ),
                model=ChatClient(agent_config),
            )
            try:
                await env.setup()
                with pytest.raises(ModelError, match=r"2 model_error.*max_reply_bytes"):
                    await env.get_next_item()
            finally:
                await env.close()
        assert await wait_until(lambda: generator.hung_up == 2)
    assert env.stats.discarded == {"model_error": 2}
    assert generator.connections == 2 and generator.finished == 0
