"""`clotho api` against hostile or broken clients, over real HTTP on 127.0.0.1: tokens, web
pages, bad numbers, starving minimums, and bodies too large to parse on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import struct
import termios
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support import wait_until
from tests.test_trainers_api import Clock, Rig, env, slow_and_busy
from tests.test_trainers_support import check_batch, make_group

from clotho.errors import ConfigError, TrainerError
from clotho.trainers import parse_worker
from clotho.trainers.protocol import OFF_LOOP_BYTES
from clotho.trainers.server import ApiServer
from clotho.trainers.state import ApiSettings

TOKEN = "s3cret-token"


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        yield Rig(stack)


def with_userinfo(url: str, user: str, password: str | None = None) -> str:
    auth = f"{user}:{password}" if password is not None else user
    return url.replace("://", f"://{auth}@")


# --- authentication ----------------------------------------------------------------------


async def test_without_the_token_every_route_but_root_is_a_401_that_says_how(rig: Rig) -> None:
    server = await rig.server(token=TOKEN, batch_size=4)
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/")).status_code == 200  # a health check, no data
        for method, path in [("GET", "/info"), ("GET", "/batch"), ("POST", "/scored_data"),
                             ("POST", "/reset_data"), ("GET", "/reset_data")]:  # fmt: skip
            response = await http.request(method, path, json={})
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"].startswith("Bearer")
            message = response.json()["message"]
            assert "authentication required" in message
            assert "Authorization: Bearer <token>" in message
            assert "http://clotho:<token>@host:port" in message
        wrong = await http.get("/info", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong token" in wrong.json()["message"]
        right = await http.get("/info", headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.json() == {"batch_size": 4, "max_token_len": -1}
    assert server.state.queue == []


async def test_the_token_in_the_url_works_as_upstream_clients_send_it(rig: Rig) -> None:
    """requests, aiohttp and httpx turn `http://user:token@host` into HTTP Basic."""
    server = await rig.server(token=TOKEN)
    for url in (with_userinfo(server.url, "clotho", TOKEN), with_userinfo(server.url, TOKEN)):
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/info")).status_code == 200
    async with httpx.AsyncClient(base_url=with_userinfo(server.url, "clotho", "bad")) as http:
        assert (await http.get("/info")).status_code == 401


async def test_client_sends_the_token_from_config_or_url_and_never_prints_it(rig: Rig) -> None:
    server = await rig.server(token=TOKEN)
    trainer = await rig.trainer(server, batch_size=4, token=TOKEN)
    by_config = rig.client(server.url, token=TOKEN)
    assert (await by_config.register_env(env("a"))).env_id == 0
    by_url = rig.client(with_userinfo(server.url, "clotho", TOKEN))
    assert (await by_url.register_env(env("b"))).env_id == 1
    await by_url.send_group(make_group(4))
    check_batch(await trainer.pull(), 4)

    anonymous = rig.client(server.url)
    with pytest.raises(TrainerError, match=r"HTTP 401.*Authorization: Bearer") as info:
        await anonymous.register_env(env())
    wrong = rig.client(with_userinfo(server.url, "clotho", "guess"))
    with pytest.raises(TrainerError, match="wrong token") as info:
        await wrong.register_env(env())
    assert "guess" not in str(info.value)


async def test_reset_data_by_get_only_with_a_token_and_authenticated(rig: Rig) -> None:
    server = await rig.server(token=TOKEN, batch_size=4)
    client = rig.client(server.url, token=TOKEN)
    await client.register_env(env())
    await client.send_group(make_group(4))
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/reset_data")).status_code == 401
        assert len(server.state.queue) == 1
        authed = {"Authorization": f"Bearer {TOKEN}"}
        reply = await http.get("/reset_data", headers=authed)  # upstream's sft/dpo tools
        assert reply.text == "Reset successful" and server.state.queue == []


async def test_no_token_means_loopback_only(rig: Rig) -> None:
    with pytest.raises(ConfigError, match="without a token"):  # refused before binding
        await rig.stack.enter_async_context(ApiServer(ApiSettings(), host="0.0.0.0", port=0))

    open_server = await rig.server()
    async with httpx.AsyncClient(base_url=open_server.url) as http:
        assert (await http.get("/info")).status_code == 200
        assert (await http.get("/info", headers={"Host": "localhost:1234"})).status_code == 200
        # A DNS-rebinding page reaches 127.0.0.1 under its own name.
        rebound = await http.get("/info", headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403


# --- web pages ----------------------------------------------------------------------------


async def test_web_pages_are_refused_and_no_wildcard_cors(rig: Rig) -> None:
    server = await rig.server(token=TOKEN, batch_size=4)
    authed = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=authed) as http:
        from_page = await http.post(
            "/scored_data",
            content=make_group(4).wire_json(),
            headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
        )
        assert from_page.status_code == 403 and "web pages" in from_page.json()["message"]
        assert "access-control-allow-origin" not in from_page.headers
        # <img src=http://127.0.0.1:8000/reset_data>: no Origin, but the browser says where.
        img = await http.get("/reset_data", headers={"Sec-Fetch-Site": "cross-site"})
        assert img.status_code == 403
        preflight = await http.options(
            "/scored_data",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in preflight.headers
        typed = await http.get("/info", headers={"Sec-Fetch-Site": "none"})  # the user's own tab
        assert typed.status_code == 200
    assert server.state.queue == []


async def test_listed_origins_get_cors_and_still_need_the_token(rig: Rig) -> None:
    server = await rig.server(token=TOKEN, cors_origins=["https://dash.example"])
    origin = {"Origin": "https://dash.example"}
    async with httpx.AsyncClient(base_url=server.url) as http:
        preflight = await http.options(
            "/info",
            headers={
                **origin,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://dash.example"
        assert (await http.get("/info", headers=origin)).status_code == 401
        ok = await http.get("/info", headers={**origin, "Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://dash.example"
        other = await http.get(
            "/info", headers={"Origin": "https://evil.example", "Authorization": f"Bearer {TOKEN}"}
        )
        assert other.status_code == 403


# --- validation ---------------------------------------------------------------------------


def registration(batch_size: int, **extra: Any) -> dict[str, Any]:
    return {
        "wandb_group": "", "wandb_project": "", "batch_size": batch_size,
        "max_token_len": 2048, "checkpoint_dir": "", "save_checkpoint_interval": 0,
        "starting_step": 0, "num_steps": 1, **extra,
    }  # fmt: skip


async def test_sizes_weights_and_allocations_are_checked(rig: Rig) -> None:
    server = await rig.server()
    async with httpx.AsyncClient(base_url=server.url) as http:
        for size in (0, -8):
            response = await http.post("/register", json=registration(size))
            assert response.status_code == 422 and "batch_size" in response.text
        assert (await http.post("/register", json=registration(8))).status_code == 200
        await http.get("/batch")
        base = env().model_dump()
        bad_bodies = [
            ({"group_size": 0}, "group_size"),  # was a ZeroDivisionError (500) in status-env
            ({"weight": -1.0}, "weight"),
            ({"min_batch_allocation": -0.5}, "min_batch_allocation"),
            ({"min_batch_allocation": 1.5}, "min_batch_allocation"),
        ]
        for change, field in bad_bodies:
            response = await http.post("/register-env", json={**base, **change})
            assert response.status_code == 422, change
            assert field in response.text
        for field in ("weight", "min_batch_allocation"):
            for literal in ("NaN", "Infinity"):
                text = json.dumps({**base, field: 0.5}).replace("0.5", literal)
                response = await http.post("/register-env", content=text)
                assert response.status_code == 422, text
                assert "finite number" in response.text
        assert server.state.envs == []
        # Nothing refused above broke the server: a good env registers, batches still form.
        assert (await http.post("/register-env", json=base)).json()["env_id"] == 0
        status = await http.get("/status-env", params={"env_id": 0})
        assert status.status_code == 200


async def test_groups_with_nan_scores_or_ids_outside_the_vocabulary_are_422(rig: Rig) -> None:
    server = await rig.server()
    async with httpx.AsyncClient(base_url=server.url) as http:
        await http.post("/register", json=registration(4, vocab_size=300))
        group = make_group(2).wire()
        for literal in ("NaN", "Infinity", "-Infinity"):
            text = json.dumps({**group, "scores": [0.25, 1.0]}).replace("0.25", literal)
            response = await http.post("/scored_data", content=text)
            assert response.status_code == 422 and "finite number" in response.text
        beyond = {**group, "tokens": [[*group["tokens"][0][:-1], 300], group["tokens"][1]]}
        response = await http.post("/scored_data", json=beyond)
        assert response.status_code == 422
        assert "outside the vocabulary (size 300)" in response.text
        assert '"input"' not in response.text  # a 100 MB group is not echoed back
        negative = {**group, "tokens": [[-1, *group["tokens"][0][1:]], group["tokens"][1]]}
        assert (await http.post("/scored_data", json=negative)).status_code == 422
        listed = await http.post("/scored_data_list", json=[group, beyond])
        assert listed.status_code == 422
        assert server.state.queue == []
        assert (await http.post("/scored_data", json=group)).status_code == 200

    strict = await rig.server(batch_size=4, vocab_size=200)  # the server's own setting wins
    async with httpx.AsyncClient(base_url=strict.url) as http:
        response = await http.post("/scored_data", json=make_group(2).wire())
        assert response.status_code == 422 and "(size 200)" in response.text


# --- minimum allocations --------------------------------------------------------------------


async def test_a_slow_env_minimum_holds_a_batch_back_only_briefly(rig: Rig) -> None:
    """Before: a live env with a minimum and nothing queued held every batch back for as
    long as it stayed alive (a slow agentic env, or a crashed one for env_timeout_s=120 s):
    8 sequences of another env sat in the queue and the trainer got nothing.

    The server's clock is the test's: the batch is held for exactly the configured wait as
    the server measures it, however slowly this machine runs."""
    clock = Clock()
    server = await rig.server(clock=clock, min_allocation_wait_s=5)
    trainer = await rig.trainer(server, batch_size=8)
    slow, busy = await slow_and_busy(rig, server, minimum=0.5)
    assert await trainer.batch() is None  # the minimum holds it back: the wait starts
    clock.advance(4.5)
    assert await trainer.batch() is None  # ... for the whole wait
    clock.advance(0.5)
    batch = await trainer.batch()  # ... and no longer
    assert batch is not None
    assert [g["tokens"][0][0] for g in batch] == [1, 2]

    # When the slow env has a group, it goes first, ahead of older groups, with no wait:
    # the first /batch after it arrived serves it, the server's clock unmoved.
    await busy.send_groups([make_group(4, marker=3), make_group(4, marker=4)])
    await slow.send_group(make_group(4, marker=9))
    batch = await trainer.batch()
    assert batch is not None
    assert sorted(g["tokens"][0][0] for g in batch) == [3, 9]


async def test_without_a_wait_minimums_only_order_the_batch(rig: Rig) -> None:
    server = await rig.server(min_allocation_wait_s=0)
    trainer = await rig.trainer(server, batch_size=8)
    await slow_and_busy(rig, server, minimum=1.0)
    check_batch(await trainer.batch() or [], 8)


# --- large bodies -----------------------------------------------------------------------------


async def test_bodies_over_the_limit_are_413_before_or_while_reading(rig: Rig) -> None:
    server = await rig.server(batch_size=4, max_request_bytes=50_000)
    small = make_group(4).wire_json()
    large = make_group(4, completion_len=4_000).wire_json()
    assert len(small) < 50_000 < len(large)
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.post("/scored_data", content=small)).status_code == 200
        declared = await http.post("/scored_data", content=large)
        assert declared.status_code == 413 and "50000 bytes" in declared.text

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for start in range(0, len(large), 8192):
                yield large[start : start + 8192]

        streamed = await http.post("/scored_data", content=chunks())
        assert streamed.status_code == 413
    assert len(server.state.queue) == 1


async def test_a_large_body_is_parsed_in_a_child_while_others_are_served(rig: Rig) -> None:
    server = await rig.server(vocab_size=100_000)
    trainer = await rig.trainer(server, batch_size=4)
    group = make_group(4, marker=7, completion_len=40_000)  # about 2 MB of JSON
    body = group.wire_json()
    assert len(body) > OFF_LOOP_BYTES
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        # Refusals from the child are the same 422s as from the server itself.
        nan = json.dumps({**group.wire(), "scores": [0.375, 1, 0, 1]}).replace("0.375", "NaN")
        response = await http.post("/scored_data", content=nan)
        assert response.status_code == 422 and "finite number" in response.text
        child = server.parser.pid
        assert child is not None and child != os.getpid()
        beyond = make_group(4, completion_len=40_000).wire()
        beyond["tokens"][3][-1] = 100_000
        response = await http.post("/scored_data_list", json=[beyond, beyond])
        assert response.status_code == 422 and "(size 100000)" in response.text

        assert _bytes_waiting_in_stdin(child) == 0  # it read all of the bodies before
        os.kill(child, signal.SIGSTOP)  # the child is busy parsing for as long as it likes
        try:
            assert await wait_until(lambda: _state(child) == b"T")  # the stop took effect
            posting = asyncio.create_task(http.post("/scored_data", content=body))
            # The body went to the child, which cannot read it: the request waits on it.
            assert await wait_until(lambda: _bytes_waiting_in_stdin(child) > 0)
            async with httpx.AsyncClient(base_url=server.url) as other:  # served meanwhile
                for _ in range(3):
                    assert (await other.get("/status")).json()["queue_size"] == 0
            assert not posting.done()
        finally:
            os.kill(child, signal.SIGCONT)
        assert (await posting).json() == {"status": "received"}
    # Queued as its wire JSON, served back byte for byte, and gzipped off the loop.
    assert server.state.queue[0].body == body
    response = await trainer.http.get("/batch", headers={"Accept-Encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert response.json()["batch"][0]["tokens"] == group.tokens
    assert server.parser.pid == child  # one child, kept

    await server.stop()
    assert server.parser.pid is None

    def reaped() -> bool:  # not even a zombie: the pid is free
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return False

    assert await wait_until(reaped)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped, or reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2 :].split()[0] in (b"Z", b"X")


def _state(pid: int) -> bytes:
    """The process's state letter in /proc (`T`: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return stat[stat.rfind(b")") + 2 :].split()[0]


