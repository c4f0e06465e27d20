"""Every host-side removal of a tree the sandbox made goes through `remove_tree`: the transfer
folder's `XferDir.remove`, a local sandbox's failed download, and the Ray host's unpacked or
downloaded payload folders. `shutil.rmtree` recursed once per level (RecursionError past
~1,000, which `ignore_errors` does not catch) and held one fd per level: a deep tree left
the folder behind. Each test shows first that its tree defeats `shutil.rmtree`, then that
the call site leaves nothing, and that a link in the tree is removed, never followed.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.sandbox_fixtures import outside_folder, requires_bwrap

from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.ray.payload import pack, unpack
from clotho.sandbox.ray.payload import remove_tree as remove_payload_tree
from clotho.sandbox.transfer import XferDir

DEPTH = 5000
DOWNLOAD_DEPTH = 1400
"""Levels of two-character names: deeper than a host path can name (PATH_MAX 4096 is reached
near 1,340), so unpacking fails with about 1,340 levels made, past what `shutil.rmtree`
could remove. (The unpacking costs in proportion to the tar's size; with tarfile's `data`
filter it cost the cube of the depth: 1,400 levels took 170-280 s on a loaded host.)"""
AGENT_WORK = 300.0  # thousands of journalled mkdirs on a loaded disk


def make_deep(parent_fd: int, name: str, depth: int = DEPTH) -> None:
    """`name/d/d/...` `depth` levels deep, made through fds (the path is far past PATH_MAX),
    with a chmod 000 folder holding a file at the top and one at the bottom."""
    os.mkdir(name, dir_fd=parent_fd)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent_fd)
    top = os.dup(fd)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        for folder in (fd, top):
            os.mkdir("shut", dir_fd=folder)
            with open(os.open("shut/f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder), "w") as f:
                f.write("x")
            os.chmod("shut", 0, dir_fd=folder)
    finally:
        os.close(fd)
        os.close(top)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A host folder a link in the tree points at: removal must not follow it."""
    with outside_folder(tmp_path) as folder:
        yield folder


def force_remove(path: Path) -> None:
    """What a failed test leaves, removed with tools that cope (not the code under test)."""
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False, capture_output=True)
    subprocess.run(["rm", "-rf", str(path)], check=False)


