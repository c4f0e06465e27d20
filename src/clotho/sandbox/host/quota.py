"""A storage quota the kernel enforces: each local sandbox's state folder is its own small
ext4 file system, loop-mounted from a sparse image.

The size of the file system is the byte limit and its inode count the file limit; a write
past either fails inside the sandbox with ENOSPC, whoever writes (root in the sandbox has no
capability on the host, and ext4's reserve is 0), and the host disk gives the sandbox no more
than its image's size. A project quota on a shared file system would cost less per sandbox,
but this kernel has no quota format for ext4 (CONFIG_QFMT_V2), no XFS quota
(CONFIG_XFS_QUOTA) and no tmpfs quota, so a file system per sandbox is what holds here.

Cost: `mkfs.ext4` runs once per (size, inode count) into a template (`TEMPLATES`); each sandbox copies the template's few written blocks into a sparse image (about
130 KB), attaches it to a free loop device (`LOOP_CONFIGURE`, autoclear) and mounts it over
its state folder with mount(2): no process is started. Removing the folder detaches the mount
(`state.detach_mounts_under`), the loop device clears itself and the image goes with the
folder underneath.

Where loop devices cannot be used (not root, no `/dev/loop-control`, no `mkfs.ext4`),
`unavailable()` says why and the caller falls back to watching the folder's size.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

IMAGE_NAME = ".clotho-disk"  # the image, in the state folder, under its own mount
# The empty file systems images are copied from: root's (only root mounts them), out of
# the state folders' parent, which belongs to the sandboxes (and the reaper).
TEMPLATES = Path("/var/lib/clotho/disk-templates")
BYTES_PER_INODE = 16384  # mke2fs's default ratio: 64 files per MB of quota
MIN_INODES = 1024
INODE_SIZE = 256
_BLOCK = 4096
# The file system is full when less than this is left (ext4 keeps a few blocks back for
# its own metadata, so a refused write can leave a little).
_FULL_SLACK = 1 << 20

_LOOP_CONTROL = "/dev/loop-control"
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
_LO_FLAGS_DIRECT_IO = 16  # no second page cache for the image on the host
_MS_NODEV = 4
_MS_PRIVATE = 1 << 18
_SEEK_DATA, _SEEK_HOLE = 3, 4
_MOUNT_DATA = b"discard,noinit_itable"  # deletes give the host its blocks back


def inodes_for(storage_bytes: int) -> int:
    """The file limit that goes with a byte limit."""
    return max(MIN_INODES, storage_bytes // BYTES_PER_INODE)


def unavailable() -> str | None:
    """Why a loop-mounted file system cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "not root (loop devices and mounts need root)"
    if not os.path.exists(_LOOP_CONTROL):
        return f"no {_LOOP_CONTROL}"
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 is missing (apt-get install e2fsprogs)"
    try:
        with open("/proc/filesystems") as f:
            if "ext4" not in f.read().split():
                return "the kernel has no ext4"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    return None


def image_bytes(storage_bytes: int, inodes: int) -> int:
    """The image's size: the byte limit plus what ext4 keeps for itself (inode tables,
    bitmaps, its reserve for delayed allocation), so about `storage_bytes` is usable."""
    reserve = min(storage_bytes // 50, 16 << 20)  # ext4's s_resv_clusters
    overhead = inodes * INODE_SIZE + reserve + storage_bytes // 256 + (4 << 20)
    return -(-(storage_bytes + overhead) // _BLOCK) * _BLOCK


def _template(folder: Path, size: int, inodes: int) -> Path:
    """An empty ext4 image of `size` bytes and `inodes` inodes, made once in `folder`
    (atomically, so concurrent sandboxes never see half of one)."""
    path = folder / f"ext4-{size}-{inodes}.img"
    if path.exists():
        return path
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".making-")
    try:
        os.ftruncate(fd, size)
        os.close(fd)
        fd = -1
        # No journal (the state dies with the sandbox), no reserve for root, inode tables
        # left unwritten (a sparse image reads as zeros, and `noinit_itable` trusts that).
        options = f"-q -F -O ^has_journal,^resize_inode -m 0 -b {_BLOCK} -I {INODE_SIZE}"
        lazy = "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0"
        subprocess.run(
            ["mkfs.ext4", *options.split(), "-N", str(inodes), "-E", lazy, tmp],
            check=True,
            capture_output=True,
            timeout=120,
        )
        os.replace(tmp, path)
    except subprocess.CalledProcessError as exc:
        raise OSError(f"mkfs.ext4 failed: {exc.stderr.decode(errors='replace').strip()}") from exc
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy only the written extents of `src` (the rest stays a hole)."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        size = os.fstat(fin.fileno()).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, _SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = os.lseek(fin.fileno(), start, _SEEK_HOLE)
            while start < end:
                try:
                    done = os.copy_file_range(
                        fin.fileno(), fout.fileno(), end - start, start, start
                    )
                except OSError as exc:  # another file system: copy by hand
                    if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP):
                        raise
                    done = os.pwrite(
                        fout.fileno(),
                        os.pread(fin.fileno(), min(end - start, 1 << 20), start),
                        start,
                    )
                if done == 0:
                    break
                start += done
            pos = end
        os.ftruncate(fout.fileno(), size)


def _loop_config(fd: int) -> bytes:
    # struct loop_config { u32 fd; u32 block_size; struct loop_info64 info; u64 reserved[8] }
    info = struct.pack(
        "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0,
        _LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO, b"", b"", b"", 0, 0,
    )  # fmt: skip
    return struct.pack("=II", fd, 0) + info + bytes(64)


