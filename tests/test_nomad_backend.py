"""The nomad backend against a test double of Nomad's HTTP API on 127.0.0.1
(`FakeNomad`): it registers the job, and for each allocation it "places" it starts a real
sandbox server (`clotho.sandbox.remote.server`) on a free port; a count decrease stops the
highest name indexes first, as Nomad does. Nomad itself cannot run here."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support import wait_until

from clotho.sandbox.remote.nomad_backend import TOKEN_ENV, NomadBackend, job_spec
from clotho.sandbox.remote.server import make_app
from clotho.sandbox.remote_config import NomadSandboxConfig

# An idle timeout any idle time is past (it must be > 0): a host with no slot in use may go
# at the next round, with no waiting for a clock.
IDLE_AT_ONCE = 1e-9


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _serve(app: Starlette, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(server.serve())
    assert await wait_until(lambda: server.started)  # uvicorn offers a flag, not an event
    return server, task


class FakeNomad:
    """Test double of Nomad's job, scale and allocation endpoints."""

    def __init__(self) -> None:
        self.job: dict[str, Any] | None = None
        self.allocs: dict[str, dict[str, Any]] = {}
        self.servers: dict[str, tuple[uvicorn.Server, asyncio.Task[None]]] = {}
        self.scales: list[int] = []
        self.purged = False
        self.port = _port()
        self.app = Starlette(
            routes=[
                Route("/v1/jobs", self.register, methods=["POST"]),
                Route("/v1/job/{id}/scale", self.scale, methods=["POST"]),
                Route("/v1/job/{id}/allocations", self.list_allocs),
                Route("/v1/allocation/{id}", self.alloc),
                Route("/v1/job/{id}", self.deregister, methods=["DELETE"]),
            ]
        )

    async def register(self, request: Request) -> JSONResponse:
        self.job = (await request.json())["Job"]
        return JSONResponse({"EvalID": "e1"})

    async def scale(self, request: Request) -> JSONResponse:
        assert self.job is not None
        count = int((await request.json())["Count"])
        self.scales.append(count)
        token = self.job["TaskGroups"][0]["Tasks"][0]["Env"][TOKEN_ENV]
        running = {a["Index"]: a for a in self.allocs.values() if a["DesiredStatus"] == "run"}
        for index in range(count):
            if index not in running:
                port = _port()
                alloc_id = f"alloc-{len(self.allocs)}"
                self.servers[alloc_id] = await _serve(make_app(token), port)
                self.allocs[alloc_id] = {
                    "ID": alloc_id,
                    "Name": f"{self.job['ID']}.sandbox[{index}]",
                    "Index": index,
                    "ClientStatus": "running",
                    "DesiredStatus": "run",
                    "Port": port,
                }
        for index, alloc in running.items():
            if index >= count:  # Nomad stops the highest indexes first
                await self._stop(alloc)
        return JSONResponse({"EvalID": "e2"})

    async def _stop(self, alloc: dict[str, Any]) -> None:
        alloc["DesiredStatus"], alloc["ClientStatus"] = "stop", "complete"
        server, task = self.servers.pop(alloc["ID"])
        server.should_exit = True
        await task

    async def list_allocs(self, request: Request) -> JSONResponse:
        return JSONResponse(
            [
                {k: a[k] for k in ("ID", "Name", "ClientStatus", "DesiredStatus")}
                for a in self.allocs.values()
            ]
        )

    async def alloc(self, request: Request) -> JSONResponse:
        a = self.allocs[request.path_params["id"]]
        network = {"IP": "127.0.0.1", "DynamicPorts": [{"Label": "http", "Value": a["Port"]}]}
        return JSONResponse({**a, "AllocatedResources": {"Shared": {"Networks": [network]}}})

    async def deregister(self, request: Request) -> JSONResponse:
        self.purged = request.query_params.get("purge") == "true"
        for alloc in list(self.allocs.values()):
            if alloc["DesiredStatus"] == "run":
                await self._stop(alloc)
        return JSONResponse({})

    def live(self) -> list[str]:
        return sorted(a["Name"] for a in self.allocs.values() if a["DesiredStatus"] == "run")


