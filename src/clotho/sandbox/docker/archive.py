"""Tar archives into and out of a container through the Engine API, without stalling the loop.

aiodocker hands `put_archive` the whole body to write at once and reads `get_archive`'s whole
response before parsing it, on the event loop: for 128 MiB that is 0.3-0.4 s in one step,
during which no other rollout moves. Here the body goes out in 1 MiB chunks, the response
comes in chunks, and joining and parsing a big archive happen in a thread (the 1 MiB rule of
`sandbox/transfer.py`).
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.transfer import BIG_FILE

CHUNK = 1 << 20


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), CHUNK):
        yield data[start : start + CHUNK]


async def put_archive(container: Any, directory: str, archive: bytes) -> None:
    """Unpack `archive` (a tar) into `directory` of the container."""
    from aiodocker.exceptions import DockerError

    body: bytes | AsyncIterator[bytes] = archive if len(archive) <= CHUNK else _chunks(archive)
    try:
        await container.put_archive(directory, body)
    except DockerError as exc:
        raise SandboxError(f"writing into {directory} in the container: {exc}") from exc


def _first_file(archive: bytes, what: str) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        member = tar.next()
        extracted = tar.extractfile(member) if member is not None and member.isfile() else None
        if extracted is None:
            raise OSError(f"file transfer failed for {what}: not a regular file")
        return extracted.read()


async def read_file_from_archive(container: Any, path: str, what: str) -> bytes:
    """The bytes of the regular file at `path` in the container (`what` names it in errors)."""
    from aiodocker.exceptions import DockerError

    chunks: list[bytes] = []
    try:
        async with container.docker._query(
            f"containers/{container.id}/archive", method="GET", params={"path": path}
        ) as response:
            async for chunk in response.content.iter_chunked(CHUNK):
                chunks.append(chunk)
    except DockerError as exc:
        if exc.status == 404:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {what}") from exc
        raise SandboxError(f"reading {what} from the container: {exc}") from exc
    size = sum(len(chunk) for chunk in chunks)
    if size > BIG_FILE:
        return await asyncio.to_thread(lambda: _first_file(b"".join(chunks), what))
    return _first_file(b"".join(chunks), what)
