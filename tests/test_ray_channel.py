"""The command channel between the driver and a node's sandbox host (no Ray needed): only a
client that proves it holds the secret is served, and nothing it or anyone else sends is
ever unpickled; only sandbox calls with well-formed arguments travel on it, errors keep their
type, replies match requests when many are in flight, and a cancelled caller cancels the
call on the host; and how big files are packed for Ray."""

from __future__ import annotations

import asyncio
import errno
import os
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
from tests.support import wait_until

from clotho.errors import LimitExceeded, SandboxError
from clotho.sandbox.ray.channel import (
    MAGIC,
    NONCE,
    ChannelClient,
    ChannelLost,
    ChannelRefused,
    ChannelServer,
    decode_error,
    encode_error,
)
from clotho.sandbox.ray.payload import out_of_band, pack, unpack

SECRET = b"s" * 32


class Handler:
    """A host's handler: `exec` of `wait:i` waits for gate i, `hang` until cancelled."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.gates = [asyncio.Event() for _ in range(5)]
        self.hanging = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, method: str, *args: Any) -> tuple[str, Any]:
        self.calls.append((method, *args))
        if method == "exec":
            _, cmd, options = args
            if cmd == "hang":
                self.hanging.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            if cmd.startswith("wait:"):
                await self.gates[int(cmd[5:])].wait()
            return "ok", (0, cmd, repr(sorted(options.items())), False, 0.0)
        if method == "read_file":
            return "err", FileNotFoundError(errno.ENOENT, "no such file", args[1])
        return "err", LimitExceeded("the sandbox ran out of memory")


class Evil:
    """What the issue's exploit sent: a pickle that runs a command when loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


def pickled_frame(marker: Path) -> bytes:
    data = pickle.dumps(Evil(marker))
    return struct.pack("!I", len(data)) + data