def _bytes_waiting_in_stdin(pid: int) -> int:
    """Bytes written to the process's stdin pipe that it has not read yet."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]
    finally:
        os.close(fd)


async def test_a_parser_child_that_dies_with_a_body_is_a_503_and_replaced(rig: Rig) -> None:
    server = await rig.server(batch_size=4)
    server.parser.inline_bytes = 1024  # bodies fit in the pipe: the child can be stopped
    body = make_group(4, completion_len=500).wire_json()
    assert 1024 < len(body) < 60_000
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        assert (await http.post("/scored_data", content=body)).status_code == 200
        child = server.parser.pid
        assert child is not None
        os.kill(child, signal.SIGSTOP)  # the next body waits, whole, in the child's stdin
        # ...once the stop has taken effect: a child not yet scheduled to take the signal
        # (a busy machine) would first read what arrived, and that would not wait whole.
        assert await wait_until(lambda: _state(child) == b"T")
        posting = asyncio.create_task(http.post("/scored_data", content=body))
        try:
            assert await wait_until(lambda: _bytes_waiting_in_stdin(child) > len(body))
        finally:
            os.kill(child, signal.SIGKILL)  # as the kernel's OOM killer would, mid-parse
        response = await posting
        assert response.status_code == 503 and "parser process died" in response.text
        assert (await http.post("/scored_data", content=body)).status_code == 200
        assert server.parser.pid not in (None, child)
    assert len(server.state.queue) == 2


async def test_a_parser_child_that_died_while_idle_costs_no_body(rig: Rig) -> None:
    """Killed between bodies, and not yet noticed by the server: the next body is handed to
    a new child, not refused."""
    server = await rig.server(batch_size=4)
    body = make_group(4, completion_len=40_000).wire_json()
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        for _ in range(2):
            assert (await http.post("/scored_data", content=body)).status_code == 200
            child = server.parser.pid
            assert child is not None
            os.kill(child, signal.SIGKILL)
            assert await wait_until(lambda: _gone(child))  # noqa: B023 - awaited here
        assert (await http.post("/scored_data", content=body)).status_code == 200
        assert server.parser.pid not in (None, child)
    assert len(server.state.queue) == 3


def test_parsing_with_and_without_orjson_gives_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = [make_group(3, marker=1).wire(), {**make_group(2).wire(), "images": [{"a": 1}]}]
    body = json.dumps(groups).encode()
    fast = parse_worker.parse_groups(body, many=True, vocab_size=None)
    monkeypatch.setattr(parse_worker, "orjson", None)
    plain = parse_worker.parse_groups(body, many=True, vocab_size=None)
    assert fast == plain and [g.size for g in plain] == [3, 2]
    assert json.loads(plain[1].body)["images"] == [{"a": 1}]
