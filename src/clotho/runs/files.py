"""Files inside a run folder, opened without following links.

A run folder is data anyone may have edited or shipped (a hostile archive, a shared disk):
a `trials/` that is a link to a home folder, a `results.jsonl` that is a FIFO. Every file
of a run folder is reached from the folder itself, one component at a time through
directory descriptors with O_NOFOLLOW, never climbing `..`, and only a regular file is read
(a FIFO or a device is refused at once, never waited on). The folder the user named may
itself be a link: that one is the user's choice.

Run folders are private: made 0700, their files 0600 (conversations, prompts and
configurations are nobody else's to read on a shared host).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath

DIR_MODE = 0o700
FILE_MODE = 0o600
MAX_READ = 1 << 30
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _parts(rel: str | PurePosixPath) -> list[str]:
    path = PurePosixPath(rel)
    parts = list(path.parts)
    if path.is_absolute() or not parts or any(p in ("..", ".", "") for p in parts):
        raise OSError(errno.EINVAL, "not a path inside the run folder", str(rel))
    return parts


def _parent_fd(root: Path, parts: list[str]) -> int:
    """A descriptor of the folder holding the last of `parts`, walked without links."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(root: Path, rel: str | PurePosixPath) -> int:
    """A read descriptor of the regular file `rel` inside `root` (OSError otherwise: a link
    anywhere on the way is ELOOP or ENOTDIR, a FIFO or device EINVAL)."""
    parts = _parts(rel)
    parent = _parent_fd(root, parts)
    try:
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(root / rel))
    os.set_blocking(fd, True)
    return fd


def read_file(root: Path, rel: str | PurePosixPath, *, max_bytes: int = MAX_READ) -> bytes:
    """The content of the regular file `rel` inside `root`, at most `max_bytes`."""
    fd = open_regular(root, rel)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes} bytes", str(root / rel))
    return data


def stat_file(root: Path, rel: str | PurePosixPath) -> os.stat_result:
    """`fstat` of the regular file `rel` inside `root`, reached as `open_regular` does."""
    fd = open_regular(root, rel)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def make_run_dir(root: Path) -> None:
    """The run folder and its `trials/`, 0700 when made here; an existing `trials` that is
    not a folder (a link) is refused."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=DIR_MODE)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir("trials", DIR_MODE, dir_fd=fd)
        except FileExistsError:
            os.close(os.open("trials", _DIR_FLAGS, dir_fd=fd))  # a real folder, not a link
    finally:
        os.close(fd)


def write_file(root: Path, rel: str | PurePosixPath, data: bytes) -> None:
    """Replace `rel` inside `root` atomically with a new 0600 file (a link there is replaced,
    never written through)."""
    parts = _parts(rel)
    parent = _parent_fd(root, parts)
    tmp = f".{parts[-1]}.{os.getpid()}.tmp"
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            FILE_MODE, dir_fd=parent,
        )  # fmt: skip
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise
    finally:
        os.close(parent)


def append_line(root: Path, rel: str | PurePosixPath, data: bytes) -> None:
    """Append to the regular file `rel` inside `root` (made 0600), flushed to disk."""
    parts = _parts(rel)
    parent = _parent_fd(root, parts)
    try:
        fd = os.open(
            parts[-1],
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            FILE_MODE,
            dir_fd=parent,
        )
    finally:
        os.close(parent)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(root / rel))
        os.set_blocking(fd, True)
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
