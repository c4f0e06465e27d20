"""The `modal` backend: Modal sandboxes with N slots each (extra `modal`).

`ModalBackend` keeps a `SlotHosts` pool of Modal sandboxes per configuration: a slot is a
`RemoteSlotSandbox` whose scripts run through `Sandbox.exec`. Everything Modal is behind
`ModalClient`, a thin adapter; `SdkModalClient` calls Modal's async interface (`.aio`), so
no SDK call blocks the event loop (the seed called the synchronous one inside `async def`).
What the seed got wrong and this does not:

- Modal's own `idle_timeout` is never set: it ends a sandbox whose slot is acquired while
  the agent thinks. Idle scale-down is ours and skips hosts with an acquired slot.
- Modal's `timeout` (its hard lifetime) is `max_lifetime_s`; slots are handed out only in
  the first half of it, so a rollout shorter than half the lifetime never loses its host.
- A named sandbox from an earlier run is reused only when its tags (labels) match exactly.
- Command timeouts are per call (`timeout` on the command, plus a grace on the exec), not a
  client-wide limit that killed long commands.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from typing import Any, Protocol

from clotho.errors import SandboxError, TaskError
from clotho.sandbox.backends import (
    EnvironmentSpec,
    OpenRequest,
    PreparedEnvironment,
    SandboxBackend,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig
from clotho.sandbox.host.leases import SandboxRecord, lease_labels
from clotho.sandbox.remote.slot_sandbox import RemoteSlotSandbox
from clotho.sandbox.remote.slots import SlotHosts
from clotho.sandbox.remote_config import ModalSandboxConfig

CONFIG_LABEL = "clotho.config"  # hash of the configuration a host was made for


class ModalHandle(Protocol):
    """One Modal sandbox as the backend uses it."""

    id: str

    async def tags(self) -> dict[str, str]: ...

    async def run(
        self, script: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes]: ...

    async def terminate(self) -> None: ...


class ModalClient(Protocol):
    """The slice of Modal's API the backend needs (a fake implements it in the tests)."""

    async def create(
        self, config: ModalSandboxConfig, *, name: str, tags: dict[str, str], image: Any
    ) -> ModalHandle: ...

    async def from_name(self, app_name: str, name: str) -> ModalHandle | None: ...

    async def list(self, app_name: str, tags: dict[str, str]) -> list[ModalHandle]: ...

    async def image(self, config: ModalSandboxConfig) -> Any: ...


class _SdkHandle:
    def __init__(self, sandbox: Any) -> None:
        self._sandbox = sandbox
        self.id = str(sandbox.object_id)

    async def tags(self) -> dict[str, str]:
        return dict(await self._sandbox.get_tags.aio())

    async def run(
        self, script: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes]:
        process = await self._sandbox.exec.aio(
            "bash", "-c", script, timeout=int(timeout) if timeout else None, text=False
        )
        if stdin is not None:
            process.stdin.write(stdin)
            process.stdin.write_eof()
            await process.stdin.drain.aio()
        out, err = await asyncio.gather(process.stdout.read.aio(), process.stderr.read.aio())
        code = await process.wait.aio()
        return int(code), bytes(out), bytes(err)

    async def terminate(self) -> None:
        await self._sandbox.terminate.aio()


class SdkModalClient:
    """Modal's official SDK, async calls only (`pip install 'clotho-rl[modal]'`)."""

    def __init__(self) -> None:
        try:
            import modal
        except ImportError as exc:
            raise SandboxError(
                "the modal backend needs Modal's SDK: pip install 'clotho-rl[modal]'"
            ) from exc
        self._modal = modal
        self._apps: dict[str, Any] = {}

    async def _app(self, name: str) -> Any:
        if name not in self._apps:
            self._apps[name] = await self._modal.App.lookup.aio(name, create_if_missing=True)
        return self._apps[name]

    async def image(self, config: ModalSandboxConfig) -> Any:
        """The task's Dockerfile (built by Modal, cached by content), else the registry
        image."""
        if config.build_context is not None:
            dockerfile = f"{config.build_context}/{config.dockerfile}"
            return self._modal.Image.from_dockerfile(dockerfile, context_dir=config.build_context)
        if config.image is None:
            raise TaskError("the modal backend needs an image or a Dockerfile")
        return self._modal.Image.from_registry(config.image)

    async def create(
        self, config: ModalSandboxConfig, *, name: str, tags: dict[str, str], image: Any
    ) -> ModalHandle:
        secrets_ = [self._modal.Secret.from_name(s) for s in config.secrets]
        sandbox = await self._modal.Sandbox.create.aio(
            "sleep",
            "infinity",
            app=await self._app(config.app_name),
            name=name,
            image=image,
            timeout=int(config.max_lifetime_s),
            cpu=config.cpu,
            memory=config.memory_mb,
            gpu=config.gpu,
            secrets=secrets_,
            block_network=not config.network,
        )
        await sandbox.set_tags.aio(tags)
        return _SdkHandle(sandbox)

    async def from_name(self, app_name: str, name: str) -> ModalHandle | None:
        try:
            sandbox = await self._modal.Sandbox.from_name.aio(app_name, name)
        except self._modal.exception.NotFoundError:
            return None
        return _SdkHandle(sandbox)

    async def list(self, app_name: str, tags: dict[str, str]) -> list[ModalHandle]:
        app = await self._app(app_name)
        return [
            _SdkHandle(s) async for s in self._modal.Sandbox.list.aio(app_id=app.app_id, tags=tags)
        ]