def test_the_deep_tree_defeats_shutil_rmtree(tmp_path: Path) -> None:
    """The shape the call sites get: `shutil.rmtree(..., ignore_errors=True)` raises and leaves
    the tree (so the tests below would fail with it)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        make_deep(fd, "tree")
        with pytest.raises((RecursionError, OSError)):
            shutil.rmtree("tree", dir_fd=fd, ignore_errors=True)
        assert os.path.lexists(tmp_path / "tree")
    finally:
        os.close(fd)
        force_remove(tmp_path / "tree")


async def test_xfer_remove_takes_a_deep_tree_through_its_fd(tmp_path: Path, outside: Path) -> None:
    folder = tmp_path / "xfer"
    folder.mkdir()
    xfer = XferDir(folder)
    try:
        make_deep(xfer.fd, "tree")
        os.symlink(outside, "tree/escape", dir_fd=xfer.fd)
        os.symlink(outside, "linked", dir_fd=xfer.fd)
        await xfer.remove("tree")
        await xfer.remove("linked")  # the link goes, not what it points at
        assert os.listdir(folder) == []
    finally:
        xfer.close()
        force_remove(folder)


async def test_ray_payload_folders_are_removed_whatever_their_depth(
    tmp_path: Path, outside: Path
) -> None:
    folder = tmp_path / "clotho-ray-down-x"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        make_deep(fd, "x")
        os.symlink(outside, "x/escape", dir_fd=fd)
    finally:
        os.close(fd)
    try:
        await remove_payload_tree(folder)
        assert not os.path.lexists(folder)
        await remove_payload_tree(folder)  # already gone: nothing to do, no error
    finally:
        force_remove(folder)


@requires_bwrap
async def test_a_failed_download_of_a_deep_tree_leaves_nothing_on_the_host(
    tmp_path: Path, outside: Path
) -> None:
    """The agent's tree is deeper than a host path can name: unpacking it fails past PATH_MAX
    (~1,340 levels already made on the host) and the download removes what it unpacked; the
    caller sees the unpacking error, not a RecursionError from the clean-up."""
    sb = await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path / "state")), {})
    assert isinstance(sb, BwrapSandbox)
    local = tmp_path / "downloaded"
    try:
        deep = (
            "import os\nos.mkdir('deep'); os.chdir('deep')\n"
            f"for _ in range({DOWNLOAD_DEPTH}):\n    os.mkdir('dd'); os.chdir('dd')\n"
        )
        made = await sb.exec(
            f'python3 -c "{deep}" && ln -s {outside} deep/escape && echo made',
            timeout=AGENT_WORK,
        )
        assert made.exit_code == 0 and made.stdout.strip() == "made", made
        with pytest.raises(OSError) as raised:
            await sb.download("deep", local)
        # the host path ran out: ~1,340 levels were made before clean-up had to remove them
        assert raised.value.errno == errno.ENAMETOOLONG, raised.value
        assert not os.path.lexists(local)
        assert set(os.listdir(tmp_path)) == {"state", "outside"}
    finally:
        await sb.close()
        force_remove(local)


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "", data: bytes = b"x",
           mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:  # fmt: skip
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


async def test_untar_out_keeps_every_way_out_out(tmp_path: Path, outside: Path) -> None:
    """What tarfile's `data` filter kept out, judged by names and link texts alone: names
    leading out, absolute or escaping links (a `..` behind a link made just before
    included), hard links to anything but a file of the tar, devices, FIFOs, a member
    under a link (never followed), setuid bits; what stays inside is unpacked."""
    up = os.path.relpath(outside / "keep", tmp_path / "got")
    members = [
        member("ok/f", data=b"inside"),
        member("/abs", data=b"slash stripped"),
        member("../escaped"),
        member("ok/../../escaped2"),
        member("here", tarfile.SYMTYPE, "."),
        member("via", tarfile.SYMTYPE, "here/.."),  # lexically ".", really the parent
        member("up", tarfile.SYMTYPE, up),
        member("absl", tarfile.SYMTYPE, str(outside / "keep")),
        member("ok/rel", tarfile.SYMTYPE, "../ok/f"),
        member("ok/deep", tarfile.SYMTYPE, "../../outside/keep"),
        member("ok/out", tarfile.SYMTYPE, str(outside)),
        member("ok/self", tarfile.SYMTYPE, "."),  # inside: kept, but never followed
        member("ok/self/planted", data=b"through a link"),
        member("hard", tarfile.LNKTYPE, "ok/f"),
        member("hardout", tarfile.LNKTYPE, "../outside/keep"),
        member("fifo", tarfile.FIFOTYPE),
        member("dev", tarfile.CHRTYPE),
        member("suid", data=b"#!/bin/sh", mode=0o4777),
    ]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    folder = tmp_path / "xfer"
    folder.mkdir()
    (folder / "t.tar").write_bytes(buffer.getvalue())
    xfer = XferDir(folder)
    got = tmp_path / "got"
    try:
        await xfer.untar_out("t.tar", got, 1 << 20, "t")
    finally:
        xfer.close()
    assert sorted(os.listdir(got)) == ["abs", "hard", "here", "ok", "suid"]
    assert sorted(os.listdir(got / "ok")) == ["f", "rel", "self"]
    assert (got / "ok" / "rel").read_bytes() == b"inside"
    assert (got / "hard").read_bytes() == b"inside" and (got / "hard").stat().st_nlink == 2
    assert (got / "abs").read_bytes() == b"slash stripped"
    assert stat.S_IMODE((got / "suid").stat().st_mode) == 0o755
    assert sorted(os.listdir(tmp_path)) == ["got", "outside", "xfer"]
    assert os.listdir(outside) == ["keep"]


PACK_DEPTH = 1200  # past tarfile.add's RecursionError (~1,000), short of PATH_MAX here


async def test_a_ray_payload_of_a_deep_tree_packs_and_unpacks(tmp_path: Path) -> None:
    """`tar.add` recursed once per level: a deep tree failed to pack (RecursionError)."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        make_deep(fd, "tree", depth=PACK_DEPTH)
    finally:
        os.close(fd)
    back = tmp_path / "back"
    try:
        kind, data = await pack(tmp_path / "tree")
        assert kind == "tar"
        await unpack((kind, data), back)
        bottom = back.joinpath(*["d"] * PACK_DEPTH)
        os.chmod(bottom / "shut", 0o700)
        assert (bottom / "shut" / "f").read_text() == "x"
    finally:
        await remove_payload_tree(back)
        await remove_payload_tree(tmp_path / "tree")
