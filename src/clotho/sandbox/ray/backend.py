"""`RayBackend`: sandboxes spread over a Ray cluster, one host actor per node.

The driver's pool sees it like any backend: `open` picks the least-loaded live node and asks
its host actor (`host.py`, placed with hard node affinity) to open an `inner` sandbox there
(bubblewrap or Docker, through the ordinary backends); the `RaySandbox` it returns sends
commands and files through that actor. A node that dies takes its host actor with it: its
sandboxes fail with `HostLost`, `healthy(sandbox)` says False for them (their failure is the
harness's, not the agent's), and new sandboxes go to the surviving nodes.

Ray is connected once per process (`ray.init` in a thread: it blocks) and disconnected by
the last backend that connected it; a process already connected (a trainer) keeps its
connection. The actors are owned by this driver: they die with it, and every sandbox they
opened is closed by `aclose` (bubblewrap sandboxes die with their host process anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.backends import (
    EnvironmentSpec,
    OpenRequest,
    PreparedEnvironment,
    SandboxBackend,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.host.leases import SandboxRecord
from clotho.sandbox.ray.channel import METHODS, ChannelClient, ChannelLost
from clotho.sandbox.ray.host import RAY_HOSTNAME, RAY_NODE, SandboxHost
from clotho.sandbox.ray.payload import out_of_band, pack
from clotho.sandbox.ray.proxy import RaySandbox
from clotho.sandbox.remote_config import RaySandboxConfig

log = logging.getLogger(__name__)

# Values above this go into Ray's object store before the call (in a thread: putting is a
# copy); smaller ones travel inline with the call.
PUT_ABOVE = 512 << 10
# How long after a node is lost `healthy()` (asked without a sandbox) stays False.
LOSS_WINDOW_S = 300.0
NODE_REFRESH_S = 5.0
# A lost host actor on a live node is replaced at once if it had started, and one that never
# started not more often than this (not in a loop).
RESTART_AFTER_S = 10.0


class HostLost(SandboxError):
    """The node running the sandbox died (or its host actor did): a harness failure."""

    host_failure = True


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise SandboxError("the ray backend needs Ray: pip install 'clotho-rl[ray]'") from exc
    return ray


_connect_lock = threading.Lock()
_connections = 0  # backends of this process that connected Ray and have not closed


def _connect(address: str, namespace: str) -> bool:
    """Connect this process to the cluster; True when this call made the connection."""
    global _connections
    ray = _ray()
    with _connect_lock:
        if ray.is_initialized():
            if _connections:
                _connections += 1
                return True
            return False
        ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
        _connections += 1
        return True


def _disconnect() -> None:
    global _connections
    ray = _ray()
    with _connect_lock:
        _connections -= 1
        if _connections == 0 and ray.is_initialized():
            ray.shutdown()


def _on_this_machine(address: str) -> bool:
    """Whether `address` is one of this machine's own (in this network namespace): a node
    there is reached on loopback, so its channel need not listen on the network."""
    if not address or address in ("0.0.0.0", "::"):
        return False
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except (OSError, ValueError):
        return False
    return True


@dataclass(eq=False)
class _Host:
    """One node's host actor as the driver sees it."""

    node_id: str
    actor: Any
    open: int = 0
    dead: bool = False
    died_at: float | None = None
    hostname: str = ""
    ready: asyncio.Future[None] | None = field(default=None, repr=False)
    channel: ChannelClient | None = field(default=None, repr=False)
    started_at: float = field(default_factory=time.monotonic)
    answered: bool = False  # it started (a host that never did is retried less often)
    replaces: _Host | None = field(default=None, repr=False)  # the lost host it took over from
    address: str = ""  # the node's, as Ray reports it
    listen: tuple[str, int] | None = None  # where its command channel listens


