"""The `nomad` backend: a Nomad job per pool, a sandbox server per allocation, N slots each.

`NomadApi` is a thin adapter over Nomad's HTTP API (httpx, async). The job (`job_spec`)
has one group `sandbox` running `clotho.sandbox.remote.server` under the docker driver, or
under raw_exec through Apptainer/Singularity (`apptainer exec IMAGE ...`), on a dynamic
port (the seed's static port collided with two allocations on a host). Allocations are
`SlotHosts` hosts: scaling up is the job scale endpoint (count + 1) and waiting for a new
running allocation whose server answers `/health`; a slot is a `RemoteSlotSandbox` whose
scripts go to the server's `/run`, each request with its own timeout (the command's plus
`request_timeout_s`; the seed's client-wide 30 s killed long commands). Scale-down ends
only an allocation with no acquired slot and the highest name index, since a count
decrease makes Nomad stop the highest index; the seed never scaled down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import time
from typing import Any

import httpx

from clotho.errors import SandboxError
from clotho.sandbox.backends import OpenRequest, SandboxBackend
from clotho.sandbox.base import Sandbox
from clotho.sandbox.host.leases import SandboxRecord
from clotho.sandbox.remote.slot_sandbox import RemoteSlotSandbox
from clotho.sandbox.remote.slots import SlotHosts
from clotho.sandbox.remote_config import NomadSandboxConfig

GROUP = "sandbox"
TOKEN_ENV = "CLOTHO_SERVER_TOKEN"


def job_spec(config: NomadSandboxConfig, token: str, count: int) -> dict[str, Any]:
    """The job Nomad runs: one group of sandbox servers on a dynamic port each."""
    server = ["-m", "clotho.sandbox.remote.server", "--port", "${NOMAD_PORT_http}"]
    if config.driver == "docker":
        task_config: dict[str, Any] = {
            "image": config.image,
            "ports": ["http"],
            "command": "python3",
            "args": server,
        }
    else:  # raw_exec: the server runs inside the SIF image through Apptainer
        task_config = {
            "command": "apptainer",
            "args": ["exec", "--containall", config.image, "python3", *server],
        }
    return {
        "Job": {
            "ID": config.job_id,
            "Name": config.job_id,
            "Type": "service",
            "Datacenters": config.datacenters,
            "Meta": {"clotho": "1"},
            "TaskGroups": [
                {
                    "Name": GROUP,
                    "Count": count,
                    "Networks": [{"DynamicPorts": [{"Label": "http", "To": config.server_port}]}],
                    "RestartPolicy": {"Attempts": 0, "Mode": "fail"},
                    "Tasks": [
                        {
                            "Name": "sandbox-server",
                            "Driver": config.driver,
                            "Config": task_config,
                            "Env": {TOKEN_ENV: token},
                            "Resources": {"CPU": config.cpu_mhz, "MemoryMB": config.memory_mb},
                        }
                    ],
                }
            ],
        }
    }


class NomadApi:
    """The slice of Nomad's HTTP API the backend uses; async, a timeout per request."""

    def __init__(self, config: NomadSandboxConfig) -> None:
        headers = {}
        token = os.environ.get(config.token_env)
        if token:
            headers["X-Nomad-Token"] = token
        self._http = httpx.AsyncClient(
            base_url=config.address, headers=headers, timeout=config.request_timeout_s
        )

    async def _json(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise SandboxError(f"Nomad at {self._http.base_url} failed: {exc}") from exc
        if response.status_code >= 400:
            raise SandboxError(f"Nomad {method} {path}: {response.status_code} {response.text}")
        return response.json() if response.content else None

    async def register(self, job: dict[str, Any]) -> None:
        await self._json("POST", "/v1/jobs", job)

    async def scale(self, job_id: str, count: int) -> None:
        body = {"Count": count, "Target": {"Group": GROUP}, "Message": "clotho slot pool"}
        await self._json("POST", f"/v1/job/{job_id}/scale", body)

    async def allocations(self, job_id: str) -> list[dict[str, Any]]:
        return list(await self._json("GET", f"/v1/job/{job_id}/allocations") or [])

    async def allocation(self, alloc_id: str) -> dict[str, Any]:
        return dict(await self._json("GET", f"/v1/allocation/{alloc_id}"))

    async def deregister(self, job_id: str) -> None:
        await self._json("DELETE", f"/v1/job/{job_id}?purge=true")

    async def aclose(self) -> None:
        await self._http.aclose()


def _index(name: str) -> int:
    match = re.search(r"\[(\d+)\]$", name)
    return int(match.group(1)) if match else -1


def _address(alloc: dict[str, Any]) -> str:
    """http://ip:port of the allocation's `http` port."""
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    for network in shared.get("Networks") or []:
        for port in network.get("DynamicPorts") or []:
            if port.get("Label") == "http":
                return f"http://{network['IP']}:{port['Value']}"
    for port in shared.get("Ports") or []:
        if port.get("Label") == "http":
            return f"http://{port['HostIP']}:{port['Value']}"
    raise SandboxError(f"allocation {alloc.get('ID')} has no http port")


class Allocation:
    """One allocation's sandbox server."""

    def __init__(
        self, backend: NomadBackend, alloc_id: str, name: str, url: str, token: str
    ) -> None:
        self.id = alloc_id
        self.name = name
        self.index = _index(name)
        self.url = url
        self._backend = backend
        self._http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"})

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        try:
            response = await self._http.get("/health", timeout=5)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def run(
        self, script: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes]:
        spec = {"script": script, "stdin": stdin is not None, "timeout": timeout}
        limit = (timeout or 600.0) + self._backend.config.request_timeout_s
        try:
            response = await self._http.post(
                "/run",
                content=stdin or b"",
                headers={"X-Clotho-Run": json.dumps(spec)},
                timeout=limit,
            )
        except httpx.HTTPError as exc:
            raise SandboxError(f"the sandbox server of allocation {self.id} failed: {exc}") from exc
        if response.status_code != 200:
            raise SandboxError(f"sandbox server {response.status_code}: {response.text[:500]}")
        split = int(response.headers["x-clotho-stdout"])
        body = response.content
        return int(response.headers["x-clotho-exit"]), body[:split], body[split:]

    async def terminate(self) -> None:
        await self._backend.scale_down(self)
        await self._http.aclose()


class NomadBackend(SandboxBackend[NomadSandboxConfig]):
    """Slots on the allocations of one Nomad job (`backend_key`: address and job)."""

    kind = "nomad"
    config_type = NomadSandboxConfig

    def __init__(self, config: NomadSandboxConfig, api: NomadApi | None = None) -> None:
        self.config = config
        self.api = api or NomadApi(config)
        self._token = secrets.token_hex(16)
        self._registered = False
        self._target = 0
        self._claimed: set[str] = set()
        self._lock = asyncio.Lock()
        self._last_scale = 0.0
        self.hosts: SlotHosts[Allocation] = SlotHosts(
            self._create,
            slots=config.slots_per_allocation,
            min_hosts=config.min_allocations,
            max_hosts=config.max_allocations,
            idle_timeout_s=config.idle_timeout_s,
            max_lifetime_s=24 * 3600.0,
            removable=self._removable,
            create_gate=asyncio.Semaphore(config.create_concurrency),
        )
        self._maintenance: asyncio.Task[None] | None = None

    async def _register(self) -> None:
        async with self._lock:
            if not self._registered:
                await self.api.register(job_spec(self.config, self._token, 0))
                self._registered = True

    async def _create(self) -> Allocation:
        """Scale the job up by one and wait for a new allocation whose server answers."""
        await self._register()
        async with self._lock:
            wait = self.config.scale_cooldown_s - (time.monotonic() - self._last_scale)
            if wait > 0 and self._target:
                await asyncio.sleep(wait)
            self._target += 1
            await self.api.scale(self.config.job_id, self._target)
            self._last_scale = time.monotonic()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            for stub in await self.api.allocations(self.config.job_id):
                if (
                    stub["ID"] in self._claimed
                    or stub.get("ClientStatus") != "running"
                    or stub.get("DesiredStatus") != "run"
                ):
                    continue
                self._claimed.add(stub["ID"])
                alloc = await self.api.allocation(stub["ID"])
                host = Allocation(self, stub["ID"], stub["Name"], _address(alloc), self._token)
                if await host.healthy():
                    return host
                self._claimed.discard(stub["ID"])
            await asyncio.sleep(0.5)
        raise SandboxError(f"no healthy allocation of job {self.config.job_id} within 300 s")

    def _removable(self, host: Allocation, live: list[Allocation]) -> bool:
        """Nomad stops the highest name index on a count decrease: only that one may go."""
        return host.index == max(h.index for h in live)

    async def scale_down(self, host: Allocation) -> None:
        async with self._lock:
            self._target = max(0, self._target - 1)
            await self.api.scale(self.config.job_id, self._target)
            self._claimed.discard(host.id)

    async def _open(self, request: OpenRequest[NomadSandboxConfig]) -> Sandbox:
        config, labels = request.config, request.labels
        if self._maintenance is None:
            self._maintenance = asyncio.ensure_future(self._maintain())
        host, slot = await self.hosts.acquire()
        root = f"{config.slot_root}/{host.id}-{slot}"  # unique even if allocations share a disk
        sandbox = RemoteSlotSandbox(
            host.run,
            root=root,
            workdir=f"{root}{config.workdir}",
            token=secrets.token_hex(8),
            env=config.env,
            labels={**labels, "clotho.nomad-alloc": host.id, "clotho.slot": str(slot)},
            release=lambda: self.hosts.release(host, slot),
            exec_timeout_s=600.0,
        )
        try:
            await sandbox.setup()
        except BaseException:
            await self.hosts.release(host, slot)
            raise
        return sandbox

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(5)
            await self.hosts.maintain()
            await self.hosts.warm()

    async def records(self) -> list[SandboxRecord]:
        """The job's live allocations (each hosts up to N slots)."""
        found = []
        for stub in await self.api.allocations(self.config.job_id):
            if stub.get("DesiredStatus") == "run":
                labels = {"clotho.slots": str(self.config.slots_per_allocation)}
                found.append(SandboxRecord("nomad", stub["ID"], labels))
        return found

    async def remove(self, record: SandboxRecord) -> None:
        """Allocations go with the job: `aclose` deregisters it."""

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        try:
            await self.api.allocations(self.config.job_id)
        except SandboxError:
            return False
        return True

    async def aclose(self) -> None:
        """End every allocation and purge the job."""
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
            self._maintenance = None
        await self.hosts.close()
        if self._registered:
            with contextlib.suppress(SandboxError):
                await self.api.deregister(self.config.job_id)
            self._registered = False
        await self.api.aclose()
