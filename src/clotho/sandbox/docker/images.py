"""Images: build a Dockerfile context once, tagged by a hash of its content, and reuse it;
what an image is like (`ImageFacts`, by image ID).

A build that fails (a failing step, a Dockerfile the daemon refuses, the build timeout) is
the task's fault: `TaskError`, which `--resume` does not retry. A daemon that cannot be
reached is infrastructure: `SandboxError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clotho.errors import SandboxError, TaskError

IMAGE_LABEL = "clotho.context-hash"


def context_hash(directory: Path) -> str:
    """sha256 over relative paths, modes and contents: the tag changes iff the context does."""
    digest = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
        elif path.is_file():
            digest.update(f"F {rel} {path.stat().st_mode & 0o777:o}\n".encode())
            with path.open("rb") as file:  # in chunks: a 1 GB file is never held whole
                digest.update(hashlib.file_digest(file, "sha256").digest())
        elif path.is_dir():
            digest.update(f"D {rel}\n".encode())
    return digest.hexdigest()


def tar_directory_to(directory: Path, target: Path) -> None:
    """The build context as a tar file on disk (tarfile copies each file in chunks)."""
    with tarfile.open(target, mode="w") as tar:
        for path in sorted(directory.iterdir()):
            tar.add(path, arcname=path.name)


async def _file_chunks(path: Path, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """A file's bytes in chunks, each read in a thread: the body of a streamed request."""
    with path.open("rb") as file:
        while chunk := await asyncio.to_thread(file.read, size):
            yield chunk


# aiodocker reports a connection that failed (no daemon at the address) as this status.
UNREACHABLE = 900


def _unreachable(exc: Exception) -> SandboxError:
    return SandboxError(f"the Docker daemon cannot be reached: {exc}")


async def image_exists(docker: Any, tag: str) -> bool:
    import aiohttp
    from aiodocker.exceptions import DockerError

    try:
        await docker.images.inspect(tag)
        return True
    except DockerError as exc:
        if exc.status == 404:
            return False
        if exc.status == UNREACHABLE:
            raise _unreachable(exc) from exc
        raise SandboxError(f"docker image inspect {tag}: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise _unreachable(exc) from exc


async def ensure_image(
    docker: Any, image: str, *, what: str, hint: str | None = None, timeout_s: float = 600.0
) -> None:
    """A prebuilt `image` on this daemon: present, or pulled now. One that is neither is
    the task's fault, a `TaskError` (not retried) naming the image and how to get it
    (`hint`, from the task's environment spec); a daemon that cannot be reached is a
    `SandboxError`."""
    import aiohttp
    from aiodocker.exceptions import DockerError

    if await image_exists(docker, image):
        return
    try:
        async with asyncio.timeout(timeout_s):
            await docker.images.pull(image)
    except TimeoutError:
        reason = f"pulling it took longer than {timeout_s:g} s"
    except DockerError as exc:
        if exc.status == UNREACHABLE:
            raise _unreachable(exc) from exc
        reason = f"cannot be pulled ({str(exc.message).strip()[:300]})"
    except aiohttp.ClientError as exc:
        raise _unreachable(exc) from exc
    else:
        if await image_exists(docker, image):
            return
        reason = "pulling it left no such image"
    how = hint or f"build it (docker build -t {image} ...) or load it (docker load -i ...)"
    raise TaskError(f"{what}: image {image} is not on this machine and {reason}; {how}")


async def build_image(
    docker: Any,
    context: Path,
    tag: str,
    *,
    dockerfile: str = "Dockerfile",
    timeout_s: float = 600.0,
    network: str = "host",
    nocache: bool = False,
) -> str:
    """Build `context` into `tag` through the Engine API; a failed build raises TaskError.

    Builds use the host network by default: this machine has no bridge network, and a
    Dockerfile that installs packages must reach a registry.
    """

    # The context goes to the daemon as it is read from a tar file on disk, never whole in
    # memory: a 1 GB file in a task's environment/ took 3 GB of RSS built in a BytesIO.
    tmp = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="clotho-build-"))
    try:
        archive = tmp / "context.tar"
        await asyncio.to_thread(tar_directory_to, context, archive)
        await _post_build(docker, context, tag, archive, dockerfile, timeout_s, network, nocache)
    finally:  # freeing a big file's blocks takes a while: a thread
        await asyncio.to_thread(shutil.rmtree, tmp, ignore_errors=True)
    return tag


