"""The sandbox host: one Ray actor per node, running that node's sandboxes.

It opens sandboxes through the ordinary backends (`make_backend`: bubblewrap, Docker) on its
own node and keeps them by id; the driver's `RaySandbox` proxies call its methods. It is an
async actor: every call is a coroutine on the actor's event loop, so a thousand commands in
flight cost no thread or process each. Every method answers `("ok", value)` or
`("err", exception)`: the driver re-raises the sandbox's own error (FileNotFoundError,
OSError with its errno, SandboxError) rather than Ray's wrapper of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
import uuid
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from clotho.errors import ConfigError
from clotho.sandbox.backends import (
    EnvironmentSpec,
    SandboxBackend,
    backend_key,
    make_backend,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.host.leases import SandboxRecord
from clotho.sandbox.host.state import SANDBOX_UID_BASE, SANDBOX_UID_COUNT
from clotho.sandbox.local.bwrap import NETWORK_ROOT_HINT
from clotho.sandbox.local.netguard import guard_host_addresses
from clotho.sandbox.ray.channel import ChannelServer
from clotho.sandbox.ray.payload import (
    OUT_OF_BAND_ABOVE,
    Blob,
    Payload,
    out_of_band,
    pack,
    remove_tree,
    unpack,
)

Reply = tuple[str, Any]
log = logging.getLogger(__name__)
GUARD_REFRESH_S = 5.0

RAY_NODE = "clotho.ray-node"  # the Ray node id a sandbox runs on
RAY_HOSTNAME = "clotho.ray-hostname"  # the machine it runs on (nodes may share one)


def cluster_addresses() -> list[str]:
    """The address of every live node of the cluster, as Ray reports them."""
    import ray

    return sorted(
        {
            n["NodeManagerAddress"]
            for n in ray.nodes()
            if n.get("Alive") and n.get("NodeManagerAddress")
        }
    )


def node_address(node_id: str) -> str:
    """The address Ray reports for node `node_id` (`ray start --node-ip-address`)."""
    import ray

    for node in ray.nodes():
        if node.get("NodeID") == node_id:
            address = str(node.get("NodeManagerAddress") or "")
            if address in ("", "0.0.0.0", "::"):
                break
            return address
    from clotho.errors import SandboxError

    raise SandboxError(f"Ray reports no address for node {node_id[:12]}")


def _inner_adapter() -> TypeAdapter[Any]:
    from clotho.sandbox.remote_config import InnerConfig

    return TypeAdapter(InnerConfig)


async def _reply(work: Awaitable[Any]) -> Reply:
    try:
        return "ok", await work
    except Exception as exc:  # travels back to the driver, which raises it there
        return "err", exc


class SandboxHost:
    """A node's sandboxes, opened by its own backends (one per kind and place)."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.hostname = socket.gethostname()
        self._sandboxes: dict[str, Sandbox] = {}
        self._backends: dict[str, SandboxBackend] = {}
        self._adapter = _inner_adapter()
        self._channel: ChannelServer | None = None
        self._guarded: set[str] = set()  # node addresses the network guard blocks
        self._guard_task: asyncio.Future[None] | None = None

    def _backend(self, inner: Any) -> SandboxBackend:
        key = backend_key(inner)
        backend = self._backends.get(key)
        if backend is None:
            backend = self._backends[key] = make_backend(inner)
        return backend

    def _get(self, sid: str) -> Sandbox:
        sandbox = self._sandboxes.get(sid)
        if sandbox is None:
            from clotho.errors import SandboxError

            raise SandboxError(f"no sandbox {sid} on node {self.node_id[:12]} (closed?)")
        return sandbox

    async def _guard_network(self, inner: Any) -> None:
        """A networked sandbox must not reach this cluster's nodes (their command channels,
        Ray's ports): their addresses join the host guard's (`netguard.py`) before it opens,
        and are looked up again every `GUARD_REFRESH_S` for nodes that join later. Refused
        when the guard cannot hold: a backend without one, or no root."""
        if not getattr(inner, "network", False):
            return
        from clotho.sandbox.local.config import LocalSandboxConfig

        if not isinstance(inner, LocalSandboxConfig):
            raise ConfigError(
                f"network=True on a Ray cluster needs the local backend (not {inner.backend}): "
                "only its guard keeps a sandbox off the cluster's other nodes"
            )
        if os.geteuid() != 0:
            raise ConfigError(NETWORK_ROOT_HINT)
        addresses = set(await asyncio.to_thread(cluster_addresses))
        if not addresses <= self._guarded:
            await guard_host_addresses(SANDBOX_UID_BASE, SANDBOX_UID_COUNT, sorted(addresses))
            self._guarded |= addresses
        if self._guard_task is None:
            self._guard_task = asyncio.ensure_future(self._keep_guard())

    async def _keep_guard(self) -> None:
        while True:
            await asyncio.sleep(GUARD_REFRESH_S)
            try:
                addresses = set(await asyncio.to_thread(cluster_addresses)) | self._guarded
                await guard_host_addresses(SANDBOX_UID_BASE, SANDBOX_UID_COUNT, sorted(addresses))
                self._guarded = addresses
            except Exception as exc:
                log.warning("the network guard of Ray node %s was not refreshed: %s",
                            self.node_id[:12], exc)  # fmt: skip

    async def ping(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "hostname": self.hostname, "pid": os.getpid()}

    async def serve(self, secret: bytes, loopback: bool) -> tuple[str, int]:
        """Start (once) the command channel and admit clients holding `secret`, which came
        in this Ray call and never travels on the channel (`channel.py`). It listens where
        the driver reaches it and no wider: on loopback when the driver runs on this
        machine (`loopback`), else on the address Ray reports for this node; never a
        wildcard."""
        if self._channel is None:
            self._channel = ChannelServer(self._dispatch)
        if loopback:
            address = "127.0.0.1"
        else:
            address = await asyncio.to_thread(node_address, self.node_id)
        return address, await self._channel.start(address, secret)

    def listening(self) -> list[tuple[str, int]]:
        """Where the command channel listens (the tests check it is no wildcard)."""
        return [] if self._channel is None else self._channel.bound

    async def _dispatch(self, method: str, *args: Any) -> Reply:
        reply: Reply = await getattr(self, method)(*args)
        return reply

    # -- lifecycle ------------------------------------------------------------------

    async def open(self, inner_json: str, labels: dict[str, str], lease_s: float) -> Reply:
        async def work() -> tuple[str, str]:
            inner = self._adapter.validate_json(inner_json)
            await self._guard_network(inner)
            labels.update({RAY_NODE: self.node_id, RAY_HOSTNAME: self.hostname})
            sandbox = await self._backend(inner).open(inner, labels, lease_s=lease_s)
            sid = uuid.uuid4().hex[:16]
            self._sandboxes[sid] = sandbox
            return sid, sandbox.workdir

        return await _reply(work())

    async def close(self, sid: str) -> Reply:
        async def work() -> None:
            sandbox = self._sandboxes.get(sid)
            if sandbox is not None:
                try:
                    await sandbox.close()
                finally:
                    self._sandboxes.pop(sid, None)

        return await _reply(work())

    async def prepare(
        self, inner_json: str, spec_json: str, context: Payload | None, force_build: bool
    ) -> Reply:
        """The inner config for a task's environment on this node; a build context comes
        along as a tar (the driver's folder need not exist here)."""

        async def work() -> tuple[str, bool]:
            inner = self._adapter.validate_json(inner_json)
            spec = EnvironmentSpec.model_validate_json(spec_json)
            folder = None
            try:
                if context is not None:
                    folder = Path(tempfile.mkdtemp(prefix="clotho-ray-ctx-"))
                    await unpack(context, folder / "context")
                    spec = spec.model_copy(update={"context": folder / "context"})
                prepared = await self._backend(inner).prepare(inner, spec, force_build=force_build)
            finally:
                if folder is not None:
                    await remove_tree(folder)
            return prepared.config.model_dump_json(), prepared.workspace_in_image

        return await _reply(work())

    async def count(self) -> int:
        return len(self._sandboxes)

    async def shutdown(self) -> None:
        """Close every sandbox this host opened, then its backends (the driver is done)."""
        if self._channel is not None:
            self._channel.close()
        if self._guard_task is not None:
            self._guard_task.cancel()
        sandboxes = list(self._sandboxes.values())
        self._sandboxes.clear()
        await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
        backends = list(self._backends.values())
        self._backends.clear()
        await asyncio.gather(*(b.aclose() for b in backends), return_exceptions=True)

    # -- the Sandbox API --------------------------------------------------------------

    async def exec(self, sid: str, cmd: str, options: dict[str, Any]) -> Reply:
        async def work() -> tuple[int, str, str, bool, float]:
            r = await self._get(sid).exec(cmd, **options)
            return r.exit_code, r.stdout, r.stderr, r.timed_out, r.duration_s

        return await _reply(work())

    async def exec_fresh(self, sid: str, cmd: str, options: dict[str, Any]) -> Reply:
        async def work() -> tuple[int, str, str, bool, float]:
            r = await self._get(sid).exec_fresh(cmd, **options)
            return r.exit_code, r.stdout, r.stderr, r.timed_out, r.duration_s

        return await _reply(work())

    async def stop_agent(self, sid: str) -> Reply:
        return await _reply(self._get(sid).stop_agent())

    async def digests(self, sid: str, paths: Sequence[str]) -> Reply:
        return await _reply(self._get(sid).digests(list(paths)))

    async def changed_paths(self, sid: str) -> Reply:
        """The node sandbox's own list of changes, as (path, kind, link) triples; None where
        its backend cannot tell."""

        async def work() -> list[tuple[str, str, bool | None]] | None:
            found = await self._get(sid).changed_paths()
            return None if found is None else [(c.path, c.kind, c.link) for c in found]

        return await _reply(work())

    async def read_file(self, sid: str, path: str, max_bytes: int) -> Reply:
        return await _reply(self._get(sid).read_file(path, max_bytes=max_bytes))

    async def write_file(self, sid: str, path: str, data: Blob) -> Reply:
        async def work() -> None:
            # A big file arrives as a view of the object store; the sandbox takes bytes.
            blob = data if isinstance(data, bytes) else await asyncio.to_thread(bytes, data)
            await self._get(sid).write_file(path, blob)

        return await _reply(work())

    async def upload(self, sid: str, payload: Payload, remote: str) -> Reply:
        async def work() -> None:
            sandbox = self._get(sid)
            folder = Path(tempfile.mkdtemp(prefix="clotho-ray-up-"))
            try:
                await unpack(payload, folder / "x")
                await sandbox.upload(folder / "x", remote)
            finally:
                await remove_tree(folder)

        return await _reply(work())

    async def download(self, sid: str, remote: str) -> Reply:
        async def work() -> Payload:
            sandbox = self._get(sid)
            folder = Path(tempfile.mkdtemp(prefix="clotho-ray-down-"))
            try:
                await sandbox.download(remote, folder / "x")
                kind, data = await pack(folder / "x")
                # Big ones out of band: the driver receives them without holding the GIL.
                return (kind, out_of_band(data)) if len(data) > OUT_OF_BAND_ABOVE else (kind, data)
            finally:
                await remove_tree(folder)

        return await _reply(work())

    # -- list and gc ------------------------------------------------------------------

    async def records(self, inner_json: str) -> Reply:
        """Sandboxes a Ray host made on this machine, with the verdict on orphans taken here
        (their owner is a process of this machine)."""

        async def work() -> list[tuple[dict[str, Any], bool]]:
            inner = self._adapter.validate_json(inner_json)
            found = await self._backend(inner).records()
            return [
                (
                    {
                        "backend": r.backend,
                        "id": r.id,
                        "labels": r.labels,
                        "created": r.created,
                        "path": str(r.path) if r.path else None,
                    },
                    r.orphaned(),
                )
                for r in found
                if RAY_NODE in r.labels
            ]

        return await _reply(work())

    async def remove(self, inner_json: str, record: dict[str, Any]) -> Reply:
        async def work() -> None:
            inner = self._adapter.validate_json(inner_json)
            path = record.get("path")
            await self._backend(inner).remove(
                SandboxRecord(
                    record["backend"],
                    record["id"],
                    dict(record["labels"]),
                    record.get("created"),
                    Path(path) if path else None,
                )
            )

        return await _reply(work())
