"""The sandbox configuration of a task: its image (built from environment/ when it has a
Dockerfile) and its resource limits. Only the Docker backend uses images."""

from __future__ import annotations

import asyncio
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.docker.images import ensure_context_image, image_exists
from clotho.tasks.harbor import Task


class ImageResolver:
    """Builds each task's image once per content (tagged by hash) and reuses it."""

    def __init__(self, docker: Any, *, force_build: bool = False) -> None:
        self.docker = docker
        self.force_build = force_build
        self._locks: dict[str, asyncio.Lock] = {}
        self._built: set[str] = set()

    async def image_for(self, task: Task, default: str) -> str:
        env = task.config.environment
        dockerfile = task.environment_dir / "Dockerfile"
        if env.docker_image and not self.force_build:
            if await image_exists(self.docker, env.docker_image):
                return env.docker_image
            if not dockerfile.is_file():
                raise SandboxError(
                    f"{task.name}: image {env.docker_image} is not available locally "
                    "and the task has no environment/Dockerfile to build it from"
                )
        if dockerfile.is_file():
            # Rebuild once per run when forced, not once per attempt.
            force = self.force_build and task.name not in self._built
            tag = await ensure_context_image(
                self.docker,
                task.environment_dir,
                task.name,
                force=force,
                timeout_s=env.build_timeout_sec,
                locks=self._locks,
            )
            self._built.add(task.name)
            return tag
        return default


async def task_sandbox_config(
    task: Task, base: SandboxConfig, resolver: ImageResolver | None
) -> SandboxConfig:
    if not isinstance(base, DockerSandboxConfig):
        return base
    if resolver is None:
        raise SandboxError("the docker backend needs an image resolver")
    env = task.config.environment
    return base.model_copy(
        update={
            "image": await resolver.image_for(task, base.image),
            "cpus": base.cpus or env.cpus,
            "memory_mb": base.memory_mb or env.memory_mb,
        }
    )
