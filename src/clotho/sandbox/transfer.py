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
import contextlib
import errno
import logging
import os
import shutil
import stat
import tarfile
from pathlib import Path
from typing import BinaryIO, Protocol

from clotho.sandbox.host.trees import remove_tree

log = logging.getLogger(__name__)

XFER_MOUNT = "/.clotho"
BIG_FILE = 1 << 20
# What a download may bring to the host at most unless the caller says otherwise.
DEFAULT_DOWNLOAD_LIMIT = 1 << 30

# Exit codes of the file-transfer scripts run through a sandbox's shell.
NOT_FOUND_EXIT, IS_DIR_EXIT = 80, 81


async def read_host_file(
    path: Path, *, follow_symlinks: bool = True, max_bytes: int | None = None
) -> bytes:
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
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)", str(path))
        if max_bytes is not None and info.st_size > max_bytes:
            raise too_big(str(path), max_bytes)
        limit = -1 if max_bytes is None else max_bytes + 1
        if info.st_size > BIG_FILE:
            data = await asyncio.to_thread(file.read, limit)
        else:
            data = file.read(limit)
        if max_bytes is not None and len(data) > max_bytes:
            raise too_big(str(path), max_bytes)
        return data


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


async def remove_host_tree(path: Path) -> None:
    """Remove a host tree made from a sandbox's data (a download, an unpacked payload) with
    `remove_tree`, in a thread: any depth (`shutil.rmtree` recursed once per level), folders
    the sandbox shut (chmod 000) reopened, no link followed. What stays is logged, not
    raised: this runs in a `finally` or while another error is on its way."""
    await asyncio.to_thread(_remove_quietly, path)


def _remove_quietly(path: Path) -> None:
    try:
        if os.path.lexists(path):
            remove_tree(path)
    except OSError as exc:
        log.warning("%s", exc)


# More exit codes: the target is not a regular file; it is bigger than the caller's limit.
NOT_REGULAR_EXIT, TOO_BIG_EXIT = 82, 83

_NOFOLLOW_READ = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_CHUNK = 1 << 20


def too_big(what: str, limit: int) -> OSError:
    return OSError(errno.EFBIG, f"bigger than the limit of {limit} bytes", what)


class TransferFolder(Protocol):
    """The host's side of a sandbox's transfer folder, one file by name: `XferDir` (a folder
    on this host), the ssh backend's (on the remote host, over SFTP). What it hands out is
    the regular file it meant or an error, whatever the sandbox put in its place."""

    async def write(self, name: str, data: bytes) -> None: ...

    async def read(self, name: str, max_bytes: int, what: str) -> bytes: ...

    async def copy_in(self, source: Path, name: str) -> None: ...

    async def tar_in(self, source: Path, name: str) -> None: ...

    async def copy_out(self, name: str, target: Path, max_bytes: int, what: str) -> None: ...

    async def untar_out(self, name: str, target: Path, max_bytes: int, what: str) -> None: ...

    async def remove(self, name: str) -> None: ...