def config_hash(config: ModalSandboxConfig) -> str:
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:12]


class ModalBackend(SandboxBackend[ModalSandboxConfig]):
    """Slots on Modal sandboxes, one `SlotHosts` pool per configuration."""

    kind = "modal"
    config_type = ModalSandboxConfig

    def __init__(self, client: ModalClient | None = None) -> None:
        self._client = client
        self._pools: dict[str, SlotHosts[Any]] = {}
        self._maintenance: asyncio.Task[None] | None = None
        self._create_gate: asyncio.Semaphore | None = None  # one for every pool: run-wide

    @property
    def client(self) -> ModalClient:
        if self._client is None:
            self._client = SdkModalClient()
        return self._client

    def _pool(self, config: ModalSandboxConfig, labels: dict[str, str], lease_s: float) -> Any:
        key = config_hash(config)
        pool = self._pools.get(key)
        if pool is None:
            tags = {
                **{k: v for k, v in labels.items() if k.startswith("clotho")},
                **lease_labels(lease_s),
                CONFIG_LABEL: key,
                "clotho": "1",
            }
            counter = iter(range(1 << 30))

            async def create() -> ModalHandle:
                return await self._create(config, key, next(counter), tags)

            pool = self._pools[key] = SlotHosts(
                create,
                slots=config.slots_per_sandbox,
                min_hosts=config.min_sandboxes,
                max_hosts=config.max_sandboxes,
                idle_timeout_s=config.idle_timeout_s,
                max_lifetime_s=config.max_lifetime_s,
                create_gate=self._gate(config),
            )
            if self._maintenance is None:
                self._maintenance = asyncio.ensure_future(self._maintain())
        return pool

    def _gate(self, config: ModalSandboxConfig) -> asyncio.Semaphore:
        """The backend's cap on sandboxes being created at once (its first config's)."""
        if self._create_gate is None:
            self._create_gate = asyncio.Semaphore(config.create_concurrency)
        return self._create_gate

    async def _create(
        self, config: ModalSandboxConfig, key: str, index: int, tags: dict[str, str]
    ) -> ModalHandle:
        name = f"clotho-{key}-{index}"
        if config.reuse:
            found = await self.client.from_name(config.app_name, name)
            if found is not None:
                theirs = await found.tags()
                if theirs.get(CONFIG_LABEL) == key and {
                    k: v for k, v in theirs.items() if k != "clotho.lease-expires"
                } == {k: v for k, v in tags.items() if k != "clotho.lease-expires"}:
                    return found
                name = f"{name}-{secrets.token_hex(4)}"  # labels differ: never reuse it
        try:
            image = await self.client.image(config)
            return await self.client.create(config, name=name, tags=tags, image=image)
        except (SandboxError, TaskError):
            raise
        except Exception as exc:
            raise SandboxError(f"could not create a Modal sandbox: {exc}") from exc

    async def _open(self, request: OpenRequest[ModalSandboxConfig]) -> Sandbox:
        config, labels, lease_s = request.config, request.labels, request.lease_s
        pool = self._pool(config, labels, lease_s)
        host, slot = await pool.acquire()
        single = config.slots_per_sandbox == 1
        root = f"{config.slot_root}/{slot}"
        sandbox = RemoteSlotSandbox(
            host.run,
            root=root,
            workdir=config.workdir if single else f"{root}{config.workdir}",
            token=secrets.token_hex(8),
            env=config.env,
            labels={**labels, "clotho.modal-sandbox": host.id, "clotho.slot": str(slot)},
            release=lambda: pool.release(host, slot, end=single),
            exec_timeout_s=config.exec_timeout_s,
        )
        try:
            await sandbox.setup()
        except BaseException:
            await pool.release(host, slot)
            raise
        return sandbox

    async def _maintain(self) -> None:
        while True:
            await asyncio.sleep(5)
            for pool in list(self._pools.values()):
                await pool.maintain()
                await pool.warm()

    async def records(self) -> list[SandboxRecord]:
        """Modal sandboxes clotho made in the default app, by their tags."""
        found = await self.client.list(ModalSandboxConfig().app_name, {"clotho": "1"})
        return [SandboxRecord("modal", h.id, await h.tags()) for h in found]

    async def remove(self, record: SandboxRecord) -> None:
        for handle in await self.client.list(ModalSandboxConfig().app_name, {"clotho": "1"}):
            if handle.id == record.id:
                await handle.terminate()

    async def aclose(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
            self._maintenance = None
        pools = list(self._pools.values())
        self._pools.clear()
        await asyncio.gather(*(p.close() for p in pools), return_exceptions=True)

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """A task's Dockerfile becomes the image (Modal builds it when the first sandbox
        starts; the workspace is then in it), else its prebuilt image reference."""
        if not isinstance(base, ModalSandboxConfig):
            raise TypeError(f"the modal backend cannot prepare {type(base).__name__}")
        if spec.context is not None and (spec.context / spec.dockerfile).is_file():
            update = {"build_context": str(spec.context), "dockerfile": spec.dockerfile}
            return PreparedEnvironment(
                config=base.model_copy(update=update), workspace_in_image=True
            )
        if spec.image:
            base = base.model_copy(update={"image": spec.image})
        return PreparedEnvironment(config=base, workspace_in_image=False)
