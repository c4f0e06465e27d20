"""Digests read from the host through the container's root, when the daemon is local.

Asking the Engine API costs a mount of the container per request (about 34 ms here, and
serialised per container): 230 programs took 8 s. A local daemon's container is visible from
the host as `/proc/<its pid 1>/root`; every path is opened relative to that with
`openat2(RESOLVE_IN_ROOT)`, so links (absolute ones included) resolve inside the container
and never onto the host, and the last component is never followed (`O_NOFOLLOW`). Nothing
runs in the container; a file is hashed in 1 MiB chunks. The digests have the same form as
`archive.path_digest`'s.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import posixpath
import stat
from collections.abc import Callable

_SYS_OPENAT2 = 437  # x86_64 and aarch64
_RESOLVE_NO_MAGICLINKS, _RESOLVE_IN_ROOT = 0x02, 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2_in_root(root_fd: int, path: str, flags: int) -> int:
    """Open `path` as if `root_fd` were `/` (links cannot leave it)."""
    how = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(
        _SYS_OPENAT2, ctypes.c_int(root_fd), os.fsencode(path), ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )  # fmt: skip
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


def open_root(pid: int) -> int | None:
    """An fd of the container's root seen from the host, or None (not local, no openat2)."""
    try:
        fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.close(openat2_in_root(fd, "/", os.O_PATH))
    except OSError:
        os.close(fd)
        return None
    return fd


_MISSING = (errno.ENOENT, errno.ENOTDIR)


def host_digest(
    root_fd: int, path: str, outer: Callable[[str], str | None], max_bytes: int, hops: int = 0
) -> str | None:
    """The digest of `path` (as the sandbox sees it, `outer` mapping it to the container's),
    in the form of `archive.path_digest`."""
    where = outer(path)
    if where is None:
        return None
    try:
        fd = openat2_in_root(root_fd, where, os.O_PATH | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in _MISSING or exc.errno == errno.ELOOP:
            return None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISLNK(info.st_mode):
            link = os.readlink("", dir_fd=fd)
        elif stat.S_ISDIR(info.st_mode):
            return "dir"
        elif not stat.S_ISREG(info.st_mode):
            kind = {stat.S_IFCHR: "3", stat.S_IFBLK: "4", stat.S_IFIFO: "6"}
            return f"type:{kind.get(stat.S_IFMT(info.st_mode), 's')}"
        elif info.st_size > max_bytes:
            return f"size:{info.st_size}"
        else:
            return f"sha256:{_hash(fd)}:{info.st_mode & 0o7777:o}"
    finally:
        os.close(fd)
    if hops >= 40:
        return f"link:{link}=loop"
    target = posixpath.normpath(posixpath.join(posixpath.dirname(path), link))
    return f"link:{link}={host_digest(root_fd, target, outer, max_bytes, hops + 1)}"


def _hash(path_fd: int) -> str:
    fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def host_digests(
    pid: int, paths: list[str], outer: Callable[[str], str | None], max_bytes: int = 8 << 30
) -> dict[str, str | None] | None:
    """Every path's digest through `/proc/<pid>/root`; None when that cannot be used."""
    root = open_root(pid)
    if root is None:
        return None
    try:
        return {p: host_digest(root, p, outer, max_bytes) for p in paths}
    finally:
        os.close(root)
