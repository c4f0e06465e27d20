"""Every host-side removal of a tree the sandbox made goes through `remove_tree`: the transfer
folder's `XferDir.remove`, a local sandbox's failed download, and the Ray host's unpacked or
downloaded payload folders. `shutil.rmtree` recursed once per level (RecursionError past
~1,000, which `ignore_errors` does not catch) and held one fd per level: a deep tree left
the folder behind. Each test shows first that its tree defeats `shutil.rmtree`, then that
the call site leaves nothing, and that a link in the tree is removed, never followed.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.sandbox_fixtures import requires_bwrap

from clotho.sandbox import open_sandbox
from clotho.sandbox.bwrap import BwrapSandbox
from clotho.sandbox.config import LocalSandboxConfig
from clotho.sandbox.ray.payload import remove_tree as remove_payload_tree
from clotho.sandbox.transfer import XferDir

DEPTH = 5000
DOWNLOAD_DEPTH = 1400
"""Levels of two-character names: deeper than a host path can name (PATH_MAX 4096 is reached
near 1,340), so unpacking fails with about 1,340 levels made, past what `shutil.rmtree`
could remove. No deeper: tarfile's `data` filter resolves every member's whole path, which
costs the cube of the depth (2,500 levels took over 6 minutes on a loaded host)."""
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
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep").write_text("host data")
    yield folder
    assert (folder / "keep").read_text() == "host data"


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
