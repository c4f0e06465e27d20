"""`clotho api` and `AtroposClient` over real HTTP on 127.0.0.1, with a scripted trainer."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.test_trainers_support import (
    ScriptedTrainer,
    check_batch,
    free_port,
    make_group,
)

from clotho.errors import TrainerError
from clotho.trainers.client import ApiClientConfig, AtroposClient
from clotho.trainers.protocol import RegisterEnv
from clotho.trainers.server import ApiServer
from clotho.trainers.state import ApiSettings


class Rig:
    """Starts servers, trainers and clients, and closes all of them at the end."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self.stack = stack

    async def server(self, port: int = 0, **settings: Any) -> ApiServer:
        return await self.stack.enter_async_context(ApiServer(ApiSettings(**settings), port=port))

    async def trainer(
        self, server: ApiServer, batch_size: int, token: str | None = None, **kw: Any
    ) -> ScriptedTrainer:
        trainer = ScriptedTrainer(server.url, token)
        self.stack.push_async_callback(trainer.aclose)
        await trainer.register(batch_size, **kw)
        assert await trainer.batch() is None  # the first /batch starts the trainer
        return trainer

    def client(
        self, url: str, http: httpx.AsyncClient | None = None, **config: Any
    ) -> AtroposClient:
        defaults: dict[str, Any] = {
            "register_poll_s": 0.05,
            "backoff_initial_s": 0.01,
            "backoff_max_s": 0.05,
            "max_retries": 1,
            "heartbeat_s": 0,
            "backpressure_poll_s": 0.05,
        }
        client = AtroposClient(ApiClientConfig(url=url, **{**defaults, **config}), http=http)
        self.stack.push_async_callback(client.aclose)
        return client


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        yield Rig(stack)


def env(name: str = "env", group_size: int = 4, **kw: Any) -> RegisterEnv:
    return RegisterEnv(
        max_token_length=2048, desired_name=name, weight=1.0, group_size=group_size, **kw
    )


async def test_env_pushes_groups_and_trainer_pulls_aligned_batches(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=8)
    sent_encodings: list[str | None] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path.startswith("/scored_data"):
            sent_encodings.append(request.headers.get("content-encoding"))

    http = httpx.AsyncClient(event_hooks={"request": [record]})
    client = rig.client(server.url, http=http, gzip_min_bytes=4096)
    reply = await client.register_env(env())
    assert (reply.env_id, reply.wandb_name, reply.checkpoint_dir) == (0, "env_0", "/tmp/ckpt")
    assert client.trainer_info is not None and client.trainer_info.batch_size == 8

    first = await client.send_group(make_group(4, marker=1))
    assert first.status == "received"
    await client.wait_for_room()
    many = await client.send_groups([make_group(4, marker=2), make_group(4, marker=3)])
    assert (many.status, many.groups_processed) == ("received", 2)
    big = make_group(4, marker=4, completion_len=400)  # about 20 KB of JSON: sent gzipped
    await client.send(big)  # the GroupSink call environment drivers make
    assert sent_encodings == [None, None, "gzip"]

    batches = [await trainer.pull(), await trainer.pull()]
    for batch in batches:
        check_batch(batch, 8)
        assert [len(g["tokens"]) for g in batch] == [4, 4]
        assert {g["env_id"] for g in batch} == {0}
    # Oldest first, and the gzipped group arrived intact.
    assert [g["tokens"][0][0] for b in batches for g in b] == [1, 2, 3, 4]
    assert batches[1][1]["tokens"] == big.tokens
    assert batches[0][0]["generation_params"] == {"temperature": 0.8}
    assert await trainer.batch() is None
    assert await trainer.status() == {"current_step": 2, "queue_size": 0}


async def test_register_env_waits_for_the_trainer_to_start(rig: Rig) -> None:
    server = await rig.server()
    client = rig.client(server.url)
    registering = asyncio.create_task(client.register_env(env("waiter")))
    await asyncio.sleep(0.3)
    assert not registering.done()  # "wait for trainer to start", retried
    await rig.trainer(server, batch_size=4)
    reply = await asyncio.wait_for(registering, 2)
    assert (reply.status, reply.env_id, reply.wandb_name) == ("success", 0, "waiter_0")


