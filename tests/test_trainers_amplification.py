"""`clotho api` stays bounded however a token holder shapes its requests: many tiny groups,
gzip of many members, and a registration made before the real trainer's.

Real HTTP on 127.0.0.1 with a token, the real parse child process (its peak resident memory
read from /proc), the real gzip decoder (its work counted, never timed).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from tests.support import PATIENCE_S
from tests.test_trainers_support import ScriptedTrainer, check_batch, make_group

from clotho.trainers.parse_worker import OBJECT_OVERHEAD_BYTES, parse_memory_limit
from clotho.trainers.server import (
    GZIP_SLICE_BYTES,
    MAX_GZIP_MEMBERS,
    ApiServer,
    GunzipWork,
    _TooManyMembers,
    gunzip,
)
from clotho.trainers.state import ApiSettings

TOKEN = "amplification-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TINY = b'{"tokens":[[1]],"masks":[[1]],"scores":[0]}'
"""The smallest valid group: 44 bytes of JSON, about 9 KB as lists and a pydantic model."""


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[tuple[ApiServer, httpx.AsyncClient]]:
    server = ApiServer(ApiSettings(token=TOKEN, **settings), port=0)
    async with (
        server,
        httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=PATIENCE_S * 4) as http,
    ):
        yield server, http


def tiny_groups(count: int) -> bytes:
    return b"[" + b",".join([TINY] * count) + b"]"


def proc_status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def data_limit(pid: int) -> int:
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max data size"))
    return int(line.split()[3])


# --- many tiny groups -------------------------------------------------------------------------


async def test_many_tiny_groups_stay_within_the_documented_multiple() -> None:
    """7.5 MB of 44-byte groups (170,000 of them) took about 1.6 GB in the parse child; the
    group budget refuses it, and the child's peak stays under `parse_memory_limit`."""
    cap = 8 << 20
    async with served(max_request_bytes=cap) as (server, http):
        trainer = ScriptedTrainer(server.url, TOKEN)
        try:
            await trainer.register(4)
            body = tiny_groups((cap - (512 << 10)) // (len(TINY) + 1))
            assert len(body) < cap  # within the body limit as bytes: only its count is too much
            response = await http.post("/scored_data_list", content=body)
            assert response.status_code == 413, response.text
            assert f"counts {OBJECT_OVERHEAD_BYTES} bytes" in response.text
            pid = server.parser.pid
            assert pid is not None  # the body went to the child (it is above 1 MiB)
            peak = proc_status_kib(pid, "VmHWM:") * 1024
            assert peak < parse_memory_limit(cap), f"{peak >> 20} MiB"
            assert data_limit(pid) <= parse_memory_limit(cap)  # the kernel holds it there
            assert (await http.get("/status")).json()["queue_size"] == 0

            # A list within the budget, also through the child, is queued whole and served.
            groups = [make_group(4, marker=m, completion_len=400) for m in range(200)]
            allowed = b"[" + b",".join(g.wire_json() for g in groups) + b"]"
            assert len(allowed) > 1 << 20
            assert len(allowed) + allowed.count(b"{") * OBJECT_OVERHEAD_BYTES <= cap
            response = await http.post("/scored_data_list", content=allowed)
            assert response.json() == {"status": "received", "groups_processed": 200}
            assert server.parser.pid == pid  # the same child: the refusal did not kill it
            batch = await trainer.pull(timeout_s=PATIENCE_S)
            check_batch(batch, 4)
            assert batch[0]["tokens"] == groups[0].tokens
        finally:
            await trainer.aclose()


async def test_a_body_of_nested_empty_lists_meets_the_kernel_cap() -> None:
    """One group whose message carries millions of `[]` (3 bytes of JSON, ~60 bytes as a
    Python list): no group count to refuse, so the kernel's cap on the child stops it. The
    answer is a 413, the child's peak is under the documented limit, and it serves on."""
    cap = 12 << 20
    async with served(max_request_bytes=cap, batch_size=4) as (server, http):
        lists = b"[" + b",".join([b"[]"] * ((cap - (1 << 20)) // 3)) + b"]"
        body = TINY[:-1] + b',"messages":[[{"role":"user","content":"x","x":' + lists + b"}]]}"
        assert len(body) < cap
        response = await http.post("/scored_data", content=body)
        assert response.status_code == 413, response.text
        assert "needs more than" in response.text
        pid = server.parser.pid
        assert pid is not None
        peak = proc_status_kib(pid, "VmHWM:") * 1024
        assert peak < parse_memory_limit(cap), f"{peak >> 20} MiB"
        groups = [make_group(4, marker=m, completion_len=400) for m in range(60)]
        body = b"[" + b",".join(g.wire_json() for g in groups) + b"]"
        assert len(body) > 1 << 20  # through the child again
        response = await http.post("/scored_data_list", content=body)
        assert response.json() == {"status": "received", "groups_processed": 60}
        assert server.parser.pid == pid


async def test_group_budget_holds_for_small_bodies_parsed_in_the_server() -> None:
    """Bodies under 1 MiB are parsed in the server's own process: the budget holds there
    too, and an invalid group is located by its index in the list, as before."""
    cap = 1 << 20
    async with served(max_request_bytes=cap, batch_size=4) as (_, http):
        over = cap // OBJECT_OVERHEAD_BYTES + 1
        response = await http.post("/scored_data_list", content=tiny_groups(over))
        assert response.status_code == 413 and f"{over} JSON objects" in response.text
        under = cap // (OBJECT_OVERHEAD_BYTES + len(TINY) + 1)
        response = await http.post("/scored_data_list", content=tiny_groups(under))
        assert response.json()["groups_processed"] == under
        bad = b"[" + TINY + b"," + TINY.replace(b'"masks":[[1]]', b'"masks":[]') + b"]"
        response = await http.post("/scored_data_list", content=bad)
        assert response.status_code == 422
        assert {e["loc"][0] for e in response.json()["detail"]} == {1}


# --- gzip -------------------------------------------------------------------------------------


def test_gzip_of_many_empty_members_costs_linear_work() -> None:
    """7 MB of empty gzip members (20 bytes each) re-copied the rest of the body per member:
    quadratic. Now the decoder stops at the member limit having made a bounded number of
    decoders and handed zlib a bounded number of bytes."""
    empty = gzip.compress(b"")
    body = empty * ((7 << 20) // len(empty))
    work = GunzipWork()
    with pytest.raises(_TooManyMembers):
        gunzip(body, 256 << 20, work)
    assert work.decoders == MAX_GZIP_MEMBERS  # the next member is refused, not decoded
    assert work.bytes_fed <= MAX_GZIP_MEMBERS * GZIP_SLICE_BYTES


def test_gzip_decoding_feeds_each_byte_about_once() -> None:
    """A body of the allowed number of members decodes exactly; zlib is handed each input
    byte once, plus at most one slice per member ending: linear in the body."""
    rng = os.urandom
    parts = [rng(3000) + bytes(150_000) for _ in range(MAX_GZIP_MEMBERS)]
    body = b"".join(gzip.compress(part) for part in parts)
    work = GunzipWork()
    assert gunzip(body, 64 << 20, work) == b"".join(parts)
    assert work.decoders == MAX_GZIP_MEMBERS
    assert len(body) <= work.bytes_fed <= len(body) + MAX_GZIP_MEMBERS * GZIP_SLICE_BYTES
    for size in (1 << 20, 8 << 20):  # one member: every byte handed to zlib exactly once
        single = gzip.compress(rng(size), 1)
        work = GunzipWork()
        assert len(gunzip(single, 16 << 20, work)) == size
        assert (work.decoders, work.bytes_fed) == (1, len(single))
    with pytest.raises(zlib.error):
        gunzip(gzip.compress(b"x" * 1000)[:-5], 1 << 20)  # truncated


async def test_gzip_of_many_members_is_refused_over_http() -> None:
    async with served(batch_size=4) as (_, http):
        empty = gzip.compress(b"")
        body = empty * ((7 << 20) // len(empty))
        response = await http.post(
            "/scored_data", content=body, headers={"Content-Encoding": "gzip"}
        )
        assert response.status_code == 400
        assert f"more than {MAX_GZIP_MEMBERS} members" in response.text
        group = make_group(4)
        two = gzip.compress(group.wire_json()[:10]) + gzip.compress(group.wire_json()[10:])
        response = await http.post(
            "/scored_data", content=two, headers={"Content-Encoding": "gzip"}
        )
        assert response.json() == {"status": "received"}  # multi-member gzip still works


# --- registration -----------------------------------------------------------------------------


def registration(batch_size: int) -> dict[str, Any]:
    return {
        "wandb_group": "", "wandb_project": "", "batch_size": batch_size,
        "max_token_len": 2048, "checkpoint_dir": "", "save_checkpoint_interval": 0,
        "starting_step": 0, "num_steps": 1,
    }  # fmt: skip


async def test_a_squatting_registration_cannot_lock_out_the_trainer() -> None:
    async with served() as (server, http):
        absurd = await http.post("/register", json=registration(10**12))
        assert absurd.status_code == 422 and "max_batch_size" in absurd.text
        assert (await http.post("/register", json=registration(4096))).status_code == 200
        # The real trainer comes second: nothing used the squatter's shape, so it is replaced.
        trainer = ScriptedTrainer(server.url, TOKEN)
        try:
            await trainer.register(4)
            assert (await http.get("/info")).json()["batch_size"] == 4
            for marker in range(2):
                response = await http.post("/scored_data", json=make_group(2, marker=marker).wire())
                assert response.json() == {"status": "received"}
            check_batch(await trainer.pull(timeout_s=PATIENCE_S), 4)
            # Once a batch was served the shape is in use: a different one is a 409.
            late = await http.post("/register", json=registration(4096))
            assert late.status_code == 409
            assert (await http.get("/info")).json()["batch_size"] == 4
        finally:
            await trainer.aclose()


async def test_a_preset_batch_size_holds_against_every_registration() -> None:
    async with served(batch_size=8) as (_, http):
        assert (await http.post("/register", json=registration(16))).status_code == 409
        assert (await http.post("/register", json=registration(8))).status_code == 200
        assert (await http.get("/info")).json()["batch_size"] == 8
