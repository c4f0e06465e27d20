"""The unsafe-local backend: the same Sandbox API, plain processes in a host temp dir."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.slow_callbacks import slow_callbacks

from clotho.errors import SandboxError
from clotho.sandbox import UnsafeLocalSandboxConfig, open_sandbox
from clotho.sandbox.state import LEASE_FILE, STATE_PREFIX
from clotho.sandbox.unsafe_local import UnsafeLocalSandbox


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


async def wait_dead(pid: int, timeout: float = 5.0) -> bool:
    """True once `pid` is gone or a zombie."""
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[UnsafeLocalSandbox]:
    config = UnsafeLocalSandboxConfig(state_dir=str(tmp_path / "state"), env={"EXTRA": "x y"})
    sb = await open_sandbox(config, labels={"k": "v"})
    assert isinstance(sb, UnsafeLocalSandbox)
    try:
        yield sb
    finally:
        await sb.close()


async def test_workdir_is_a_temp_dir(sandbox: UnsafeLocalSandbox, tmp_path: Path) -> None:
    workdir = Path(sandbox.workdir)
    assert workdir.is_dir()
    assert workdir.is_relative_to(tmp_path / "state")
    assert workdir.parent.name.startswith(STATE_PREFIX)
    assert '"k": "v"' in (workdir.parent / LEASE_FILE).read_text()
    r = await sandbox.exec("pwd")
    assert r.stdout == f"{workdir}\n"
    assert sandbox.labels == {"k": "v"}


async def test_exec_basics(sandbox: UnsafeLocalSandbox) -> None:
    r = await sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 3, False)
    r = await sandbox.exec('echo "$EXTRA|${PYTEST_CURRENT_TEST-unset}|$TMPDIR"')
    extra, leaked, tmpdir = r.stdout.rstrip("\n").split("|")
    assert extra == "x y"
    assert leaked == "unset"
    assert Path(tmpdir) == Path(sandbox.workdir).parent
    r = await sandbox.exec("mkdir -p sub && cd sub && pwd")
    assert r.stdout == f"{sandbox.workdir}/sub\n"
    r = await sandbox.exec("pwd", cwd="sub")
    assert r.stdout == f"{sandbox.workdir}/sub\n"
    r = await sandbox.exec('echo "${V-unset}"', env={"V": "1"})
    assert r.stdout == "1\n"
    r = await sandbox.exec('echo "${V-unset}"')
    assert r.stdout == "unset\n"
    r = await sandbox.exec("sleep 30", timeout=0.3)
    assert r.timed_out
    assert r.exit_code == -9


async def test_files_round_trip(sandbox: UnsafeLocalSandbox) -> None:
    data = bytes(range(256)) + random.Random(7).randbytes(100_000)
    await sandbox.write_file("a/b/data.bin", data)
    assert await sandbox.read_file("a/b/data.bin") == data
    assert (Path(sandbox.workdir) / "a" / "b" / "data.bin").read_bytes() == data
    assert await sandbox.read_file(f"{sandbox.workdir}/a/b/data.bin") == data
    r = await sandbox.exec("wc -c < a/b/data.bin")
    assert int(r.stdout) == len(data)
    await sandbox.write_file("a/b/data.bin", b"short")
    assert await sandbox.read_file("a/b/data.bin") == b"short"


async def test_read_file_errors(sandbox: UnsafeLocalSandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("missing")
    await sandbox.exec("mkdir d")
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("d")


async def test_upload_download_tree(sandbox: UnsafeLocalSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "n1" / "n2").mkdir(parents=True)
    (src / "n1" / "n2" / "leaf.txt").write_text("leaf")
    (src / "bin.dat").write_bytes(b"\x00\xff" * 100)
    (src / "link").symlink_to("n1/n2/leaf.txt")
    await sandbox.upload(src, "proj")
    r = await sandbox.exec("cat proj/n1/n2/leaf.txt; echo; readlink proj/link")
    assert r.stdout == "leaf\nn1/n2/leaf.txt\n"
    assert await sandbox.read_file("proj/bin.dat") == b"\x00\xff" * 100

    out = tmp_path / "out" / "proj"
    await sandbox.download("proj", out)
    assert (out / "n1" / "n2" / "leaf.txt").read_text() == "leaf"
    assert (out / "bin.dat").read_bytes() == b"\x00\xff" * 100
    assert os.readlink(out / "link") == "n1/n2/leaf.txt"

    single = tmp_path / "single.txt"
    single.write_text("one")
    await sandbox.upload(single, "x/single.txt")
    assert await sandbox.read_file("x/single.txt") == b"one"
    await sandbox.download("x/single.txt", tmp_path / "dl" / "single.txt")
    assert (tmp_path / "dl" / "single.txt").read_text() == "one"


async def test_close_removes_the_dir(tmp_path: Path) -> None:
    sb = await open_sandbox(UnsafeLocalSandboxConfig(state_dir=str(tmp_path)))
    assert isinstance(sb, UnsafeLocalSandbox)
    state = Path(sb.workdir).parent
    await sb.write_file("f.txt", b"x")
    r = await sb.exec("sleep 300 >/dev/null 2>&1 & echo $!")
    bg = int(r.stdout)
    assert alive(bg)
    await sb.close()
    assert not state.exists()
    assert list(tmp_path.iterdir()) == []
    assert await wait_dead(bg)
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_big_files_move_without_blocking_the_loop(
    sandbox: UnsafeLocalSandbox, tmp_path: Path
) -> None:
    """256 MiB in and out: whole-file reads, writes and copies of it take 100 ms and more
    here, so above 1 MiB they happen in a thread, never on the event loop. (A loaded machine
    can stall any step now and then: a blocking step is slow every time, so up to 3 tries.)"""
    data = os.urandom(1 << 20) * 256
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    for _ in range(3):
        (tmp_path / "downloaded.bin").unlink(missing_ok=True)
        async with slow_callbacks(0.05) as slow:
            await sandbox.write_file("written.bin", data)
            back = await sandbox.read_file("written.bin", max_bytes=1 << 30)
            await sandbox.upload(big, "uploaded.bin")
            await sandbox.download("uploaded.bin", tmp_path / "downloaded.bin")
        if not slow:
            break
    assert slow == []
    assert back == data
    assert (tmp_path / "downloaded.bin").read_bytes() == data
    assert (await sandbox.exec("cmp written.bin uploaded.bin && echo same")).stdout == "same\n"


async def test_read_file_refuses_devices_fifos_and_big_files(sandbox: UnsafeLocalSandbox) -> None:
    await sandbox.exec("ln -s /dev/zero zero; mkfifo fifo; truncate -s 1G sparse; echo -n abc > f")
    for path in ("zero", "fifo"):
        with pytest.raises(OSError) as info:
            await asyncio.wait_for(sandbox.read_file(path), 5)
        assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError, match=str(64 << 20)) as big:
        await sandbox.read_file("sparse")
    assert big.value.errno == errno.EFBIG
    assert await sandbox.read_file("f", max_bytes=3) == b"abc"
    with pytest.raises(OSError, match="limit of 2 bytes"):
        await sandbox.read_file("f", max_bytes=2)
    await sandbox.exec("mkdir d && head -c 3000 /dev/zero > d/z && ln -s /etc/passwd d/p")
    with pytest.raises(OSError) as info:
        await sandbox.download("d", Path(sandbox.state) / "out", max_bytes=2000)
    assert info.value.errno == errno.EFBIG
