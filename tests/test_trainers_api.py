"""`clotho api` and `AtroposClient` over real HTTP on 127.0.0.1, with a scripted trainer."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from tests.support import PATIENCE_S, wait_until
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
from clotho.trainers.state import ApiSettings, ApiState


class Clock:
    """The server's clock, moved by the test: what the server does after N seconds is tested
    by telling it N seconds have passed, not by waiting (a busy machine stretches a wait)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Rig:
    """Starts servers, trainers and clients, and closes all of them at the end."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self.stack = stack

    async def server(
        self, port: int = 0, clock: Callable[[], float] | None = None, **settings: Any
    ) -> ApiServer:
        server = ApiServer(ApiSettings(**settings), port=port)
        if clock is not None:
            server.state = ApiState(server.state.settings, clock=clock)
        return await self.stack.enter_async_context(server)

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
        """A client with quick retries; with `http`, requests go through that httpx client."""
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


def recording(path: str) -> tuple[httpx.AsyncClient, list[int | None]]:
    """An httpx client that notes each attempt at `path`: the status answered, or None for
    an attempt still in flight or that never got an answer (connection refused)."""
    attempts: list[int | None] = []

    async def sent(request: httpx.Request) -> None:
        if request.url.path == path:
            attempts.append(None)

    async def answered(response: httpx.Response) -> None:
        if response.request.url.path == path:
            attempts[-1] = response.status_code

    return httpx.AsyncClient(event_hooks={"request": [sent], "response": [answered]}), attempts


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
    http, attempts = recording("/register-env")
    client = rig.client(server.url, http=http)
    registering = asyncio.create_task(client.register_env(env("waiter")))
    # "wait for trainer to start", answered twice and retried: still registering.
    assert await wait_until(lambda: attempts[:2] == [200, 200])
    assert not registering.done() and server.state.envs == []
    await rig.trainer(server, batch_size=4)
    reply = await asyncio.wait_for(registering, PATIENCE_S)
    assert (reply.status, reply.env_id, reply.wandb_name) == ("success", 0, "waiter_0")
    assert len(attempts) >= 3  # the one after the trainer started succeeded


async def test_register_env_waits_for_the_server_to_come_up(rig: Rig) -> None:
    port = free_port()
    http, attempts = recording("/register-env")
    client = rig.client(f"http://127.0.0.1:{port}", http=http)
    registering = asyncio.create_task(client.register_env(env()))
    # Refused twice (no answer) and tried a third time: still registering.
    assert await wait_until(lambda: len(attempts) >= 3)
    assert attempts[:2] == [None, None] and not registering.done()
    await rig.server(port=port, batch_size=4)  # preset: no trainer needed to register
    reply = await asyncio.wait_for(registering, PATIENCE_S)
    assert reply.env_id == 0 and attempts[-1] == 200


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
    http, polls = recording("/status-env")
    client = rig.client(server.url, http=http, max_batches_offpolicy=1)
    await client.register_env(env())
    assert not client.queue_full(await client.wait_for_room())  # empty queue: at once
    assert len(polls) == 1
    await client.send_group(make_group(4))  # one batch queued = the limit
    waiting = asyncio.create_task(client.wait_for_room())
    # It looked twice, found the queue full both times, and is still waiting.
    assert await wait_until(lambda: polls[1:3] == [200, 200])
    assert not waiting.done()
    check_batch(await trainer.pull(), 4)
    status = await asyncio.wait_for(waiting, PATIENCE_S)
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
    clock = Clock()  # the minimum's own wait is far longer: only the timeout can release it
    server = await rig.server(clock=clock, env_timeout_s=120, min_allocation_wait_s=3600)
    trainer = await rig.trainer(server, batch_size=8)
    silent = rig.client(server.url)  # no heartbeat: it goes quiet like a crashed process
    await silent.register_env(env("slow", min_batch_allocation=0.5))
    busy = rig.client(server.url)
    await busy.register_env(env("fast"))
    await busy.send_groups([make_group(4, marker=1), make_group(4, marker=2)])
    assert await trainer.batch() is None  # the live minimum holds the batch back
    clock.advance(120)
    assert await trainer.batch() is None  # silent for the whole timeout: still live
    clock.advance(1)
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
    clock = Clock()
    server = await rig.server(clock=clock, env_timeout_s=120, min_allocation_wait_s=3600)
    trainer = await rig.trainer(server, batch_size=8)
    await slow_and_busy(rig, server, minimum=0.5)
    slow = server.state.envs[0]
    for _ in range(3):  # 300 s: well past the timeout, with no rollouts from the slow env
        clock.advance(100)
        assert await wait_until(lambda: slow.last_seen == clock.now)  # a heartbeat came
    assert await trainer.batch() is None  # still live, so its minimum still counts
    assert not slow.expired_logged


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


def peak_memory_since_reset() -> Callable[[], int]:
    """Resets this process's peak resident memory (Linux: clear_refs 5); the function returned
    says by how many bytes the peak has since risen above what was resident at the reset."""

    def kb(field: str) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith(field))

    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    resident = kb("VmRSS:")
    return lambda: (kb("VmHWM:") - resident) * 1024


async def test_gzip_bomb_is_refused_before_it_is_inflated(rig: Rig) -> None:
    """2 GiB of zeros in 2 MB of gzip members: inflating it whole would take 2 GiB here (the
    server runs in this process). The server stops at the limit, then serves on."""
    server = await rig.server(max_request_bytes=4 << 20)
    trainer = await rig.trainer(server, batch_size=4)
    member = gzip.compress(bytes(1 << 20))  # 1 MiB of zeros, about 1 KB packed
    bomb = member * 2048
    assert len(bomb) < 4 << 20  # under the limit as sent: only inflating it finds it too large
    async with httpx.AsyncClient(base_url=server.url, timeout=PATIENCE_S) as http:
        grown = peak_memory_since_reset()
        response = await http.post(
            "/scored_data", content=bomb, headers={"Content-Encoding": "gzip"}
        )
        assert response.status_code == 413 and f"{4 << 20} bytes" in response.text
        assert grown() < 256 << 20, f"the peak grew by {grown() >> 20} MiB"
        del bomb
        # Nothing was queued, and the server goes on serving, gzip included.
        assert (await http.get("/status")).json() == {"current_step": 0, "queue_size": 0}
        group = make_group(4, marker=5)
        response = await http.post(
            "/scored_data",
            content=gzip.compress(group.wire_json()),
            headers={"Content-Encoding": "gzip"},
        )
        assert response.json() == {"status": "received"}
    batch = await trainer.pull()
    check_batch(batch, 4)
    assert batch[0]["tokens"] == group.tokens


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

        page = await http.get("/reset_data", headers={"Sec-Fetch-Site": "cross-site"})
        assert page.status_code == 403  # a web page's image tag: refused, nothing reset
        assert (await http.get("/latest_example")).json()["tokens"][0][0] == 42
        assert (await http.get("/reset_data")).text == "Reset successful"  # Atropos' tools
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