async def test_register_env_waits_for_the_server_to_come_up(rig: Rig) -> None:
    port = free_port()
    client = rig.client(f"http://127.0.0.1:{port}")
    registering = asyncio.create_task(client.register_env(env()))
    await asyncio.sleep(0.3)
    assert not registering.done()  # connection refused, retried
    await rig.server(port=port, batch_size=4)  # preset: no trainer needed to register
    reply = await asyncio.wait_for(registering, 2)
    assert reply.env_id == 0


async def test_register_env_gives_up_with_a_trainer_error(rig: Rig) -> None:
    client = rig.client(f"http://127.0.0.1:{free_port()}", register_timeout_s=0.3)
    with pytest.raises(TrainerError, match="could not register"):
        await client.register_env(env())


async def test_sending_to_a_vanished_server_is_a_trainer_error(rig: Rig) -> None:
    port = free_port()
    server = await rig.server(port=port, batch_size=4)
    client = rig.client(server.url)
    await client.register_env(env())
    await server.stop()
    with pytest.raises(TrainerError, match="failed after 2 attempts"):
        await client.send_group(make_group(4))


async def test_backpressure_waits_while_the_queue_is_full(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=4)
    client = rig.client(server.url, max_batches_offpolicy=1)
    await client.register_env(env())
    assert not client.queue_full(await client.wait_for_room())  # empty queue: at once
    await client.send_group(make_group(4))  # one batch queued = the limit
    waiting = asyncio.create_task(client.wait_for_room())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    check_batch(await trainer.pull(), 4)
    status = await asyncio.wait_for(waiting, 2)
    assert status.queue_size == 0 and status.current_step == 1


async def test_group_larger_than_the_batch_is_refused_and_blocks_nothing(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=8)
    client = rig.client(server.url)
    await client.register_env(env())
    with pytest.raises(TrainerError, match=r"422.*16 sequences, more than the batch size 8"):
        await client.send_group(make_group(16))
    with pytest.raises(TrainerError, match="group 1 has 16"):
        await client.send_groups([make_group(4), make_group(16)])
    assert (await trainer.status())["queue_size"] == 0  # the list was refused whole
    # A group of 3 next to 4s: upstream's packer would stall on it; here it just waits.
    await client.send_groups([make_group(3, marker=1), make_group(4, marker=2)])
    await client.send_group(make_group(4, marker=3))
    batch = await trainer.pull()
    check_batch(batch, 8)
    assert [g["tokens"][0][0] for g in batch] == [2, 3]
    assert (await trainer.status())["queue_size"] == 1


async def test_dead_env_with_minimum_allocation_stops_blocking_after_timeout(rig: Rig) -> None:
    server = await rig.server(env_timeout_s=0.8)
    trainer = await rig.trainer(server, batch_size=8)
    silent = rig.client(server.url)  # no heartbeat: it goes quiet like a crashed process
    await silent.register_env(env("slow", min_batch_allocation=0.5))
    busy = rig.client(server.url)
    await busy.register_env(env("fast"))
    await busy.send_groups([make_group(4, marker=1), make_group(4, marker=2)])
    assert await trainer.batch() is None  # the live minimum holds the batch back
    await asyncio.sleep(0.9)
    batch = await trainer.batch()  # ... until the silent env is taken for gone
    assert batch is not None
    check_batch(batch, 8)
    # Heard from again, it is live again and its minimum applies again.
    await silent.status_env()
    await busy.send_groups([make_group(4), make_group(4)])
    assert await trainer.batch() is None
    await silent.send_group(make_group(4, marker=9))
    batch = await trainer.pull()
    assert 9 in [g["tokens"][0][0] for g in batch]


async def slow_and_busy(
    rig: Rig, server: ApiServer, minimum: float
) -> tuple[AtroposClient, AtroposClient]:
    """A live env with a minimum and nothing queued (heartbeating), and one with a full
    batch queued (markers 1 and 2)."""
    slow = rig.client(server.url, heartbeat_s=0.05)
    await slow.register_env(env("slow", min_batch_allocation=minimum))
    busy = rig.client(server.url)
    await busy.register_env(env("busy"))
    await busy.send_groups([make_group(4, marker=1), make_group(4, marker=2)])
    return slow, busy


