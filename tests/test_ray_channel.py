"""The command channel between the driver and a node's sandbox host (no Ray needed): only a
client with the token is served, only sandbox calls travel on it, replies match requests
when many are in flight, and a cancelled caller cancels the call on the host."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from clotho.sandbox.ray.channel import ChannelClient, ChannelLost, ChannelServer


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
