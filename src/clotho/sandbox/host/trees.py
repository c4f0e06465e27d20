"""Removing what an agent left: a sandbox's folder, however deep, locked or mounted over.


`shutil.rmtree` recurses once per directory level (a 1,500-level tree raised RecursionError,
which `ignore_errors` does not catch) and gives up on what it cannot unlink. `remove_tree`
walks with one open directory at a time and a stack of (name, device, inode) per level,
climbing back through ".." and checking the inode it lands on; it never follows a link,
never crosses into another file system, makes the directories the agent closed (chmod 000)
its own again, clears immutable and append-only flags, and detaches mounts left under the
folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_STUCK_FLAGS = 0x10 | 0x20  # FS_IMMUTABLE_FL, FS_APPEND_FL
_MNT_DETACH = 2
_MAX_ERRORS = 8


@dataclass
class _Level:
    name: str
    dev: int
    ino: int
    pending: list[str] | None = None  # subfolders not yet emptied (None: not listed yet)


@dataclass
class _Removal:
    errors: list[str] = field(default_factory=list)

    def failed(self, what: str, exc: OSError) -> None:
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append(f"{what}: {exc.strerror or exc}")


def remove_tree(path: Path) -> None:
    """Remove `path` and everything under it, whatever shape, mode, flag or mount the agent
    left; raises OSError naming what stayed (after removing everything else it could)."""
    path = Path(os.path.abspath(path))
    removal = _Removal()
    detach_mounts_under(path)
    parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _remove_at(parent_fd, path.name, removal)
    finally:
        os.close(parent_fd)
    if os.path.lexists(path):
        raise OSError(errno.ENOTEMPTY, f"could not remove {path}: {'; '.join(removal.errors)}")


def _remove_at(parent_fd: int, name: str, removal: _Removal) -> None:
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        _unlink(parent_fd, name, removal)
        return
    fd = _enter(parent_fd, name, removal)
    if fd < 0:
        return
    top = os.fstat(fd)
    levels = [_Level(name, top.st_dev, top.st_ino)]
    try:
        while levels:
            level = levels[-1]
            if level.pending is None:
                level.pending = _clear_entries(fd, level.dev, removal)
            if level.pending:
                child = level.pending.pop()
                child_fd = _enter(fd, child, removal)
                if child_fd < 0:
                    continue
                child_st = os.fstat(child_fd)
                if child_st.st_dev != level.dev:  # a mount the first detach did not see
                    os.close(child_fd)
                    removal.failed(child, OSError(errno.EXDEV, "another file system"))
                    continue
                os.close(fd)
                fd = child_fd
                levels.append(_Level(child, child_st.st_dev, child_st.st_ino))
                continue
            levels.pop()
            if not levels:
                break
            up = os.open("..", _DIR_OPEN, dir_fd=fd)
            up_st = os.fstat(up)
            if (up_st.st_dev, up_st.st_ino) != (levels[-1].dev, levels[-1].ino):
                os.close(up)  # moved under us (nothing should run any more): stop here
                removal.failed(level.name, OSError(errno.ESTALE, "folder moved during removal"))
                return
            os.close(fd)
            fd = up
            _rmdir(fd, level.name, removal)
    finally:
        os.close(fd)
    _rmdir(parent_fd, name, removal)


def _clear_entries(fd: int, dev: int, removal: _Removal) -> list[str]:
    """Unlink every non-folder and every empty folder in `fd`; the folders left to empty."""
    pending: list[str] = []
    _make_own(fd)
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                _unlink(fd, entry.name, removal)
                continue
            try:
                os.rmdir(entry.name, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    _detach_at(fd, entry.name)
                if exc.errno != errno.ENOENT:
                    pending.append(entry.name)
    return pending


def _enter(fd: int, name: str, removal: _Removal) -> int:
    """`name` in `fd` opened as a folder without following a link; made readable and
    searchable if the agent took that away. -1 when it is not a folder (then unlinked)."""
    try:
        return os.open(name, _DIR_OPEN, dir_fd=fd)
    except PermissionError:
        pass
    except (NotADirectoryError, OSError) as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            _unlink(fd, name, removal)
        elif exc.errno != errno.ENOENT:
            removal.failed(name, exc)
        return -1
    try:
        path_fd = os.open(
            name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd
        )
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the inode held, not a path
        finally:
            os.close(path_fd)
        return os.open(name, _DIR_OPEN, dir_fd=fd)
    except OSError as exc:
        removal.failed(name, exc)
        return -1


def _make_own(fd: int) -> None:
    """Give the owner back read, write and search on a folder the agent closed."""
    with contextlib.suppress(OSError):
        mode = os.fstat(fd).st_mode
        if mode & 0o700 != 0o700:
            os.fchmod(fd, stat.S_IMODE(mode) | 0o700)


def _unlink(fd: int, name: str, removal: _Removal) -> None:
    _remove_entry(os.unlink, fd, name, removal)


def _rmdir(fd: int, name: str, removal: _Removal) -> None:
    _remove_entry(os.rmdir, fd, name, removal)


def _remove_entry(remove: Callable[..., None], fd: int, name: str, removal: _Removal) -> None:
    """`remove` (`os.unlink`, `os.rmdir`) the entry `name` in `fd`, one already gone being
    no error; after what can be undone, once more: EBUSY (a mount on it: detached), EPERM
    or EACCES (flags, a folder not writable: cleared). A failure is recorded, not raised."""
    for last in (False, True):
        try:
            remove(name, dir_fd=fd)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if not last and exc.errno == errno.EBUSY:
                _detach_at(fd, name)
            elif not last and exc.errno in (errno.EPERM, errno.EACCES):
                _unstick(fd, name)
            else:
                removal.failed(name, exc)
                return


def _unstick(fd: int, name: str) -> None:
    """After EPERM/EACCES: clear immutable/append-only on the entry and on its folder (root
    only can), and make the folder writable again."""
    _clear_flags(fd)
    _make_own(fd)
    with contextlib.suppress(OSError):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
            entry = os.open(name, flags, dir_fd=fd)
            try:
                if (os.fstat(entry).st_ino, os.fstat(entry).st_dev) == (st.st_ino, st.st_dev):
                    _clear_flags(entry)
            finally:
                os.close(entry)


def _clear_flags(fd: int) -> None:
    with contextlib.suppress(OSError):
        buf = bytearray(4)
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, buf, True)
        (flags,) = struct.unpack("=i", buf)
        if flags & _STUCK_FLAGS:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("=i", flags & ~_STUCK_FLAGS))


def _detach(path: str) -> bool:
    try:
        umount2 = ctypes.CDLL(None, use_errno=True).umount2
    except (OSError, AttributeError):
        return False
    return bool(umount2(os.fsencode(path), _MNT_DETACH) == 0)


def _detach_at(fd: int, name: str) -> None:
    """Lazily unmount what is mounted on `name` in `fd`, reached through the inode held."""
    with contextlib.suppress(OSError):
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            _detach(f"/proc/self/fd/{path_fd}")
        finally:
            os.close(path_fd)


def _unescape_mount(field: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def detach_mounts_under(path: Path) -> int:
    """Lazily unmount (MNT_DETACH) every mount at or below `path` in this mount namespace,
    deepest first, so removing the folder never reaches into another file system."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return 0
    real = os.path.realpath(path)
    prefix = real.rstrip("/") + "/"
    points = {
        point
        for point in (_unescape_mount(line.split()[4]) for line in lines if len(line.split()) > 4)
        if point == real or point.startswith(prefix)
    }
    detached = 0
    for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
        for _ in range(64):  # stacked mounts come off one at a time
            if not _detach(point):
                break
            detached += 1
    return detached