class XferDir:
    """The host side of a transfer folder the sandbox can write, used only through a directory
    fd opened before the agent ran, one name deep, never following a link: the sandbox may swap
    any entry for a symlink, a FIFO or a hard link at any moment, and the host must still
    neither read nor write anything but the regular file it meant.

    Whole trees cross as one tar file (written from the host tree by `tarfile`, or made by the
    sandbox's `tar` and unpacked on the host by `unpack_tar`), so there is never a
    host-side walk through a folder the sandbox can change.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _create(self, name: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o644, dir_fd=self.fd)

    def open_regular(self, name: str, max_bytes: int, what: str) -> tuple[int, int]:
        """An fd on the regular, singly linked file `name` and its size (at most `max_bytes`)."""
        try:
            fd = os.open(name, _NOFOLLOW_READ, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):
                raise OSError(errno.EPERM, "the sandbox replaced a transfer file", what) from exc
            raise
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
                raise OSError(errno.EPERM, "the sandbox replaced a transfer file", what)
            if info.st_size > max_bytes:
                raise too_big(what, max_bytes)
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size

    async def read(self, name: str, max_bytes: int, what: str) -> bytes:
        fd, size = self.open_regular(name, max_bytes, what)
        with os.fdopen(fd, "rb") as file:
            # Never more than the limit, even if the sandbox appends meanwhile.
            if size > BIG_FILE:
                data = await asyncio.to_thread(file.read, max_bytes + 1)
            else:
                data = file.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise too_big(what, max_bytes)
        return data

    async def write(self, name: str, data: bytes) -> None:
        with os.fdopen(self._create(name), "wb") as file:
            if len(data) > BIG_FILE:
                await asyncio.to_thread(file.write, data)
            else:
                file.write(data)

    async def copy_in(self, source: Path, name: str) -> None:
        """Copy a host file into the folder (mode kept), never holding it whole in memory."""
        src_fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(src_fd, "rb") as src, os.fdopen(self._create(name), "wb") as dst:
            info = os.fstat(src.fileno())
            os.fchmod(dst.fileno(), stat.S_IMODE(info.st_mode))
            if info.st_size > BIG_FILE:
                await asyncio.to_thread(shutil.copyfileobj, src, dst, _CHUNK)
            else:
                shutil.copyfileobj(src, dst)

    async def tar_in(self, source: Path, name: str) -> None:
        """A tar of the host tree `source` (its links as links), for the sandbox to unpack."""

        def pack() -> None:
            with (
                os.fdopen(self._create(name), "wb") as file,
                tarfile.open(fileobj=file, mode="w", format=tarfile.PAX_FORMAT) as tar,
            ):
                add_tree(tar, str(source))

        await asyncio.to_thread(pack)

    async def copy_out(self, name: str, target: Path, max_bytes: int, what: str) -> None:
        """Copy the sandbox's regular file `name` to a new host file `target`."""
        fd, size = self.open_regular(name, max_bytes, what)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        with os.fdopen(fd, "rb") as src, os.fdopen(os.open(target, flags, 0o644), "wb") as dst:
            if size > BIG_FILE:
                await asyncio.to_thread(_copy_capped, src, dst, max_bytes, what)
            else:
                _copy_capped(src, dst, max_bytes, what)

    async def untar_out(self, name: str, target: Path, max_bytes: int, what: str) -> None:
        """Unpack the sandbox's tar `name` into the new host folder `target`: nothing outside
        it, no links leading out, no devices (what tarfile's `data` filter keeps out, judged
        in one pass, see `unpack_tar`), at most `max_bytes`."""
        fd, _ = self.open_regular(name, max_bytes, what)

        def unpack() -> None:
            with os.fdopen(fd, "rb") as file, tarfile.open(fileobj=file, mode="r:") as tar:
                members = tar.getmembers()
                if sum(m.size for m in members if m.isfile()) > max_bytes:
                    raise too_big(what, max_bytes)
                target.mkdir()
                unpack_tar(tar, members, target)

        await asyncio.to_thread(unpack)

    async def remove(self, name: str) -> None:
        """Delete the entry `name` (never what a link points at; a tree the sandbox made there
        is removed without following links, in a thread)."""
        try:
            info = os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            await asyncio.to_thread(_rmtree_at, self.fd, name)
        elif info.st_size > BIG_FILE:
            await asyncio.to_thread(_unlink_at, self.fd, name)
        else:
            _unlink_at(self.fd, name)


def add_tree(tar: tarfile.TarFile, top: str) -> None:
    """`tar.add(top, arcname=".")` without its recursion (one Python frame per level: a
    RecursionError past ~1,000 levels): the same members in the same order (depth first,
    names sorted), links as links. A tree deeper than a host path can name fails with
    ENAMETOOLONG."""
    stack = [(top, ".")]
    while stack:
        name, arcname = stack.pop()
        tar.add(name, arcname=arcname, recursive=False)
        if os.path.isdir(name) and not os.path.islink(name):
            for child in sorted(os.listdir(name), reverse=True):
                stack.append((os.path.join(name, child), os.path.join(arcname, child)))