def _attach(image: Path) -> tuple[int, str]:
    """A free loop device backed by `image`: (an open fd on it, its path). The device
    clears itself when the last user (the mount) lets go."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open(_LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(64):  # another process may take the free device first
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, _LOOP_CONFIGURE, _loop_config(backing))
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise
                return fd, device
        finally:
            os.close(control)
    finally:
        os.close(backing)
    raise OSError(errno.EBUSY, "no free loop device")


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount(device: str, target: Path) -> None:
    """Mount the file system, then make it private: below a shared mount (dockerd makes its
    root one; systemd makes `/` one) it would otherwise have peers in every mount namespace
    copied from this one, and a process there that detaches its copy (slirp4netns' sandbox
    does, having made only `/` private) would unmount it here too, with whatever is mounted
    on it (a container's root)."""
    if _libc.mount(device.encode(), str(target).encode(), b"ext4", _MS_NODEV, _MOUNT_DATA):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {device} on {target}: {os.strerror(err)}")
    if _libc.mount(None, str(target).encode(), None, _MS_PRIVATE, None):
        err = ctypes.get_errno()
        _detach(target)
        raise OSError(err, f"make {target} private: {os.strerror(err)}")


@dataclass(frozen=True)
class Disk:
    """A sandbox's own file system, mounted over its state folder."""

    path: Path
    device: str
    storage_bytes: int
    inodes: int

    @classmethod
    def at(cls, folder: Path, storage_bytes: int) -> Disk | None:
        """The disk of `storage_bytes` that `mount_over` mounted at `folder` (another object
        made it), or None when `folder` is no loop mount."""
        try:
            lines = Path("/proc/self/mountinfo").read_text().splitlines()
        except OSError:
            return None
        for line in reversed(lines):  # the last mount on a point is the one seen
            fields = line.split()
            if len(fields) < 10 or fields[4] != str(folder):
                continue
            rest = fields[fields.index("-") + 1 :]
            if rest[0] != "ext4" or not rest[1].startswith("/dev/loop"):
                return None
            return cls(folder, rest[1], storage_bytes, os.statvfs(folder).f_files)
        return None

    @classmethod
    def mount_over(
        cls,
        folder: Path,
        storage_bytes: int,
        inodes: int | None = None,
        *,
        templates: Path | None = None,
    ) -> Disk:
        """Mount a new file system of `storage_bytes` and `inodes` over `folder`, carrying
        what the folder holds already (its lease, empty folders made for the sandbox) and
        its owner and mode over. The empty file systems it is copied from are kept in
        `templates` (default: `TEMPLATES`)."""
        inodes = inodes or inodes_for(storage_bytes)
        size = image_bytes(storage_bytes, inodes)
        template = _template(templates or TEMPLATES, size, inodes)
        image = folder / IMAGE_NAME
        _copy_sparse(template, image)
        below = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd, device = _attach(image)
            try:
                _mount(device, folder)
            finally:
                os.close(fd)  # the mount holds the device now (or nothing does: it clears)
            try:
                _carry_over(below, folder)
            except BaseException:
                with contextlib.suppress(OSError):
                    _detach(folder)
                raise
        finally:
            os.close(below)
        return cls(folder, device, storage_bytes, inodes)

    def free(self) -> tuple[int, int]:
        """(bytes, inodes) still free to the sandbox."""
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize, st.f_favail

    def full(self) -> str | None:
        """What is used up ("bytes" or "inodes"), or None."""
        free_bytes, free_inodes = self.free()
        if free_inodes == 0:
            return "inodes"
        if free_bytes < _FULL_SLACK:
            return "bytes"
        return None


def detach(folder: Path) -> None:
    """Lazily unmount the disk at `folder` (the loop device then clears itself)."""
    _detach(folder)


def _detach(folder: Path) -> None:
    if _libc.umount2(str(folder).encode(), 2):  # MNT_DETACH
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _carry_over(below: int, folder: Path) -> None:
    """Recreate what the covered folder (open as `below`) holds in the new file system on
    top of it: folders, files, links and what overlayfs marks on them (owner, mode, extended
    attributes), e.g. a lease, empty folders made for the sandbox, or a container's
    writable layer as `docker create` left it."""
    with contextlib.suppress(OSError):
        os.rmdir(folder / "lost+found")  # an inode the sandbox does not need
    _copy_meta(os.fstat(below), f"/proc/self/fd/{below}", str(folder))
    _copy_tree(f"/proc/self/fd/{below}", str(folder), top=True)


def _copy_tree(src: str, dst: str, *, top: bool = False) -> None:
    with os.scandir(src) as entries:
        for entry in entries:
            if top and entry.name == IMAGE_NAME:
                continue
            st = entry.stat(follow_symlinks=False)
            target = os.path.join(dst, entry.name)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(target, 0o700)
                _copy_tree(entry.path, target)
            elif stat.S_ISREG(st.st_mode):
                with open(entry.path, "rb") as fin, open(target, "xb") as fout:
                    shutil.copyfileobj(fin, fout)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.path), target)
            else:  # a whiteout (0/0 character device) or another node
                os.mknod(target, st.st_mode, st.st_rdev)
            _copy_meta(st, entry.path, target)


def _copy_meta(st: os.stat_result, src: str, dst: str) -> None:
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    with contextlib.suppress(OSError):
        for name in os.listxattr(src, follow_symlinks=False):
            os.setxattr(dst, name, os.getxattr(src, name, follow_symlinks=False),
                        follow_symlinks=False)  # fmt: skip