async def answered(port: int, payload: bytes) -> bytes:
    """What a server says to `payload` sent after its challenge, until it closes the
    connection (a reset, when it leaves our bytes unread, closes it too)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        hello = await asyncio.wait_for(reader.readexactly(len(MAGIC) + NONCE), 30)
        assert hello.startswith(MAGIC)
        writer.write(payload)
        try:
            return await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:
            return b""
    finally:
        writer.close()


async def test_only_a_client_holding_the_secret_is_served_and_replies_match_requests() -> None:
    handler = Handler()
    server = ChannelServer(handler)
    port = await server.start("127.0.0.1", SECRET)
    try:
        with pytest.raises(ChannelRefused):
            await ChannelClient.connect("127.0.0.1", port, b"w" * 32)
        assert handler.calls == []

        client = await ChannelClient.connect("127.0.0.1", port, SECRET)
        # five calls in flight, answered last to first: each reply reaches its own caller
        calls = [
            asyncio.ensure_future(client.call("exec", "sid", f"wait:{i}", {})) for i in range(5)
        ]
        assert await wait_until(lambda: len(handler.calls) == 5)
        for i in reversed(range(5)):
            handler.gates[i].set()
            await asyncio.wait_for(asyncio.shield(calls[i]), 30)
            assert not any(c.done() for c in calls[:i]), "answered before its gate opened"
        replies = [c.result() for c in calls]
        assert [r[1][1] for r in replies] == [f"wait:{i}" for i in range(5)]
        # the options that were sent, and only those, reach the host
        status, value = await client.call("exec", "sid", "x", {"timeout": None, "cwd": "/app"})
        assert status == "ok" and value[2] == repr([("cwd", "/app"), ("timeout", None)])

        status, error = await client.call("read_file", "sid", "/nope", 100)
        assert status == "err" and isinstance(error, FileNotFoundError)
        assert (error.errno, error.filename) == (errno.ENOENT, "/nope")
        status, error = await client.call("stop_agent", "sid")
        assert status == "err" and isinstance(error, LimitExceeded) and "memory" in str(error)
        served = len(handler.calls)
        status, refused = await client.call("close", "sid")  # not a channel call
        assert status == "err" and "not served" in str(refused)
        status, refused = await client.call("exec", "sid", "x", {"shell": "sh"})  # no such option
        assert status == "err" and "bad arguments" in str(refused)
        status, refused = await client.call("read_file", "sid", "/x")  # missing max_bytes
        assert status == "err" and isinstance(refused, ValueError)
        assert len(handler.calls) == served, "a refused call reached the handler"

        call = asyncio.ensure_future(client.call("exec", "sid", "hang", {}))
        await asyncio.wait_for(handler.hanging.wait(), 30)  # running on the host, then cancelled
        call.cancel()
        await asyncio.wait_for(handler.cancelled.wait(), 30)
        handler.gates[0].set()
        assert (await client.call("exec", "sid", "after", {}))[1][1] == "after"
        await client.aclose()
    finally:
        server.close()


async def test_nothing_from_the_network_is_unpickled_before_or_after_authentication(
    tmp_path: Path,
) -> None:
    """The issue's exploit: one pickled frame to the port ran a command. Sent first, as a
    reply to the challenge that is too short and as a frame after a valid handshake, it
    runs nothing, reaches no handler, and ends the connection."""
    handler = Handler()
    server = ChannelServer(handler, handshake_s=2.0)
    port = await server.start("127.0.0.1", SECRET)
    marker = tmp_path / "pwned"
    try:
        # 1. the frame in place of the handshake's answer (it is longer than the answer)
        frame = pickled_frame(marker)
        assert len(frame) > NONCE + 32
        assert await answered(port, frame) == b"", "no proof, no reply: only the close"
        # 2. a short frame: the server waits for the rest of the answer, then gives up
        assert await answered(port, frame[:20]) == b""

        # 3. the frame after a valid handshake: not msgpack, so the stream ends
        client = await ChannelClient.connect("127.0.0.1", port, SECRET)
        client._writer.write(pickled_frame(marker))
        with pytest.raises(ChannelLost):
            await asyncio.wait_for(client.call("exec", "sid", "x", {}), 30)
        await client.aclose()

        assert not marker.exists(), "a pickle from the network ran"
        assert handler.calls == []
        # the server still serves a client holding the secret
        client = await ChannelClient.connect("127.0.0.1", port, SECRET)
        assert (await client.call("exec", "sid", "ok", {}))[0] == "ok"
        await client.aclose()
    finally:
        server.close()
    assert not marker.exists()


async def test_the_client_refuses_a_server_that_cannot_prove_the_secret() -> None:
    answers: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(MAGIC + os.urandom(NONCE))
        answers.append(await reader.readexactly(NONCE + 32))
        writer.write(os.urandom(32))  # a proof it cannot make
        await reader.read()
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ChannelRefused, match="did not prove"):
            await ChannelClient.connect("127.0.0.1", port, SECRET)
        assert len(answers) == 1 and SECRET not in answers[0], "the secret went on the wire"
    finally:
        server.close()


def test_errors_travel_as_data_and_come_back_as_their_allowed_type() -> None:
    from clotho.sandbox.ray.backend import HostLost

    back = decode_error(encode_error(IsADirectoryError(errno.EISDIR, "is a dir", "/app")))
    assert type(back) is IsADirectoryError and back.errno == errno.EISDIR
    back = decode_error(encode_error(HostLost("gone")))  # not on the list: its nearest base
    assert type(back) is SandboxError and "HostLost: gone" in str(back)
    back = decode_error({"type": "system", "message": "x"})  # not an exception at all
    assert type(back) is SandboxError
    back = decode_error({"type": "SystemExit", "message": "0"})  # not an Exception
    assert type(back) is SandboxError
    assert type(decode_error("junk")) is SandboxError


async def test_a_server_that_goes_away_fails_the_calls_in_flight() -> None:
    handler = Handler()
    server = ChannelServer(handler)
    port = await server.start("127.0.0.1", SECRET)
    client = await ChannelClient.connect("127.0.0.1", port, SECRET)
    call = asyncio.ensure_future(client.call("exec", "sid", "hang", {}))
    await asyncio.wait_for(handler.hanging.wait(), 30)
    server.close()  # the host's tasks end with it, as when its process dies
    with pytest.raises(ChannelLost):
        await asyncio.wait_for(call, 30)
    assert client.lost
    await client.aclose()


async def test_big_files_travel_out_of_band_and_unpack_from_a_view(tmp_path: Path) -> None:
    """What keeps a 256 MiB upload off the driver's event loop (no Ray needed): the value put
    into the object store pickles with its bytes out of band (an in-band copy is made with
    the GIL held, stalling the loop even from a thread; `python -m
    clotho.bench.ray_transfer_bench` measures it), and what arrives as a view of the store
    unpacks, file or tree, without being made bytes again."""
    data = os.urandom(4 << 20)
    buffers: list[pickle.PickleBuffer] = []
    in_band = pickle.dumps(("file", out_of_band(data)), protocol=5, buffer_callback=buffers.append)
    assert len(in_band) < 1024 and len(buffers) == 1
    assert bytes(pickle.loads(in_band, buffers=buffers)[1]) == data
    assert len(pickle.dumps(("file", data), protocol=5)) > len(data), "bytes alone go in band"

    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "blob").write_bytes(data)
    (tmp_path / "tree" / "a.txt").write_text("a")
    kind, tar = await pack(tmp_path / "tree")
    await unpack((kind, memoryview(tar)), tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "blob").read_bytes() == data
    assert (tmp_path / "back" / "a.txt").read_text() == "a"
    await unpack(("file", memoryview(data)), tmp_path / "one")
    assert (tmp_path / "one").read_bytes() == data