def nomad_config(nomad: FakeNomad, tmp_path: Path, **settings: Any) -> NomadSandboxConfig:
    """A config for the fake: no allocation kept warm, none waited for, idle ones go."""
    return NomadSandboxConfig(
        address=f"http://127.0.0.1:{nomad.port}",
        min_allocations=0,
        idle_timeout_s=IDLE_AT_ONCE,
        scale_cooldown_s=0,
        slot_root=str(tmp_path / "slots"),
        **settings,
    )


@pytest.fixture
async def nomad() -> Any:
    fake = FakeNomad()
    server, task = await _serve(fake.app, fake.port)
    yield fake
    for alloc in list(fake.allocs.values()):
        if alloc["DesiredStatus"] == "run":
            await fake._stop(alloc)
    server.should_exit = True
    await task


def test_the_job_runs_a_sandbox_server_on_a_dynamic_port_under_docker_or_apptainer() -> None:
    docker = job_spec(NomadSandboxConfig(image="reg/clotho:1"), "tok", 2)["Job"]
    group = docker["TaskGroups"][0]
    assert group["Count"] == 2
    assert group["Networks"][0]["DynamicPorts"] == [{"Label": "http", "To": 8080}]
    task = group["Tasks"][0]
    assert task["Driver"] == "docker" and task["Config"]["image"] == "reg/clotho:1"
    assert "${NOMAD_PORT_http}" in task["Config"]["args"] and task["Env"][TOKEN_ENV] == "tok"
    sif = job_spec(NomadSandboxConfig(driver="raw_exec", image="/images/c.sif"), "t", 1)["Job"]
    raw = sif["TaskGroups"][0]["Tasks"][0]
    assert raw["Driver"] == "raw_exec" and raw["Config"]["command"] == "apptainer"
    assert raw["Config"]["args"][:3] == ["exec", "--containall", "/images/c.sif"]


async def test_slots_over_allocations_long_commands_and_scale_down(
    nomad: FakeNomad, tmp_path: Path
) -> None:
    config = nomad_config(nomad, tmp_path, slots_per_allocation=2, request_timeout_s=1.0)
    backend = NomadBackend(config)
    boxes = [await backend.open(config, {"clotho.run": "n"}) for _ in range(3)]
    assert nomad.live() == ["clotho-sandbox.sandbox[0]", "clotho-sandbox.sandbox[1]"]
    r = await boxes[0].exec("echo hi; echo err >&2; exit 4")
    assert (r.exit_code, r.stdout, r.stderr) == (4, "hi\n", "err\n")
    # a command longer than the per-request margin: its own timeout is what counts
    long = await boxes[2].exec("sleep 2; echo late", timeout=20)
    assert long.stdout == "late\n" and not long.timed_out
    await boxes[0].write_file("f.bin", bytes(range(256)) * 1000)
    assert await boxes[0].read_file("f.bin") == bytes(range(256)) * 1000
    # the allocation with the lower index keeps its acquired slots; index 1 goes when idle
    await boxes[2].close()
    await backend.hosts.maintain()  # (or the backend's own round did it first)
    assert await wait_until(lambda: nomad.live() == ["clotho-sandbox.sandbox[0]"])
    assert nomad.scales[-1] == 1
    assert (await boxes[1].exec("echo still")).stdout == "still\n"
    await boxes[0].close()
    await boxes[1].close()
    await backend.aclose()
    assert nomad.live() == [] and nomad.purged


async def test_an_idle_allocation_below_a_busy_one_is_kept(
    nomad: FakeNomad, tmp_path: Path
) -> None:
    config = nomad_config(nomad, tmp_path, slots_per_allocation=1)
    backend = NomadBackend(config)
    low = await backend.open(config, {})
    high = await backend.open(config, {})
    await low.close()
    assert await backend.hosts.maintain() == [], "a count decrease would stop the busy [1]"
    assert nomad.live() == ["clotho-sandbox.sandbox[0]", "clotho-sandbox.sandbox[1]"]
    assert (await high.exec("echo ok")).stdout == "ok\n"
    await high.close()
    await backend.aclose()