class RayBackend(SandboxBackend[RaySandboxConfig]):
    """Sandboxes on every node of one Ray cluster (`backend_key`: its address)."""

    kind = "ray"
    config_type = RaySandboxConfig

    def __init__(self, config: RaySandboxConfig) -> None:
        self.config = config
        self._connected: bool | None = None
        self._lock = asyncio.Lock()
        self._hosts: dict[str, _Host] = {}
        self._refreshed = 0.0
        self._sandboxes: set[RaySandbox] = set()
        self._last_loss: float | None = None
        self._closed = False
        self._background: set[asyncio.Future[None]] = set()
        self._gate: asyncio.Semaphore | None = None  # sandboxes being created at once
        # What the command channels admit: given to each host actor in a Ray call (the
        # control plane), proven on the channel by HMAC, never sent on it (`channel.py`).
        self._secret = secrets.token_bytes(32)

    # -- the cluster --------------------------------------------------------------------

    async def _ensure_connected(self) -> None:
        if self._connected is None:
            async with self._lock:
                if self._connected is None:
                    try:
                        self._connected = await asyncio.to_thread(
                            _connect, self.config.address, self.config.namespace
                        )
                    except SandboxError:
                        raise
                    except Exception as exc:
                        raise SandboxError(
                            f"cannot connect to the Ray cluster at {self.config.address}: {exc}"
                        ) from exc

    async def hosts(self, *, refresh: bool = False) -> list[_Host]:
        """The live hosts, one per alive node offering `node_resource`; new nodes get one."""
        if self._closed:
            raise SandboxError("the ray backend is closed")
        await self._ensure_connected()
        if refresh or time.monotonic() - self._refreshed > NODE_REFRESH_S:
            ray = _ray()
            nodes = await asyncio.to_thread(ray.nodes)
            self._refreshed = time.monotonic()
            alive = set()
            for node in nodes:
                if not node.get("Alive"):
                    continue
                resources = node.get("Resources", {})
                if self.config.node_resource and self.config.node_resource not in resources:
                    continue
                node_id = node["NodeID"]
                alive.add(node_id)
                old = self._hosts.get(node_id)
                if old is None:
                    self._hosts[node_id] = self._start_host(node_id)
                    self._hosts[node_id].address = node.get("NodeManagerAddress") or ""
                elif old.dead and (
                    old.answered or time.monotonic() - old.started_at > RESTART_AFTER_S
                ):
                    # The node lives on without its host actor (killed, or it never
                    # started): a new one takes its place and reaps what the old one left.
                    log.warning(
                        "a new sandbox host on Ray node %s replaces a lost one", node_id[:12]
                    )
                    self._hosts[node_id] = self._start_host(node_id, replaces=old)
                    self._hosts[node_id].address = node.get("NodeManagerAddress") or ""
            for host in self._hosts.values():
                if host.node_id not in alive and not host.dead:
                    self._mark_dead(host)
        hosts = [h for h in self._hosts.values() if not h.dead]
        await asyncio.gather(*(self._wait_ready(h) for h in hosts), return_exceptions=True)
        return [h for h in hosts if not h.dead]

    def _start_host(self, node_id: str, replaces: _Host | None = None) -> _Host:
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor_class = ray.remote(SandboxHost)
        actor = actor_class.options(
            num_cpus=0,
            max_concurrency=10_000,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(node_id)
        host = _Host(node_id=node_id, actor=actor, replaces=replaces)
        if replaces is not None:
            self._retire(replaces)
        return host

    def _retire(self, host: _Host) -> None:
        """Stop what is left of a lost host actor: its channel, and the actor itself if it
        still lingers (it never answered), in the background."""

        async def retire() -> None:
            if host.channel is not None:
                await host.channel.aclose()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(_ray().kill, host.actor, no_restart=True)

        task = asyncio.ensure_future(retire())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _reap(self, host: _Host) -> None:
        """Remove the sandboxes a lost host actor on `host`'s node left (their owner, that
        actor's process, is dead: the node's own verdict), through the new actor."""
        try:
            status, found = await asyncio.wait_for(
                host.actor.records.remote(self.config.inner.model_dump_json()),
                max(self.config.call_timeout_s, 60.0),
            )
            if status != "ok":
                raise found
            for data, orphaned in found:
                if orphaned and data["labels"].get(RAY_NODE) == host.node_id:
                    record = {**data, "labels": dict(data["labels"])}
                    status, error = await host.actor.remove.remote(
                        self.config.inner.model_dump_json(), record
                    )
                    if status != "ok":
                        log.warning("reaping sandbox %s failed: %s", data["id"], error)
        except Exception as exc:
            log.warning(
                "reaping the sandboxes of a lost host on %s failed: %s", host.node_id[:12], exc
            )

    async def _wait_ready(self, host: _Host) -> None:
        if host.ready is None:
            host.ready = asyncio.ensure_future(self._ping(host))
        await asyncio.shield(host.ready)

    async def _ping(self, host: _Host) -> None:
        try:
            info = await asyncio.wait_for(
                host.actor.ping.remote(), max(self.config.call_timeout_s, 60.0)
            )
            host.hostname = info["hostname"]
            host.answered = True
            if host.replaces is not None:
                host.replaces = None
                task = asyncio.ensure_future(self._reap(host))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        except Exception as exc:
            log.warning("the sandbox host on Ray node %s did not start: %s", host.node_id, exc)
            self._mark_dead(host)
            raise
        if self.config.channel:
            try:
                loopback = _on_this_machine(host.address)
                address, port = await asyncio.wait_for(
                    host.actor.serve.remote(self._secret, loopback), 30
                )
                host.listen = (address, port)
                host.channel = await asyncio.wait_for(
                    ChannelClient.connect(address, port, self._secret), 30
                )
            except Exception as exc:
                log.warning(
                    "no command channel to Ray node %s (commands go as Ray calls): %s",
                    host.node_id[:12],
                    exc,
                )

    def _mark_dead(self, host: _Host) -> None:
        if not host.dead:
            log.warning("Ray node %s is lost: its sandboxes have failed", host.node_id[:12])
            host.dead = True
            host.died_at = self._last_loss = time.monotonic()

    async def call(self, host: _Host, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Call `method` on `host`'s actor; re-raise the sandbox's own error, or `HostLost`
        when the node is gone. A cancelled caller cancels the call on the node too."""
        if host.dead:
            raise HostLost(f"Ray node {host.node_id[:12]} is lost with this sandbox")
        ray = _ray()
        if self._on_channel(host, method, args):
            return await self._channel_call(host, method, args, timeout)
        ref = getattr(host.actor, method).remote(*args)
        try:
            if timeout is None:
                status, value = await ref
            else:
                status, value = await asyncio.wait_for(ref, timeout)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except TimeoutError as exc:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise SandboxError(
                f"the sandbox host on Ray node {host.node_id[:12]} did not answer {method} "
                f"within {timeout:g} s"
            ) from exc
        except ray.exceptions.RayActorError as exc:
            self._mark_dead(host)
            raise HostLost(
                f"Ray node {host.node_id[:12]} is lost with this sandbox: {exc}"
            ) from exc
        except ray.exceptions.RayError as exc:
            raise SandboxError(f"Ray call {method} failed: {exc}") from exc
        if status == "err":
            raise value
        return value

    def _on_channel(self, host: _Host, method: str, args: tuple[Any, ...]) -> bool:
        """Whether a call goes over the command channel: a sandbox call with small values
        (big files travel as Ray objects, big reads as Ray results)."""
        if host.channel is None or host.channel.lost or method not in METHODS:
            return False
        if method == "read_file":
            return bool(args[-1] <= PUT_ABOVE)
        return not any(isinstance(a, _ray().ObjectRef) for a in args)

    async def _channel_call(
        self, host: _Host, method: str, args: tuple[Any, ...], timeout: float | None
    ) -> Any:
        assert host.channel is not None
        try:
            status, value = await asyncio.wait_for(host.channel.call(method, *args), timeout)
        except TimeoutError as exc:
            raise SandboxError(
                f"the sandbox host on Ray node {host.node_id[:12]} did not answer {method} "
                f"within {timeout:g} s"
            ) from exc
        except ChannelLost as exc:
            # The stream ended: the node is gone if its actor no longer answers Ray either.
            try:
                await asyncio.wait_for(host.actor.ping.remote(), self.config.call_timeout_s)
            except Exception as ping_exc:
                self._mark_dead(host)
                raise HostLost(
                    f"Ray node {host.node_id[:12]} is lost with this sandbox: {ping_exc}"
                ) from exc
            raise SandboxError(
                f"the command channel to Ray node {host.node_id[:12]} broke: {exc}"
            ) from exc
        if status == "err":
            raise value
        return value

    async def as_value(self, value: Any) -> Any:
        """`value` (bytes, or a payload) as a call argument: a big one is put in the object
        store first, out of band and in a thread (`payload.out_of_band`: no GIL held for the
        copy, so the event loop runs on), and the call carries a reference."""
        if isinstance(value, tuple):
            kind, data = value
            if len(data) <= PUT_ABOVE:
                return value
            wrapped: Any = (kind, out_of_band(data))
        else:
            if len(value) <= PUT_ABOVE:
                return value
            wrapped = out_of_band(value)
        return await asyncio.to_thread(_ray().put, wrapped)

    def forget(self, sandbox: RaySandbox) -> None:
        if sandbox in self._sandboxes:
            self._sandboxes.discard(sandbox)
            sandbox.host.open -= 1

    # -- the backend contract -------------------------------------------------------------

    def _check(self, config: SandboxConfig) -> RaySandboxConfig:
        if not isinstance(config, RaySandboxConfig):
            raise TypeError(f"the ray backend cannot open {type(config).__name__}")
        return config

    def _create_gate(self, config: RaySandboxConfig) -> asyncio.Semaphore:
        """The cap on sandboxes being created at once (`create_concurrency`, its first
        config's): a burst of rollouts waits its turn; what they do afterwards is not gated."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(config.create_concurrency)
        return self._gate

    async def _open(self, request: OpenRequest[RaySandboxConfig]) -> Sandbox:
        config, labels, lease_s = request.config, request.labels, request.lease_s
        inner_json = config.inner.model_dump_json()
        tried: set[int] = set()  # hosts (a node's replaced host is a new one)
        refresh = refreshed = False
        while True:
            hosts = [h for h in await self.hosts(refresh=refresh) if id(h) not in tried]
            refresh = False
            if config.max_per_node is not None:
                hosts = [h for h in hosts if h.open < config.max_per_node]
            if not hosts and not refreshed:
                refresh = refreshed = True  # a host lost meanwhile may have a successor now
                continue
            if not hosts:
                raise SandboxError(
                    f"no Ray node can take a sandbox ({len(tried)} tried, "
                    f"max_per_node {config.max_per_node})"
                )
            host = min(hosts, key=lambda h: h.open)
            tried.add(id(host))
            host.open += 1  # counted before the await, so concurrent opens spread
            try:
                async with self._create_gate(config):  # creation only, run-wide
                    sid, workdir = await self.call(host, "open", inner_json, dict(labels), lease_s)
            except HostLost:
                host.open -= 1
                continue  # another node
            except BaseException:
                host.open -= 1
                raise
            sandbox = RaySandbox(self, host, sid, workdir, {**labels, RAY_NODE: host.node_id})
            self._sandboxes.add(sandbox)
            return sandbox

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """The inner backend's preparation on every live node (a Docker image is built on
        each; the build context travels as a tar); they agree, being content-addressed."""
        config = self._check(base)
        context = None
        if isinstance(config.inner, DockerSandboxConfig) and spec.context is not None:
            context = await self.as_value(await pack(Path(spec.context)))
        hosts = await self.hosts()
        if not hosts:
            raise SandboxError("no live Ray node to prepare the environment on")
        args = (config.inner.model_dump_json(), spec.model_dump_json(), context, force_build)
        answers = await asyncio.gather(
            *(self.call(h, "prepare", *args) for h in hosts), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, HostLost):
                raise answer
        done = [a for a in answers if not isinstance(a, BaseException)]
        if not done:
            raise SandboxError("every Ray node was lost while preparing the environment")
        inner_json, in_image = done[0]
        inner = type(config.inner).model_validate_json(inner_json)
        return PreparedEnvironment(
            config=config.model_copy(update={"inner": inner}), workspace_in_image=in_image
        )

    async def records(self) -> list[SandboxRecord]:
        """Sandboxes made by Ray hosts, from every live node (machines shared by several
        nodes are listed once); each carries its node's verdict on being an orphan."""
        inner_json = self.config.inner.model_dump_json()
        hosts = await self.hosts(refresh=True)
        answers = await asyncio.gather(
            *(self.call(h, "records", inner_json) for h in hosts), return_exceptions=True
        )
        seen: set[tuple[str, str, str]] = set()
        found: list[SandboxRecord] = []
        for host, answer in zip(hosts, answers, strict=True):
            if isinstance(answer, BaseException):
                log.warning("listing sandboxes on Ray node %s failed: %s", host.node_id, answer)
                continue
            for data, orphaned in answer:
                key = (host.hostname, data["backend"], data["id"])
                if key in seen:
                    continue
                seen.add(key)
                path = data.get("path")
                found.append(
                    RayRecord(
                        data["backend"],
                        data["id"],
                        dict(data["labels"]),
                        data.get("created"),
                        Path(path) if path else None,
                        verdict=orphaned,
                        via_node=host.node_id,
                    )
                )
        return found

    async def remove(self, record: SandboxRecord) -> None:
        """Remove a listed sandbox through a host on its machine."""
        hosts = await self.hosts()
        via = getattr(record, "via_node", None)
        host = self._hosts.get(via) if via else None
        if host is None or host.dead:
            wanted = record.labels.get(RAY_HOSTNAME)
            host = next((h for h in hosts if h.hostname == wanted), None)
        if host is None:
            raise SandboxError(f"no live Ray node on the machine of sandbox {record.id}")
        data = {
            "backend": record.backend,
            "id": record.id,
            "labels": record.labels,
            "created": record.created,
            "path": str(record.path) if record.path else None,
        }
        await self.call(host, "remove", self.config.inner.model_dump_json(), data)

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        """For a sandbox: whether its node is alive (a sandbox of a lost node broke because
        of the harness), asked of its host actor after the failure rather than read from
        what was last seen: a node going down can take the sandbox's shell a moment before
        the actor. Without one: no node of this backend was lost in the last
        `LOSS_WINDOW_S`, and at least one node answers."""
        if isinstance(sandbox, RaySandbox):
            host = sandbox.host
            if host.dead:
                return False
            try:
                await asyncio.wait_for(host.actor.ping.remote(), self.config.call_timeout_s)
            except Exception as exc:
                log.warning(
                    "the sandbox host on Ray node %s does not answer: %s", host.node_id[:12], exc
                )
                self._mark_dead(host)
                return False
            return True
        if self._last_loss is not None and time.monotonic() - self._last_loss < LOSS_WINDOW_S:
            return False
        try:
            return bool(await self.hosts(refresh=True))
        except SandboxError:
            return False

    async def aclose(self) -> None:
        """Close every sandbox still open through this backend, stop the host actors and
        disconnect from Ray if this backend connected."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._background):
            task.cancel()
        if self._background:
            await asyncio.wait(list(self._background))
        for sandbox in list(self._sandboxes):
            with contextlib.suppress(Exception):
                await sandbox.close()
        hosts = [h for h in self._hosts.values() if not h.dead]
        for host in hosts:  # one that never started is not waited for
            if host.ready is not None and not host.ready.done():
                host.ready.cancel()
        if hosts:
            ray = _ray()
            await asyncio.gather(
                *(asyncio.wait_for(self._shutdown(h), 30) for h in hosts if h.answered),
                return_exceptions=True,
            )
            for host in hosts:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(ray.kill, host.actor, no_restart=True)
        for host in self._hosts.values():
            if host.channel is not None:
                await host.channel.aclose()
        self._hosts.clear()
        if self._connected:
            self._connected = False
            await asyncio.to_thread(_disconnect)

    async def _shutdown(self, host: _Host) -> None:
        with contextlib.suppress(Exception):
            await host.actor.shutdown.remote()


class RayRecord(SandboxRecord):
    """A record listed by a node's host: the node judged whether its owner is alive."""

    def __init__(self, *args: Any, verdict: bool, via_node: str) -> None:
        super().__init__(*args)
        self.verdict = verdict
        self.via_node = via_node

    def orphaned(self, now: float | None = None) -> bool:
        return self.verdict or super().orphaned(now)
