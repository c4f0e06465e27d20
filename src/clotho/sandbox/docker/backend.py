"""The Docker backend: `DockerBackend`, one per daemon address.

It holds what its sandboxes share: the aiodocker client, the `SlotHost` of shared
containers (`slots.py`), what it learnt about images (keyed by image ID, so a rebuilt tag is
asked afresh: `images.ImageFactsCache`), task image builds, and listing and removing its
containers by label. It opens a container of its own per sandbox (`sandbox.py`), a slot of
a shared one, or a sandbox with its compose services beside it (`sidecars.py`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from clotho.errors import SandboxError, TaskError
from clotho.sandbox.backends import (
    EnvironmentSpec,
    OpenRequest,
    PreparedEnvironment,
    SandboxBackend,
)
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.docker.containers import docker_client
from clotho.sandbox.docker.images import (
    ImageFactsCache,
    ensure_context_image,
    ensure_image,
    image_exists,
)
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.docker.sidecars import SidecarSandbox, prepare_sidecars
from clotho.sandbox.docker.slots import SlotHost
from clotho.sandbox.host.leases import (
    SandboxRecord,
    docker_records,
    local_records,
    remove_docker,
    remove_local,
)

log = logging.getLogger(__name__)


class DockerBackend(SandboxBackend[DockerSandboxConfig]):
    """The Docker daemon at one address, and everything its sandboxes share."""

    kind = "docker"
    config_type = DockerSandboxConfig

    def __init__(self, url: str | None = None, *, state_dir: str | None = None) -> None:
        self.url = url
        self._client: Any = None
        self._images: ImageFactsCache | None = None
        self._slots: SlotHost | None = None
        self._state_dirs: set[str | None] = {None, state_dir}  # where FIFO folders live
        self._prepare_locks: dict[str, asyncio.Lock] = {}
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._forced: set[str] = set()  # contexts rebuilt on force_build: once per backend
        self._failed: dict[str, str] = {}  # contexts that failed to build: not tried again
        self._closed = False

    @property
    def client(self) -> Any:
        """The aiodocker client, made on first use."""
        if self._closed:
            raise SandboxError("the docker backend is closed")
        if self._client is None:
            self._client = docker_client(self.url)
        return self._client

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        """The daemon answers within 10 s."""
        try:
            async with asyncio.timeout(10):
                await self.client.version()
        except Exception as exc:
            log.warning("the docker daemon at %s does not answer: %s", self.url or "default", exc)
            return False
        return True

    @property
    def images(self) -> ImageFactsCache:
        if self._images is None:
            self._images = ImageFactsCache(self.client)
        return self._images

    async def _open(self, request: OpenRequest[DockerSandboxConfig]) -> Sandbox:
        config, labels, lease_s = request.config, request.labels, request.lease_s
        self._state_dirs.add(config.state_dir)
        if config.sidecars:  # a compose task's services beside it (sidecars.py)
            return await SidecarSandbox.create_with_sidecars(
                config, labels, docker=self.client, images=self.images, lease_s=lease_s
            )
        if config.slots_per_container > 1:  # a slot of a shared container
            if self._slots is None:
                self._slots = SlotHost(self.client, facts=self.images.get)
            return await self._slots.open(config, labels, lease_s=lease_s)
        return await DockerSandbox.create(
            config, labels, docker=self.client, images=self.images, lease_s=lease_s
        )

    # -- images ------------------------------------------------------------------------

    async def prepare(
        self, base: SandboxConfig, spec: EnvironmentSpec, *, force_build: bool = False
    ) -> PreparedEnvironment:
        """The task's image (prebuilt, or built from its Dockerfile once per content) and
        its limits; the base config's own limits win over the task's."""
        if not isinstance(base, DockerSandboxConfig):
            raise TypeError(f"the docker backend cannot prepare {type(base).__name__}")
        image, in_image = await self._image_for(spec, base.image, force_build)
        config = base.model_copy(
            update={
                "image": image,
                "cpus": base.cpus or spec.cpus,
                "memory_mb": base.memory_mb or spec.memory_mb,
                "storage_mb": base.storage_mb or spec.storage_mb,
            }
        )
        if spec.sidecars:  # their images too (sidecars.py)
            sidecars = await prepare_sidecars(self._image_for, config, spec, force_build)
            config = config.model_copy(update={"sidecars": sidecars})
        return PreparedEnvironment(config=config, workspace_in_image=in_image)

    async def _image_for(
        self, spec: EnvironmentSpec, default: str, force_build: bool
    ) -> tuple[str, bool]:
        """(image, whether it holds the workspace): a prebuilt image present here, else one
        built from the context, else the base image."""
        if spec.image and not force_build:
            if spec.context is None:  # present, pulled, or the task's error with a hint
                await ensure_image(
                    self.client, spec.image, what=spec.name, hint=spec.build_hint,
                    timeout_s=spec.build_timeout_s or 600.0,
                )  # fmt: skip
                return spec.image, False
            if await image_exists(self.client, spec.image):
                return spec.image, True
        if spec.context is None:
            return default, False
        if not (spec.context / spec.dockerfile).is_file():
            raise TaskError(f"{spec.name}: no {spec.dockerfile} in {spec.context}")
        key = f"{spec.name}\0{spec.context}\0{spec.dockerfile}"
        async with self._prepare_locks.setdefault(key, asyncio.Lock()):
            if key in self._failed:  # every attempt of the task fails alike: no rebuild
                raise TaskError(self._failed[key])
            # Rebuilt once per backend (per run) when forced, not once per attempt.
            force = force_build and key not in self._forced
            try:
                tag = await ensure_context_image(
                    self.client,
                    spec.context,
                    spec.name,
                    dockerfile=spec.dockerfile,
                    force=force,
                    timeout_s=spec.build_timeout_s or 600.0,
                    locks=self._build_locks,
                )
            except TaskError as exc:
                self._failed[key] = str(exc)
                raise
            if force:
                self._forced.add(key)
        return tag, True

    # -- listing and removal -----------------------------------------------------------

    async def records(self) -> list[SandboxRecord]:
        """Containers on this daemon, and the host folders holding containers' FIFOs."""
        found = await docker_records(self.client)
        for state_dir in sorted(self._state_dirs, key=str):
            folders = await asyncio.to_thread(local_records, state_dir)
            found += [r for r in folders if r.backend == "docker-io"]
        return found

    async def remove(self, record: SandboxRecord) -> None:
        if record.path is not None:
            await asyncio.to_thread(remove_local, record)
        else:
            await remove_docker(self.client, record)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._slots is not None:
                await self._slots.close()
        finally:
            self._slots = None
            if self._client is not None:
                await self._client.close()
                self._client = None
