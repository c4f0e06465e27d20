"""Files as one value that travels through Ray: a file's bytes, or a directory as a tar.

Ray moves a value above its inline limit (100 KiB) through the object store, zero-copy on
the receiving node: that is how big files cross the cluster, never base64 in a command.
Packing and unpacking a big tree runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
from pathlib import Path
from typing import Literal

from clotho.sandbox.transfer import BIG_FILE

Kind = Literal["file", "tar"]
Payload = tuple[Kind, bytes]


def _pack(path: Path) -> Payload:
    if path.is_dir():
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(str(path), arcname=".")
        return "tar", buffer.getvalue()
    return "file", path.read_bytes()


def _unpack(payload: Payload, target: Path) -> None:
    kind, data = payload
    if kind == "file":
        target.write_bytes(data)
        return
    target.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(str(target), filter="data")


async def pack(path: Path) -> Payload:
    """`path` (a file or a directory) as one value; big ones are read in a thread."""
    if path.is_file() and path.stat().st_size <= BIG_FILE:
        return _pack(path)
    return await asyncio.to_thread(_pack, path)


async def unpack(payload: Payload, target: Path) -> None:
    """Write `payload` at `target` (which must not exist): a file, or a directory unpacked
    without links or devices that leave it (tarfile's `data` filter)."""
    if target.exists() or target.is_symlink():
        raise FileExistsError(f"already exists: {target}")
    if payload[0] == "file" and len(payload[1]) <= BIG_FILE:
        _unpack(payload, target)
    else:
        await asyncio.to_thread(_unpack, payload, target)


async def remove_tree(path: Path) -> None:
    await asyncio.to_thread(shutil.rmtree, path, True)
