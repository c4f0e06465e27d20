"""The kernel-enforced storage quota (sandbox/host/quota.py) on its own: a folder becomes a
loop-mounted ext4 of a byte and inode limit, with what it held carried over, and goes away
with the folder. Real loop devices and mounts (root); the sandboxes that use it are tested
in test_sandbox_limits_local.py and test_quota_docker.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from tests.sandbox_fixtures import loop_backing, mounts_at
from tests.support import wait_until, wait_until_sync

from clotho.sandbox.host import quota
from clotho.sandbox.host.state import make_state_dir, remove_state_dir

pytestmark = pytest.mark.skipif(
    quota.unavailable() is not None, reason=f"no loop-mounted file system: {quota.unavailable()}"
)


@pytest.fixture
def folder():
    """A sandbox state folder as the local backend makes it (in a folder a sandbox uid can
    pass through); removed as it removes it."""
    parent = Path(tempfile.mkdtemp(prefix="clotho-quota-test-"))
    parent.chmod(0o711)
    state = make_state_dir(str(parent), {"test": "quota"}, claim_uid=True)
    yield state
    remove_state_dir(state)
    assert not state.exists() and mounts_at(state) == []
    shutil.rmtree(parent)


def test_the_folder_becomes_a_file_system_of_the_limits(folder: Path) -> None:
    disk = quota.Disk.mount_over(folder, 64 << 20)
    assert mounts_at(folder) == [str(folder)]
    assert os.stat(folder).st_dev != os.stat(folder.parent).st_dev
    free_bytes, free_inodes = disk.free()
    assert 64 << 20 <= free_bytes <= 72 << 20  # about the limit is usable
    assert disk.inodes == quota.inodes_for(64 << 20) == 4096
    assert 4096 - 16 <= free_inodes <= 4096 + 64  # ext4 keeps a few, rounds up per group
    assert disk.full() is None
    assert quota.Disk.at(folder, 64 << 20) == disk  # found again from the mount table
    assert quota.Disk.at(folder.parent, 64 << 20) is None


def test_what_the_folder_held_is_carried_over(folder: Path) -> None:
    (folder / "app").mkdir(mode=0o700)
    os.chown(folder / "app", 1_000_000_123, 1_000_000_123)
    (folder / "diff" / "etc").mkdir(parents=True)
    (folder / "diff" / "etc" / "motd").write_text("hello\n")
    os.setxattr(folder / "diff" / "etc", "trusted.overlay.opaque", b"y")
    os.symlink("../lease.json", folder / "diff" / "link")
    os.mknod(folder / "diff" / "gone", 0o020000, os.makedev(0, 0))  # an overlay whiteout
    lease = (folder / "lease.json").read_text()
    mode = os.stat(folder).st_mode
    quota.Disk.mount_over(folder, 64 << 20)
    assert (folder / "lease.json").read_text() == lease
    assert os.stat(folder).st_mode == mode
    app = os.stat(folder / "app")
    assert (app.st_uid, app.st_mode & 0o777) == (1_000_000_123, 0o700)
    assert (folder / "diff" / "etc" / "motd").read_text() == "hello\n"
    assert os.getxattr(folder / "diff" / "etc", "trusted.overlay.opaque") == b"y"
    assert os.readlink(folder / "diff" / "link") == "../lease.json"
    assert os.stat(folder / "diff" / "gone").st_rdev == os.makedev(0, 0)
    assert not (folder / "lost+found").exists()
    assert quota.IMAGE_NAME not in os.listdir(folder)  # under the mount, out of reach


def test_writes_past_the_limits_are_refused_by_the_kernel(folder: Path) -> None:
    disk = quota.Disk.mount_over(folder, 16 << 20)
    (folder / "w").mkdir()
    os.chown(folder / "w", 1_000_000_124, 1_000_000_124)
    as_user = ["setpriv", "--reuid=1000000124", "--regid=1000000124", "--clear-groups"]
    big = subprocess.run(
        [*as_user, "fallocate", "-l", "64M", str(folder / "w" / "big")], capture_output=True
    )
    assert big.returncode != 0 and b"No space left" in big.stderr
    assert disk.full() == "bytes"
    os.unlink(folder / "w" / "big")
    assert disk.full() is None
    made = subprocess.run(
        [*as_user, "bash", "-c", 'cd "$0" && touch e{1..3000}', str(folder / "w")],
        capture_output=True,
        text=True,
    )
    assert made.returncode != 0 and "No space left on device" in made.stderr
    count = len(os.listdir(folder / "w"))
    assert 1000 - 20 <= count <= 1024 + 64  # refused at the inode limit
    assert disk.full() == "inodes"


def test_the_image_is_sparse_and_its_loop_device_goes_with_the_folder(tmp_path: Path) -> None:
    state = make_state_dir(str(tmp_path / "state"), {"test": "quota"}, claim_uid=True)
    templates = tmp_path / "templates"
    disk = quota.Disk.mount_over(state, 1 << 30, templates=templates)
    made = list(templates.iterdir())
    assert len(made) == 1 and made[0].stat().st_blocks * 512 < 4 << 20
    assert made[0].stat().st_size == quota.image_bytes(1 << 30, quota.inodes_for(1 << 30))
    assert os.listdir(tmp_path / "state") == [state.name]  # nothing else beside the folder
    assert str(state) in loop_backing(disk.device)
    remove_state_dir(state)
    assert not state.exists() and mounts_at(state) == []
    assert wait_until_sync(lambda: str(state) not in loop_backing(disk.device))


async def test_a_second_disk_reuses_the_template(tmp_path: Path) -> None:
    first = make_state_dir(str(tmp_path / "state"), {"test": "quota"}, claim_uid=True)
    second = make_state_dir(str(tmp_path / "state"), {"test": "quota"}, claim_uid=True)
    try:
        a = quota.Disk.mount_over(first, 32 << 20, templates=tmp_path / "templates")
        b = quota.Disk.mount_over(second, 32 << 20, templates=tmp_path / "templates")
        assert a.device != b.device
        assert len(list((tmp_path / "templates").iterdir())) == 1
        (first / "x").write_bytes(b"1" * 4096)
        assert not (second / "x").exists()
    finally:
        remove_state_dir(first)
        remove_state_dir(second)
    assert mounts_at(first) == [] and mounts_at(second) == []
    assert await wait_until(lambda: str(first) not in loop_backing(a.device))
