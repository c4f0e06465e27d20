"""The sandbox configuration of a task: its image (built from environment/ when it has a
Dockerfile) and its resource limits. Only the Docker backend uses images."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from clotho.errors import SandboxError, TaskError
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.docker.images import ensure_context_image, image_exists
from clotho.tasks.harbor import Task

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def build_context(task: Task) -> tuple[Path, str]:
    """(context folder, Dockerfile name): environment/Dockerfile, or the build section of
    the compose file's main service (`main`, else `client`, else the first with `build`)."""
    env_dir = task.environment_dir
    if (env_dir / "Dockerfile").is_file():
        return env_dir, "Dockerfile"
    for name in COMPOSE_FILES:
        compose = env_dir / name
        if not compose.is_file():
            continue
        try:
            services = (yaml.safe_load(compose.read_text()) or {}).get("services") or {}
        except yaml.YAMLError as exc:
            raise TaskError(f"{compose}: invalid YAML: {exc}") from exc
        with_build = {k: v for k, v in services.items() if isinstance(v, dict) and v.get("build")}
        main = next((with_build[k] for k in ("main", "client") if k in with_build), None)
        main = main or next(iter(with_build.values()), None)
        if main is None:
            continue
        build = main["build"]
        if isinstance(build, str):
            return (env_dir / build).resolve(), "Dockerfile"
        context = (env_dir / str(build.get("context", "."))).resolve()
        return context, str(build.get("dockerfile", "Dockerfile"))
    return env_dir, "Dockerfile"


class ImageResolver:
    """Builds each task's image once per content (tagged by hash) and reuses it."""

    def __init__(self, docker: Any, *, force_build: bool = False) -> None:
        self.docker = docker
        self.force_build = force_build
        self._locks: dict[str, asyncio.Lock] = {}
        self._built: set[str] = set()

    async def image_for(self, task: Task, default: str) -> str:
        env = task.config.environment
        context, dockerfile_name = build_context(task)
        dockerfile = context / dockerfile_name
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
                context,
                task.name,
                dockerfile=dockerfile_name,
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
