"""What a task asks of its sandbox, and its workspace.

The task format knows where the build context is (environment/Dockerfile or a compose
file's main service) and what limits it sets; the sandbox backend decides what to do with
that (`SlotPool.prepare`). Nothing here knows which backend runs.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from clotho.errors import TaskError
from clotho.sandbox import EnvironmentSpec, Sandbox
from clotho.tasks.compose import main_service, sidecar_specs
from clotho.tasks.harbor import Task

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
# Files of environment/ that describe how to build a container, not workspace content.
BUILD_FILES = ("Dockerfile", ".dockerignore", *COMPOSE_FILES)


def build_context(task: Task) -> tuple[Path, str] | None:
    """(context folder, Dockerfile name): environment/Dockerfile, or the build section of
    the compose file's main service (`main`, else `client`, else the first with `build`:
    `compose.main_service`); a main service without one builds nothing."""
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
        # The main service as `tasks/compose.py` reads it (its other services are sidecars).
        name = main_service(services, has_dockerfile=False) if isinstance(services, dict) else None
        main = services.get(name) if name is not None else None
        if not isinstance(main, dict) or not main.get("build"):
            continue
        build = main["build"]
        if isinstance(build, str):
            return _inside(task, compose, env_dir / build), "Dockerfile"
        context = _inside(task, compose, env_dir / str(build.get("context", ".")))
        dockerfile = str(build.get("dockerfile", "Dockerfile"))
        _inside(task, compose, context / dockerfile)
        return context, dockerfile
    return None


def _inside(task: Task, compose: Path, path: Path) -> Path:
    """A build path from a compose file, refused when it leaves the task's folder (a task
    must not make the build read host files)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(task.path.resolve()):
        raise TaskError(f"{compose}: build path {path} leaves the task folder")
    return resolved


def refuse_gpus(task: Task) -> None:
    """A task that needs GPUs is refused before any sandbox starts, naming the field: no
    sandbox backend here gives a task GPUs, and one run without them would score the
    harness, not the agent."""
    env = task.config.environment
    if env.gpus <= 0:
        return
    kinds = f", gpu_types = {env.gpu_types}" if env.gpu_types else ""
    raise TaskError(
        f"{task.path / 'task.toml'}: [environment] gpus = {env.gpus}{kinds}: this run cannot "
        f"give a sandbox GPUs (no sandbox backend here does); leave the task out with "
        f"--skip-tasks {task.name}"
    )


def environment_spec(task: Task) -> EnvironmentSpec:
    """What the task asks of its sandbox; a request no sandbox here can meet (GPUs) is a
    `TaskError`, raised where every path prepares a task's environment."""
    refuse_gpus(task)
    env = task.config.environment
    found = build_context(task)
    context, dockerfile = found if found is not None else (None, "Dockerfile")
    if context is not None and not (context / dockerfile).is_file():
        context = None
    return EnvironmentSpec(
        name=task.name,
        context=context,
        dockerfile=dockerfile,
        image=env.docker_image,
        build_timeout_s=env.build_timeout_sec,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        storage_mb=env.storage_mb,
        # Harbor's default is True; here a task has a network only when it asks for one and
        # the run gives networks (`--network`), and one that asks is refused when it does not.
        network=env.allow_internet,
        build_hint=build_hint(task, context) if env.docker_image else None,
        # The compose file's other services (`tasks/compose.py`): run beside the sandbox on
        # Docker, the task's error elsewhere.
        sidecars=sidecar_specs(task),
    )


def build_hint(task: Task, context: Path | None) -> str:
    """How to get a task's `docker_image` onto this machine when it is missing."""
    image = task.config.environment.docker_image
    if context is not None:
        return f"build it with: docker build -t {image} {context}"
    return (
        f"{task.path / 'task.toml'} names it ([environment] docker_image) and the task has no "
        f"environment/Dockerfile: build or load it on this machine (docker build -t {image} "
        "<its context>, or docker load -i <an archive of it>), or add environment/Dockerfile"
    )


async def upload_workspace(task: Task, sandbox: Sandbox) -> None:
    """The files of environment/ (other than build files) become the workspace."""
    env_dir = task.environment_dir
    if not env_dir.is_dir():
        return
    await sandbox.upload(env_dir, sandbox.workdir)
    present = [name for name in BUILD_FILES if (env_dir / name).exists()]
    if present:
        await sandbox.exec("rm -f -- " + " ".join(present), timeout=30)