async def _post_build(
    docker: Any,
    context: Path,
    tag: str,
    archive: Path,
    dockerfile: str,
    timeout_s: float,
    network: str,
    nocache: bool,
) -> None:
    import aiohttp
    from aiodocker.exceptions import DockerError

    params = {
        "t": tag,
        "dockerfile": dockerfile,
        "rm": "1",
        "forcerm": "1",
        "networkmode": network,
        "nocache": "1" if nocache else "0",
        "labels": json.dumps({IMAGE_LABEL: tag.rsplit(":", 1)[-1], "clotho": "1"}),
    }
    log: list[str] = []
    try:
        async with asyncio.timeout(timeout_s):
            # aiodocker's build() has no network mode, so the Engine API is called directly.
            async with docker._query(
                "build",
                "POST",
                params=params,
                headers={"content-type": "application/x-tar"},
                data=_file_chunks(archive),
                timeout=None,
            ) as response:
                async for line in response.content:
                    if not line.strip():
                        continue
                    try:
                        item = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if "stream" in item:
                        log.append(item["stream"])
                    if "error" in item:
                        tail = "".join(log)[-1500:]
                        raise TaskError(f"building {context} failed: {item['error']}\n{tail}")
    except TimeoutError as exc:
        raise TaskError(f"building {context} took longer than {timeout_s:g} s") from exc
    except DockerError as exc:
        if exc.status == UNREACHABLE:
            raise _unreachable(exc) from exc
        # The daemon answered and refused the build (a Dockerfile it cannot use).
        raise TaskError(f"building {context} failed: {exc.message}") from exc
    except aiohttp.ClientError as exc:
        raise _unreachable(exc) from exc
    if not await image_exists(docker, tag):
        raise TaskError(f"building {context} produced no image {tag}: {''.join(log)[-1500:]}")


async def ensure_context_image(
    docker: Any,
    context: Path,
    name: str,
    *,
    force: bool = False,
    timeout_s: float = 600.0,
    locks: dict[str, asyncio.Lock] | None = None,
    dockerfile: str = "Dockerfile",
) -> str:
    """The tag for `context`, building it only if no image with that content exists yet."""
    digest = await asyncio.to_thread(context_hash, context)
    if dockerfile != "Dockerfile":
        digest = hashlib.sha256(f"{digest}:{dockerfile}".encode()).hexdigest()
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"
    tag = f"clotho-env/{slug}:{digest[:16]}"
    lock = (locks if locks is not None else {}).setdefault(tag, asyncio.Lock())
    async with lock:  # concurrent attempts at one task build once
        if not force and await image_exists(docker, tag):
            return tag
        return await build_image(
            docker, context, tag, dockerfile=dockerfile, timeout_s=timeout_s, nocache=force
        )


@dataclass
class ImageFacts:
    """What one image (by ID) is like; `None`: not probed yet."""

    entrypoint: bool = False  # it wraps its command: the shell cannot be the first process
    bash: bool | None = None
    bwrap: bool | None = None  # isolated slots start there (slots.py)
    problem: str = ""  # why they do not


class ImageFactsCache:
    """Image facts keyed by image ID: a tag rebuilt into another image is asked afresh. Each
    lookup costs one `images.inspect` (a few ms, beside a container's 200 ms)."""

    def __init__(self, docker: Any) -> None:
        self.docker = docker
        self._by_id: dict[str, ImageFacts] = {}

    async def get(self, image: str) -> ImageFacts:
        from aiodocker.exceptions import DockerError

        try:
            info = await self.docker.images.inspect(image)
        except DockerError:
            return ImageFacts()  # creating the container reports a missing image clearly
        facts = self._by_id.get(info["Id"])
        if facts is None:
            entrypoint = bool((info.get("Config") or {}).get("Entrypoint"))
            facts = self._by_id[info["Id"]] = ImageFacts(entrypoint=entrypoint)
        return facts