PATH_MAX = 4096  # a host path at least this long names nothing (ENAMETOOLONG)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts(name: str) -> list[str] | None:
    """A member's name as components below the target (a leading `/` stripped, as tarfile's
    `data` filter does), or None when a `..` could lead out."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    return None if ".." in parts else parts


def _open_dir(root: int, parts: list[str]) -> int | None:
    """An fd (the caller's to close) on the folder `parts` below `root`, each level opened
    from the one above without following a link (missing levels made, as tar's own parents
    are), or None where a level is not a folder."""
    fd = root
    try:
        for part in parts:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o777, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != root:
                os.close(fd)
            fd = child
    except OSError as exc:
        if fd != root:
            os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
            return None
        raise
    return fd if fd != root else os.dup(root)


class _Folders:
    """Folders below the unpacking's target, reached one level at a time from the one above
    without following a link (missing levels made). The last folder reached stays open, and
    every `STRIDE`-th level above it: tar lists a tree depth first, so the next member's
    folder is a few opens away, not one per level (a system call costs ~15 us on a loaded
    host: reopening every level of a 1,400-level tree per member took 18 s), with a bounded
    number of fds whatever the depth."""

    STRIDE = 32

    def __init__(self, root: int) -> None:
        self.root = root
        self.path: list[str] = []
        self.fds: dict[int, int] = {}  # level -> fd: every STRIDE-th level, and the last

    def open(self, parts: list[str]) -> int | None:
        """An fd on the folder `parts` (borrowed: valid until the next call), or None where a
        level is not a folder."""
        common, most = 0, min(len(parts), len(self.path))
        if parts[:most] == self.path[:most]:  # the usual case, compared in C
            common = most
        while common < most and parts[common] == self.path[common]:
            common += 1
        for level in [lv for lv in self.fds if lv > common]:
            os.close(self.fds.pop(level))
        del self.path[common:]
        level = max(self.fds, default=0)
        del self.path[level:]
        fd = self.fds.get(level, self.root)
        for part in parts[level:]:
            try:
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o777, dir_fd=fd)
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EEXIST):
                    return None
                raise
            if level and level % self.STRIDE:
                os.close(self.fds.pop(level))
            level += 1
            self.fds[level] = fd = child
            self.path.append(part)
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
        self.path.clear()


def _clear(parent: int, leaf: str) -> bool:
    """Make room for a new non-folder entry `leaf`: an earlier file or link there goes (a
    later member wins, as with tar); False when a folder is there (it stays)."""
    try:
        if stat.S_ISDIR(os.lstat(leaf, dir_fd=parent).st_mode):
            return False
    except FileNotFoundError:
        return True
    os.unlink(leaf, dir_fd=parent)
    return True


def _link_stays_inside(depth: int, linkname: str) -> bool:
    """A symlink's target, judged by its text alone, cannot lead out of the target folder:
    relative, its `..` all leading (each climbs one of the `depth` real folders above the
    link, which no later member can turn into a link) and no more of them than `depth`.
    Every other component descends; a link it meets was judged the same way when made."""
    if linkname.startswith("/"):
        return False
    parts = [p for p in linkname.split("/") if p not in ("", ".")]
    ups = 0
    while ups < len(parts) and parts[ups] == "..":
        ups += 1
    return ups <= depth and ".." not in parts[ups:]


def _file_mode(mode: int) -> int:
    """tarfile's `data` filter's mode for a regular file: no high bits, no group or other
    write, no execute unless the owner's, always the owner's read and write."""
    mode &= 0o755
    if not mode & 0o100:
        mode &= ~0o111
    return mode | 0o600


def unpack_tar(tar: tarfile.TarFile, members: list[tarfile.TarInfo], target: Path) -> None:
    """Unpack `members` into the new folder `target`, keeping out what tarfile's `data`
    filter keeps out (a name leading out, a link leading out or absolute, a device or FIFO,
    ownership, high mode bits), each dropped, not failed on. Each member's name and link
    target are judged by their text, and its folder is reached by opening one level at a
    time from `target` without following a link: work in proportion to the archive's size.
    (The `data` filter resolves every member's whole path on the host: the cube of a deep
    tree's depth, over 6 minutes for 2,500 levels.) A name the host could not use as a path
    (PATH_MAX) fails the unpacking with ENAMETOOLONG. Files keep their times; folders' modes
    are ignored, as the `data` filter ignores them."""
    root = os.open(target, _DIR_FLAGS)
    folders = _Folders(root)
    room = PATH_MAX - len(os.fsencode(str(target))) - 1
    files: set[str] = set()  # regular files made here: what a hard link may name
    try:
        for member in members:
            parts = _parts(member.name)
            if not parts:
                continue  # the top folder itself, or a name leading out
            key = "/".join(parts)
            if len(os.fsencode(key)) >= room:
                raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), key[:200])
            if member.isdir():
                folders.open(parts)
                continue
            if not (member.isreg() or member.issym() or member.islnk()):
                continue  # devices, FIFOs
            if member.issym() and not _link_stays_inside(len(parts) - 1, member.linkname):
                continue
            source = _parts(member.linkname) if member.islnk() else None
            if member.islnk() and (not source or "/".join(source) not in files):
                continue  # a hard link only to a file made here
            parent = folders.open(parts[:-1])
            if parent is not None and _make(tar, member, parent, parts[-1], root, source):
                files.discard(key)
                if not member.issym():
                    files.add(key)
    finally:
        folders.close()
        os.close(root)


def _make(
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    parent: int,
    leaf: str,
    root: int,
    source: list[str] | None,
) -> bool:
    """Make one file, symlink or hard link `leaf` in the folder `parent`; False when a
    folder is in the way (it stays)."""
    if not _clear(parent, leaf):
        return False
    if member.issym():
        os.symlink(member.linkname, leaf, dir_fd=parent)
        return True
    if source is not None:
        folder = _open_dir(root, source[:-1])
        if folder is None:
            return False
        try:
            os.link(source[-1], leaf, src_dir_fd=folder, dst_dir_fd=parent,
                    follow_symlinks=False)  # fmt: skip
        finally:
            os.close(folder)
        return True
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(leaf, flags, 0o600, dir_fd=parent)
    with os.fdopen(fd, "wb") as out:
        data = tar.extractfile(member)
        if data is not None:
            shutil.copyfileobj(data, out, _CHUNK)
        out.flush()  # before the mtime: a later write would move it
        os.fchmod(out.fileno(), _file_mode(member.mode))
        with contextlib.suppress(OSError, OverflowError, ValueError):
            os.utime(out.fileno(), (member.mtime, member.mtime))
    return True


def _copy_capped(src: BinaryIO, dst: BinaryIO, max_bytes: int, what: str) -> None:
    copied = 0
    while chunk := src.read(_CHUNK):
        copied += len(chunk)
        if copied > max_bytes:
            raise too_big(what, max_bytes)
        dst.write(chunk)


def _unlink_at(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _rmtree_at(dir_fd: int, name: str) -> None:
    """Remove the tree `name` of the folder `dir_fd` with `remove_tree`, reached through the
    fd (its /proc/self/fd entry), never a path the sandbox could swap on the way."""
    _remove_quietly(Path(f"/proc/self/fd/{dir_fd}") / name)
