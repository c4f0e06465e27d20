"""Tar archives into and out of a container through the Engine API, without stalling the loop.

aiodocker hands `put_archive` the whole body to write at once and reads `get_archive`'s whole
response before parsing it, on the event loop: for 128 MiB that is 0.3-0.4 s in one step,
during which no other rollout moves. Here the body goes out in 1 MiB chunks, the response
comes in chunks, and joining and parsing a big archive happen in a thread (the 1 MiB rule of
`sandbox/transfer.py`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
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


# -- streamed reads: one member at a time, never the whole archive ------------------------

_BLOCK = 512
_MAX_HEADER_DATA = 1 << 20  # a PAX or GNU long-name record larger than this is not a file


class TarStream:
    """Reads a tar from a response body one header at a time (PAX and GNU long names
    applied), so a caller can look at a member before any of its data is read."""

    def __init__(self, content: Any) -> None:
        self.content = content
        self._left = 0  # data bytes (with padding) of the current member not read yet
        self._size = 0  # data bytes of the current member not read yet (no padding)

    async def _exactly(self, size: int) -> bytes:
        try:
            return bytes(await self.content.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            raise OSError("the archive from the container ended early") from exc

    async def _skip_rest(self) -> None:
        while self._left:
            step = min(self._left, CHUNK)
            await self._exactly(step)
            self._left -= step

    async def next(self) -> tarfile.TarInfo | None:
        """The next member's header (its data not read yet); None at the end."""
        await self._skip_rest()
        pax: dict[str, str] = {}
        long_name = long_link = None
        while True:
            block = await self._exactly(_BLOCK)
            if block == bytes(_BLOCK):
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise OSError(f"unreadable archive from the container: {exc}") from exc
            padded = -(-info.size // _BLOCK) * _BLOCK
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
                             tarfile.GNUTYPE_LONGLINK):  # fmt: skip
                if info.size > _MAX_HEADER_DATA:
                    raise OSError("an archive header from the container is too large")
                raw = (await self._exactly(padded))[: info.size]
                if info.type == tarfile.XHDTYPE:
                    pax.update(_pax_records(raw))
                elif info.type == tarfile.GNUTYPE_LONGNAME:
                    long_name = raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
                elif info.type == tarfile.GNUTYPE_LONGLINK:
                    long_link = raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
                continue
            if long_name is not None:
                info.name = long_name
            if long_link is not None:
                info.linkname = long_link
            if "path" in pax:
                info.name = pax["path"]
            if "linkpath" in pax:
                info.linkname = pax["linkpath"]
            if "size" in pax:
                info.size = int(pax["size"])
                padded = -(-info.size // _BLOCK) * _BLOCK
            self._left = padded if info.isreg() else 0
            self._size = info.size if info.isreg() else 0
            return info

    async def chunks(self) -> AsyncIterator[bytes]:
        """The current member's data, in chunks as they arrive."""
        size = self._size
        while size > 0:
            step = min(size, CHUNK)
            data = await self._exactly(step)
            size -= step
            self._left -= step
            yield data
        await self._skip_rest()  # the padding


def _pax_records(raw: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    while raw:
        length, _, _ = raw.partition(b" ")
        try:
            size = int(length)
        except ValueError:
            break
        record = raw[len(length) + 1 : size].rstrip(b"\n")
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        raw = raw[size:]
    return records


@contextlib.asynccontextmanager
async def archive_stream(container: Any, path: str, what: str) -> AsyncIterator[TarStream]:
    """`GET /containers/{id}/archive?path=` as a `TarStream`; closing it mid-way stops the
    daemon's sending (a directory's archive is its whole tree). Docker resolves links in the
    parent folders within the container's root, never on the host, and gives the last
    component itself (a link stays a link)."""
    from aiodocker.exceptions import DockerError

    try:
        async with container.docker._query(
            f"containers/{container.id}/archive", method="GET", params={"path": path}
        ) as response:
            try:
                yield TarStream(response.content)
            finally:
                response.close()  # aiodocker leaves it open: the rest of a tree must not come
    except DockerError as exc:
        if exc.status == 404:
            raise FileNotFoundError(f"no such file or directory in the sandbox: {what}") from exc
        raise SandboxError(f"reading {what} from the container: {exc}") from exc


@dataclass(frozen=True)
class PathStat:
    """What the Engine API says is at a path (`HEAD .../archive`), without following a link
    at its end and without any archive being made."""

    mode: int  # Go's os.FileMode bits
    size: int
    link_target: str  # resolved by Docker within the container, absolute

    @property
    def is_dir(self) -> bool:
        return bool(self.mode & _GO_DIR)

    @property
    def is_link(self) -> bool:
        return bool(self.mode & _GO_SYMLINK)

    @property
    def is_regular(self) -> bool:
        return not self.mode & _GO_TYPE


_GO_DIR, _GO_SYMLINK = 1 << 31, 1 << 27
# Every non-regular type bit of Go's os.FileMode (dir, symlink, device, pipe, socket, ...).
_GO_TYPE = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)


async def stat_path(container: Any, path: str) -> PathStat | None:
    """`HEAD /containers/{id}/archive?path=`: the entry's stat from its header; None when
    the daemon finds nothing (or will not say)."""
    import aiohttp

    # aiodocker raises on any status >= 400 by parsing the (empty) body of a HEAD answer, so
    # the request is made with the client's session directly: only a 404 means nothing.
    try:
        await container.docker._check_version()
        url = container.docker._canonicalize_url(f"containers/{container.id}/archive")
        async with container.docker.session.head(url, params={"path": path}) as response:
            status = response.status
            header = response.headers.get("X-Docker-Container-Path-Stat")
    except (aiohttp.ClientError, OSError) as exc:
        raise SandboxError(f"cannot ask the Docker daemon about {path}: {exc}") from exc
    if status == 404:
        return None
    if status != 200 or not header:
        raise SandboxError(f"the Docker daemon answered {status} about {path}")
    try:
        info = json.loads(base64.b64decode(header))
        return PathStat(int(info["mode"]), int(info["size"]), str(info.get("linkTarget") or ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"unreadable stat of {path} from the Docker daemon") from exc


def _same(path: str) -> str | None:
    return path


async def path_digest(
    container: Any,
    path: str,
    *,
    outer: Callable[[str], str | None] = _same,
    max_bytes: int = 8 << 30,
    _hops: int = 0,
) -> str | None:
    """The digest of what is at `path` (as the sandbox sees it; `outer` maps that to the
    container's path, None: hidden), hashed on the host while it streams. A regular file is
    `sha256:<hex>:<mode>`; a link `link:<target>=<digest of what it points to>` (so replacing
    `python3.11` changes the digest of the link `python3` too); a folder `dir`; anything else
    `type:<t>`; None when nothing is there."""
    where = outer(path)
    if where is None:
        return None
    stat = await stat_path(container, where)
    if stat is None:
        return None
    if stat.is_dir:  # never ask for its archive: that is the whole tree
        return "dir"
    try:
        async with archive_stream(container, where, path) as tar:
            info = await tar.next()
            if info is None:
                return None
            if info.issym() or info.islnk():
                link = info.linkname
            elif info.isdir():
                return "dir"
            elif not info.isreg():
                return f"type:{info.type.decode(errors='replace')}"
            elif info.size > max_bytes:
                return f"size:{info.size}"
            else:
                digest = hashlib.sha256()
                async for chunk in tar.chunks():
                    digest.update(chunk)
                return f"sha256:{digest.hexdigest()}:{info.mode & 0o7777:o}"
    except FileNotFoundError:
        return None
    if _hops >= 40:
        return f"link:{link}=loop"
    base = "/" if info.islnk() else posixpath.dirname(path)
    target = posixpath.normpath(posixpath.join(base, link))
    inner = await path_digest(container, target, outer=outer, max_bytes=max_bytes, _hops=_hops + 1)
    return f"link:{link}={inner}"


async def read_regular(container: Any, path: str, what: str, max_bytes: int) -> bytes:
    """A regular file's bytes, following links (within the container, at most 40); a
    folder is IsADirectoryError, anything else (a device, a FIFO) OSError, and a file over
    `max_bytes` OSError(EFBIG) before any of its data is read."""
    for _ in range(40):
        stat = await stat_path(container, path)
        if stat is not None and stat.is_dir:  # never ask for its archive: the whole tree
            raise IsADirectoryError(f"is a directory: {what}")
        if stat is not None and stat.is_regular and stat.size > max_bytes:
            raise OSError(errno.EFBIG, f"{what} has {stat.size} bytes, more than {max_bytes}")
        if stat is not None and not stat.is_regular and not stat.is_link:
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)", what)
        async with archive_stream(container, path, what) as tar:
            info = await tar.next()
            if info is None:
                raise FileNotFoundError(f"no such file or directory in the sandbox: {what}")
            if info.issym() or info.islnk():
                base = "/" if info.islnk() else posixpath.dirname(path)
                path = posixpath.normpath(posixpath.join(base, info.linkname))
                continue
            if info.isdir():
                raise IsADirectoryError(f"is a directory: {what}")
            if not info.isreg():
                raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)", what)
            if info.size > max_bytes:
                raise OSError(
                    errno.EFBIG, f"{what} has {info.size} bytes, more than {max_bytes} allowed"
                )
            data = bytearray()
            async for chunk in tar.chunks():
                data += chunk
            return bytes(data)
    raise OSError(errno.ELOOP, f"too many levels of symbolic links: {what}")


async def download_tree(container: Any, path: str, what: str, target: Path, max_bytes: int) -> None:
    """Write the archive of `path` to the host file `target`, stopping (OSError EFBIG) once
    it passes `max_bytes`; written in 1 MiB chunks, each in a thread when big."""
    total = 0
    async with archive_stream(container, path, what) as tar:
        content = tar.content
        with open(target, "wb") as sink:  # noqa: ASYNC230 - chunks of 1 MiB at most
            while chunk := await content.read(CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise OSError(errno.EFBIG, f"{what} is larger than {max_bytes} bytes")
                sink.write(chunk)
