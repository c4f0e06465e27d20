"""The command channel between the driver and a node's sandbox host (no Ray needed): only a
client with the token is served, only sandbox calls travel on it, replies match requests
when many are in flight, and a cancelled caller cancels the call on the host; and how big
files are packed for Ray."""

from __future__ import annotations

import asyncio
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from clotho.sandbox.ray.channel import ChannelClient, ChannelLost, ChannelServer
from clotho.sandbox.ray.payload import out_of_band, pack, unpack


class Handler:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self, method: str, *args: Any) -> tuple[str, Any]:
        if method == "exec" and args[0] == "hang":
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        if method == "exec":
            await asyncio.sleep(float(args[1]))
            return "ok", args[0]
        return "err", FileNotFoundError(2, "no such file", args[0])


async def test_only_the_token_is_served_and_replies_match_requests() -> None:
    handler = Handler()
    server = ChannelServer(handler)
    port = await server.start("127.0.0.1", "right-token")
    try:
        intruder = await ChannelClient.connect("127.0.0.1", port, "wrong-token")
        with pytest.raises(ChannelLost):
            await asyncio.wait_for(intruder.call("exec", "id", 0), 10)
        await intruder.aclose()

        client = await ChannelClient.connect("127.0.0.1", port, "right-token")
        # later requests answered first must still reach their own callers
        replies = await asyncio.gather(
            *(client.call("exec", f"cmd{i}", (5 - i) / 100) for i in range(5))
        )
        assert replies == [("ok", f"cmd{i}") for i in range(5)]
        status, error = await client.call("read_file", "/nope")
        assert status == "err" and isinstance(error, FileNotFoundError) and error.errno == 2
        status, refused = await client.call("close", "sid")  # not a channel call
        assert status == "err" and "not served" in str(refused)

        call = asyncio.ensure_future(client.call("exec", "hang", 0))
        await asyncio.sleep(0.1)
        call.cancel()
        await asyncio.wait_for(handler.cancelled.wait(), 5)
        assert (await client.call("exec", "after", 0)) == ("ok", "after")
        await client.aclose()
    finally:
        server.close()


async def test_a_server_that_goes_away_fails_the_calls_in_flight() -> None:
    handler = Handler()
    server = ChannelServer(handler)
    port = await server.start("127.0.0.1", "t")
    client = await ChannelClient.connect("127.0.0.1", port, "t")
    call = asyncio.ensure_future(client.call("exec", "hang", 0))
    await asyncio.sleep(0.1)
    server.close()  # the host's tasks end with it, as when its process dies
    with pytest.raises(ChannelLost):
        await asyncio.wait_for(call, 10)
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
