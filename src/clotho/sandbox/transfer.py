"""What the backends share to move files: the transfer folder, the big-file threshold, and
host file I/O that leaves the event loop only for big files.

A sandbox's files move through a transfer folder it sees at `XFER_MOUNT` (the local
backend's `<state>/xfer`, an isolated Docker slot's `/slots/k/xfer`): the host writes one
regular file there and the sandbox's own shell copies it into place, or the other way round.
Reading or copying a small file on the host takes microseconds, so it happens on the event
loop; above `BIG_FILE` it goes to a thread: here reading 256 MiB takes 130 ms and even
deleting it 60-100 ms, which would stall every other rollout.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from pathlib import Path

XFER_MOUNT = "/.clotho"
BIG_FILE = 1 << 20

# Exit codes of the file-transfer scripts run through a sandbox's shell.
NOT_FOUND_EXIT, IS_DIR_EXIT = 80, 81


async def read_host_file(path: Path, *, follow_symlinks: bool = True) -> bytes:
    """A regular host file's bytes; read in a thread when it is big.

    A file in a transfer folder is the sandbox's to replace: read it with `follow_symlinks`
    off, so a link planted there cannot point the host elsewhere (and a FIFO cannot block
    the open).
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    # Opening costs microseconds whatever the size: only the read of a big file is a hop.
    with os.fdopen(os.open(path, flags), "rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"is a directory: {path}")
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file: {path}")
        if info.st_size > BIG_FILE:
            return await asyncio.to_thread(file.read)
        return file.read()


async def write_host_file(path: Path, data: bytes) -> None:
    """Write bytes to a host file; in a thread when they are many."""
    if len(data) > BIG_FILE:
        await asyncio.to_thread(path.write_bytes, data)
    else:
        path.write_bytes(data)


async def copy_host_file(source: Path, target: Path) -> None:
    """Copy a host file with its mode and times (`shutil.copy2`); in a thread when it is big."""
    if source.stat().st_size > BIG_FILE:
        await asyncio.to_thread(shutil.copy2, source, target)
    else:
        shutil.copy2(source, target)


async def move_host_path(source: Path, target: Path) -> None:
    """`shutil.move` (a copy across file systems); in a thread for a tree or a big file."""
    info = source.lstat()
    if stat.S_ISDIR(info.st_mode) or info.st_size > BIG_FILE:
        await asyncio.to_thread(shutil.move, source, target)
    else:
        shutil.move(source, target)


async def remove_host_file(path: Path) -> None:
    """Delete a host file if it is there (freeing a big file's blocks takes a while: a thread)."""
    try:
        size = path.lstat().st_size
    except FileNotFoundError:
        return
    if size > BIG_FILE:
        await asyncio.to_thread(path.unlink, missing_ok=True)
    else:
        path.unlink(missing_ok=True)