async def test_heartbeat_keeps_a_slow_env_alive(rig: Rig) -> None:
    server = await rig.server(env_timeout_s=0.5)
    trainer = await rig.trainer(server, batch_size=8)
    await slow_and_busy(rig, server, minimum=0.5)
    await asyncio.sleep(0.9)  # well past the timeout, with no rollouts from the slow env
    assert await trainer.batch() is None  # still live, so its minimum still counts


async def test_disconnect_releases_the_env_share(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=8)
    leaving = rig.client(server.url)
    await leaving.register_env(env("a", min_batch_allocation=0.25))
    staying = rig.client(server.url)
    await staying.register_env(env("b"))
    status = await staying.status_env()
    assert (status.env_weight, status.unallocated_fraction) == (0.5, 0.75)
    await staying.send_groups([make_group(4), make_group(4)])
    assert await trainer.batch() is None  # env a's minimum is not covered

    await leaving.disconnect_env()
    status = await staying.status_env()
    assert (status.env_weight, status.unallocated_fraction) == (1.0, 1.0)
    check_batch(await trainer.pull(), 8)
    assert leaving.env_id is None


async def test_disconnected_env_queued_groups_are_still_served(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=8)
    async with AtroposClient(ApiClientConfig(url=server.url, heartbeat_s=0)) as leaving:
        await leaving.register_env(env("a", min_batch_allocation=0.5))
        await leaving.send_group(make_group(4, marker=5))
    # leaving `async with` disconnected it
    other = rig.client(server.url)
    await other.register_env(env("b"))
    await other.send_group(make_group(4, marker=6))
    batch = await trainer.pull()
    assert [g["tokens"][0][0] for g in batch] == [5, 6]
    assert server.state.envs[0].disconnected


async def test_step_counts_batches_served_oldest_first(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=4, starting_step=10)
    client = rig.client(server.url)
    await client.register_env(env())
    assert (await client.register_env(env())).starting_step == 10
    await client.send_groups([make_group(4, marker=m) for m in (1, 2, 3)])
    assert await trainer.status() == {"current_step": 10, "queue_size": 3}
    first = await trainer.pull()
    # Upstream would form all three batches here, jump to step 13 and serve marker 3 first.
    assert first[0]["tokens"][0][0] == 1
    assert await trainer.status() == {"current_step": 11, "queue_size": 2}
    second = await trainer.pull()
    assert second[0]["tokens"][0][0] == 2
    assert (await client.status_env()).current_step == 12


async def test_gzip_both_ways(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=4)
    group = make_group(4, completion_len=200).model_dump(mode="json")
    async with httpx.AsyncClient(base_url=server.url) as http:
        packed = gzip.compress(json.dumps(group).encode())
        response = await http.post(
            "/scored_data",
            content=packed,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert response.json() == {"status": "received"}
        response = await http.post(
            "/scored_data", content=b"not gzip", headers={"Content-Encoding": "gzip"}
        )
        assert (response.status_code, response.text) == (400, "Invalid gzip payload")

        response = await http.get("/batch", headers={"Accept-Encoding": "gzip"})
        assert response.headers.get("content-encoding") == "gzip"
        assert response.json()["batch"][0]["tokens"] == group["tokens"]  # decoded by httpx
        small = await http.get("/info", headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in small.headers
        assert small.json() == {"batch_size": 4, "max_token_len": 2048}
    assert (await trainer.status())["current_step"] == 1


async def test_gzip_bomb_is_refused(rig: Rig) -> None:
    server = await rig.server(max_request_bytes=10_000)
    await rig.trainer(server, batch_size=4)
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(
            "/scored_data",
            content=gzip.compress(b" " * 1_000_000),
            headers={"Content-Encoding": "gzip"},
        )
    assert response.status_code == 413


async def test_status_env_by_body_or_query_and_unknown_env(rig: Rig) -> None:
    server = await rig.server(batch_size=8)
    client = rig.client(server.url)
    await client.register_env(env(group_size=2))
    await client.send_groups([make_group(2), make_group(2), make_group(2)])
    async with httpx.AsyncClient(base_url=server.url) as http:
        by_body = await http.request("GET", "/status-env", json={"env_id": 0})
        by_query = await http.get("/status-env", params={"env_id": 0})
        assert by_body.json() == by_query.json()
        assert by_body.json() == {
            "current_step": 0,
            "queue_size": 3,
            "unallocated_fraction": 1.0,
            "self_queue_size": 3,
            "max_group_size": 2,
            "env_weight": 1.0,
        }
        unknown = await http.request("GET", "/status-env", json={"env_id": 7})
        assert unknown.status_code == 404
        assert "register the environment again" in unknown.json()["message"]
        bad = await http.post("/disconnect-env", json={"env_id": 7})
        assert bad.json()["status"] == "failure"


async def test_validation_and_registration_conflicts(rig: Rig) -> None:
    server = await rig.server()
    trainer = await rig.trainer(server, batch_size=4)
    group = make_group(2).model_dump(mode="json")
    async with httpx.AsyncClient(base_url=server.url) as http:
        no_role = {**group, "messages": [[{"content": "hi"}], [{"role": "user", "content": "x"}]]}
        response = await http.post("/scored_data", json=no_role)
        assert response.status_code == 422
        assert "role" in json.dumps(response.json()["detail"])
        misaligned = {**group, "masks": [group["masks"][0]]}
        response = await http.post("/scored_data", json=misaligned)
        assert response.status_code == 422 and "disagree" in response.text
        custom_role = {**group, "messages": [[{"role": "dog", "content": "woof", "x": 1}]] * 2}
        assert (await http.post("/scored_data", json=custom_role)).status_code == 200
        response = await http.post("/register-env", json=env(group_size=8).model_dump())
        assert response.status_code == 422 and "larger than the batch size" in response.text
    assert "uuid" in await trainer.register(4)  # same shape: fine (another rank)
    with pytest.raises(httpx.HTTPStatusError) as info:
        await trainer.register(8)
    assert info.value.response.status_code == 409


async def test_latest_example_and_reset_leave_a_working_server(rig: Rig) -> None:
    server = await rig.server()
    async with httpx.AsyncClient(base_url=server.url) as http:
        before = (await http.get("/latest_example")).json()
        assert before["tokens"] == [] and before["messages"] == []
        not_registered = (await http.get("/batch")).json()
        assert not_registered["batch"] == [] and "Call /register" in not_registered["message"]

        trainer = await rig.trainer(server, batch_size=4)
        client = rig.client(server.url)
        await client.register_env(env())
        await client.send_group(make_group(4, marker=42))
        latest = (await http.get("/latest_example")).json()
        assert latest["tokens"][0][0] == 42 and latest["env_id"] == 0 and len(latest) == 14

        refused = await http.get("/reset_data")  # without a token any web page could send it
        assert refused.status_code == 405 and "use POST /reset_data" in refused.text
        assert (await http.post("/reset_data")).text == "Reset successful"
        assert (await http.get("/info")).json() == {"batch_size": -1, "max_token_len": -1}
        assert (await http.get("/status")).json() == {"current_step": 0, "queue_size": 0}
        assert (await http.get("/wandb_info")).json() == {"group": None, "project": None}
        after = await http.get("/batch")  # upstream: HTTP 500 here
        assert after.status_code == 200 and after.json()["batch"] == []
        with pytest.raises(TrainerError, match="404"):
            await client.status_env()  # the env must register again
    await trainer.register(8)
    assert await trainer.batch() is None
    await client.register_env(env())
    await client.send_groups([make_group(4), make_group(4)])
    check_batch(await trainer.pull(), 8)


async def test_two_servers_in_one_process_keep_separate_state(rig: Rig) -> None:
    one, two = await rig.server(batch_size=4), await rig.server(batch_size=8)
    assert one.port != two.port
    client = rig.client(one.url)
    await client.register_env(env())
    await client.send_group(make_group(4))
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{one.url}/status")).json()["queue_size"] == 1
        assert (await http.get(f"{two.url}/status")).json()["queue_size"] == 0
        assert (await http.get(f"{two.url}/info")).json()["batch_size"] == 8
