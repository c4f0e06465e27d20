"""The bubblewrap sandbox (sandbox/bwrap.py) with real namespaces, in both root modes."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.slow_callbacks import slow_callbacks

from clotho.errors import SandboxError
from clotho.sandbox import LocalSandboxConfig, open_sandbox, proctree
from clotho.sandbox.bwrap import XFER_MOUNT, BwrapSandbox
from clotho.sandbox.state import LEASE_FILE, STATE_PREFIX
from clotho.sandbox.transfer import read_host_file

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(
        shutil.which("bwrap") is None,
        reason="bubblewrap (bwrap) is not installed: apt-get install bubblewrap",
    ),
]

ROOT_MODES = [
    "ro",
    pytest.param(
        "overlay",
        marks=pytest.mark.skipif(os.geteuid() != 0, reason="root='overlay' needs root"),
    ),
]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def host_pids_with_argv0(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        if cmdline(int(entry)).startswith(token.encode()) and alive(int(entry)):
            found.append(int(entry))
    return found


async def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture(params=ROOT_MODES)
def root_mode(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def sandbox(root_mode: str, tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path / "state"))
    sb = await open_sandbox(config, labels={"test": "bwrap"})
    assert isinstance(sb, BwrapSandbox)
    try:
        yield sb
    finally:
        await sb.close()


# --- isolation -------------------------------------------------------------------------------


async def test_workdir_is_app(sandbox: BwrapSandbox) -> None:
    assert sandbox.workdir == "/app"
    r = await sandbox.exec("pwd")
    assert r.stdout == "/app\n"
    r = await sandbox.exec("mkdir -p sub && cd sub && pwd")
    assert r.stdout == "/app/sub\n"
    r = await sandbox.exec("pwd", cwd="sub")
    assert r.stdout == "/app/sub\n"
    r = await sandbox.exec("pwd")
    assert r.stdout == "/app\n"


async def test_environment_is_built_from_scratch(root_mode: str, tmp_path: Path) -> None:
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path), env={"MY_VAR": "v 1"})
    assert "PYTEST_CURRENT_TEST" in os.environ
    async with await open_sandbox(config) as sb:
        r = await sb.exec('echo "$MY_VAR|${PYTEST_CURRENT_TEST-unset}|$HOME|$PATH"')
    my_var, leaked, home, path = r.stdout.rstrip("\n").split("|")
    assert my_var == "v 1"
    assert leaked == "unset"
    assert home == "/root"
    assert "/usr/bin" in path.split(":")


async def _serve_once(reply: bytes) -> tuple[asyncio.Server, int, list[bytes]]:
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(b"connected")
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, port, received


CONNECT = "exec 3<>/dev/tcp/127.0.0.1/{port} && head -c 5 <&3"


async def test_network_is_off_by_default(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("cat /proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]
    server, port, received = await _serve_once(b"hello")
    try:
        r = await sandbox.exec(CONNECT.format(port=port), timeout=10)
        assert r.exit_code != 0
        assert "hello" not in r.stdout
        assert received == []
    finally:
        server.close()
        await server.wait_closed()


async def test_network_on_when_enabled(root_mode: str, tmp_path: Path) -> None:
    """With network the sandbox has its own namespace (own loopback, a tap to the outside):
    a server it starts on its loopback answers it, the host's loopback server does not."""
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path), network=True)
    server, port, received = await _serve_once(b"hello")
    try:
        async with await open_sandbox(config) as sb:
            r = await sb.exec(CONNECT.format(port=port), timeout=10)
            assert r.exit_code != 0 and received == []  # the host's 127.0.0.1 is not ours
            r = await sb.exec("cat /proc/net/dev")
            assert "tap0" in r.stdout  # the way out, through slirp4netns
            own = (
                "python3 -c \"import socket,sys;s=socket.socket();s.bind(('127.0.0.1',0));"
                "s.listen();print(s.getsockname()[1]);sys.stdout.flush();"
                "c,_=s.accept();c.sendall(b'own')\" > /tmp/port & sleep 0.5; "
                "python3 -c \"import socket;s=socket.create_connection(('127.0.0.1',"
                "int(open('/tmp/port').read())));print(s.recv(9).decode())\""
            )
            r = await sb.exec(own, timeout=10)
            assert r.stdout == "own\n", r.stderr
    finally:
        server.close()
        await server.wait_closed()


async def test_host_root_is_protected(sandbox: BwrapSandbox, root_mode: str) -> None:
    probe = f"/etc/clotho-probe-{secrets.token_hex(8)}"
    r = await sandbox.exec(f"echo inside > {probe} && cat {probe}")
    assert r.exit_code != 0
    # ro: a read-only bind; overlay: /etc is host root's, and the sandbox runs as its own uid
    assert ("Read-only file system" if root_mode == "ro" else "Permission denied") in r.stderr
    if root_mode == "overlay":  # what the sandbox's root owns in the overlay is writable
        r = await sandbox.exec("echo inside > /probe && cat /probe")
        assert r.stdout == "inside\n", r.stderr
    assert not os.path.exists(probe)
    await sandbox.close()
    assert not os.path.exists(probe)


async def test_write_file_outside_writable_areas(sandbox: BwrapSandbox, root_mode: str) -> None:
    probe = f"/usr/local/clotho-probe-{secrets.token_hex(8)}/f.bin"
    if root_mode == "ro":
        with pytest.raises(OSError, match="Read-only file system"):
            await sandbox.write_file(probe, b"x")
    else:
        await sandbox.write_file(probe, b"x")
        assert await sandbox.read_file(probe) == b"x"
    assert not os.path.exists(os.path.dirname(probe))


async def test_existing_host_file_cannot_be_changed(sandbox: BwrapSandbox, root_mode: str) -> None:
    host_file = Path(f"/var/tmp/clotho-probe-{secrets.token_hex(8)}")
    host_file.write_text("original\n")
    try:
        # A root-owned host file is not the sandbox uid's, even through the overlay.
        r = await sandbox.exec(f"echo changed > {host_file}; cat {host_file}")
        assert r.stdout == "original\n"
        r = await sandbox.exec(f"rm -f {host_file}; [ -e {host_file} ] && echo still-there")
        assert r.stdout == "still-there\n"
        assert host_file.read_text() == "original\n"
    finally:
        host_file.unlink(missing_ok=True)


async def test_tmp_is_private(sandbox: BwrapSandbox) -> None:
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="clotho-host-") as host_tmp:
        assert os.path.exists(host_tmp.name)
        r = await sandbox.exec(f"[ -e {host_tmp.name} ] && echo visible || echo hidden; ls -A /tmp")
        assert r.stdout == "hidden\n"
    r = await sandbox.exec("echo x > /tmp/inside-only && ls /tmp")
    assert r.stdout == "inside-only\n"
    assert not os.path.exists("/tmp/inside-only")


async def test_pid_namespace(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("echo $$")
    assert int(r.stdout) < 10
    r = await sandbox.exec("ls /proc | grep -c '^[0-9]'")
    assert int(r.stdout) < 10
    host_pid = os.getpid()
    r = await sandbox.exec(f"cat /proc/{host_pid}/cmdline 2>/dev/null | tr '\\0' ' '")
    own_cmdline = cmdline(host_pid).replace(b"\0", b" ").decode()
    assert r.stdout != own_cmdline
    r = await sandbox.exec("cat /proc/[0-9]*/comm")
    assert "pytest" not in r.stdout and "python" not in r.stdout


async def test_root_without_host_capabilities(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("id -u; id -g")
    assert r.stdout == "0\n0\n"
    r = await sandbox.exec("mknod /tmp/blk b 8 0")
    assert r.exit_code != 0
    assert "Operation not permitted" in r.stderr
    r = await sandbox.exec("[ -e /tmp/blk ] && echo exists || echo absent")
    assert r.stdout == "absent\n"
    r = await sandbox.exec("touch /tmp/f && chown 1234:1234 /tmp/f")
    assert r.exit_code != 0


async def test_hostname_is_private(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec("hostname")
    assert r.stdout == "clotho\n"


# --- lifecycle -------------------------------------------------------------------------------


async def test_state_dir_is_removed_on_close(root_mode: str, tmp_path: Path) -> None:
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path))
    sb = await open_sandbox(config, labels={"who": "me"})
    assert isinstance(sb, BwrapSandbox)
    assert sb.state.parent == tmp_path
    assert sb.state.name.startswith(STATE_PREFIX)
    assert '"who": "me"' in (sb.state / LEASE_FILE).read_text()
    await sb.write_file("x.txt", b"data")
    assert (sb.state / "app" / "x.txt").read_bytes() == b"data"
    await sb.read_file("x.txt")
    assert list((sb.state / "xfer").iterdir()) == []  # transfer files are cleaned up
    await sb.close()
    assert not sb.state.exists()
    assert list(tmp_path.iterdir()) == []
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_close_kills_every_process(root_mode: str, tmp_path: Path) -> None:
    sb = await open_sandbox(LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path)))
    assert isinstance(sb, BwrapSandbox)
    token = f"clotho-probe-{secrets.token_hex(6)}"
    r = await sb.exec(
        f"(exec -a {token}-bg sleep 300) & "
        f"setsid bash -c '(exec -a {token}-setsid sleep 300) & wait' >/dev/null 2>&1 & "
        "echo ok"
    )
    assert r.stdout == "ok\n"
    assert await wait_until(lambda: len(host_pids_with_argv0(token)) == 2)
    shell_pid = sb._shell.pid
    assert shell_pid is not None
    tree = [shell_pid, *proctree.descendants(shell_pid)]
    await sb.close()
    assert await wait_until(lambda: not any(alive(p) for p in tree))
    assert host_pids_with_argv0(token) == []


async def test_timeout_kills_tree_but_not_background(sandbox: BwrapSandbox) -> None:
    token = f"clotho-probe-{secrets.token_hex(6)}"
    r = await sandbox.exec(f"(exec -a {token}-bg sleep 300) & echo started")
    assert r.stdout == "started\n"
    r = await sandbox.exec(
        f"(exec -a {token}-child sleep 300) & bash -c 'exec -a {token}-grandchild sleep 300'",
        timeout=0.5,
    )
    assert r.timed_out
    assert r.exit_code == -9
    assert await wait_until(lambda: len(host_pids_with_argv0(token)) == 1)
    survivors = host_pids_with_argv0(token)
    assert cmdline(survivors[0]).startswith(f"{token}-bg".encode())
    r = await sandbox.exec("echo after")
    assert r.stdout == "after\n"


async def test_bwrap_missing_fails_closed(
    monkeypatch: pytest.MonkeyPatch, root_mode: str, tmp_path: Path
) -> None:
    monkeypatch.setattr("clotho.sandbox.bwrap.shutil.which", lambda name, *a, **k: None)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        await open_sandbox(LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


async def test_failed_start_leaves_no_state(tmp_path: Path) -> None:
    config = LocalSandboxConfig(root="ro", state_dir=str(tmp_path), workdir="/dev/null/app")
    with pytest.raises(SandboxError):
        await open_sandbox(config)
    assert list(tmp_path.iterdir()) == []


# --- files -----------------------------------------------------------------------------------


async def test_all_byte_values_round_trip(sandbox: BwrapSandbox) -> None:
    data = bytes(range(256)) * 3
    await sandbox.write_file("bytes.bin", data)
    assert await sandbox.read_file("bytes.bin") == data
    assert await sandbox.read_file("/app/bytes.bin") == data
    r = await sandbox.exec("wc -c < bytes.bin; od -An -tx1 -N4 -j254 bytes.bin")
    assert r.stdout.split() == ["768", "fe", "ff", "00", "01"]


async def test_large_random_file_round_trip(sandbox: BwrapSandbox) -> None:
    data = random.Random(1234).randbytes(5 << 20)
    await sandbox.write_file("/tmp/deep/er/big.bin", data)
    assert await sandbox.read_file("/tmp/deep/er/big.bin") == data
    r = await sandbox.exec("sha256sum < /tmp/deep/er/big.bin")
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()


async def test_file_written_inside_is_read_exactly(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec(r"printf 'no newline\000\377' > '-odd name $x'")
    assert r.exit_code == 0
    assert await sandbox.read_file("-odd name $x") == b"no newline\x00\xff"
    await sandbox.write_file('it\'s a "quoted" name', b"")
    assert await sandbox.read_file('/app/it\'s a "quoted" name') == b""


async def test_write_file_replaces_and_creates_parents(sandbox: BwrapSandbox) -> None:
    await sandbox.write_file("a/b/c.txt", b"first version, longer")
    await sandbox.write_file("a/b/c.txt", b"second")
    assert await sandbox.read_file("a/b/c.txt") == b"second"
    r = await sandbox.exec("cat a/b/c.txt")
    assert r.stdout == "second"


async def test_read_file_errors(sandbox: BwrapSandbox) -> None:
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("missing.txt")
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/no/such/dir/file")
    await sandbox.exec("mkdir -p somedir")
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("somedir")
    with pytest.raises(IsADirectoryError):
        await sandbox.read_file("/")
    with pytest.raises(IsADirectoryError):
        await sandbox.write_file("somedir", b"x")
    r = await sandbox.exec("echo still fine")
    assert r.stdout == "still fine\n"


async def test_upload_download_tree(sandbox: BwrapSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    (src / "top.txt").write_text("top\n")
    (src / "nested" / "deeper" / "leaf.txt").write_text("leaf")
    blob = bytes(range(256)) * 10
    (src / "nested" / "blob.bin").write_bytes(blob)
    (src / "script.sh").write_text("#!/bin/sh\necho run\n")
    (src / "script.sh").chmod(0o755)
    (src / "link").symlink_to("nested/deeper/leaf.txt")

    await sandbox.upload(src, "proj")
    r = await sandbox.exec(
        "cat proj/top.txt proj/nested/deeper/leaf.txt; echo; readlink proj/link; "
        "cat proj/link; echo; ./proj/script.sh"
    )
    assert r.stdout == "top\nleaf\nnested/deeper/leaf.txt\nleaf\nrun\n"
    assert await sandbox.read_file("proj/nested/blob.bin") == blob

    await sandbox.exec("echo added > proj/nested/new.txt")
    out = tmp_path / "out" / "proj"
    await sandbox.download("proj", out)
    assert (out / "top.txt").read_text() == "top\n"
    assert (out / "nested" / "deeper" / "leaf.txt").read_text() == "leaf"
    assert (out / "nested" / "blob.bin").read_bytes() == blob
    assert (out / "nested" / "new.txt").read_text() == "added\n"
    assert (out / "link").is_symlink()
    assert os.readlink(out / "link") == "nested/deeper/leaf.txt"
    assert os.access(out / "script.sh", os.X_OK)
    assert list((sandbox.state / "xfer").iterdir()) == []


async def test_upload_into_existing_dir_and_single_files(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    await sandbox.exec("mkdir -p dest && echo keep > dest/keep.txt")
    src = tmp_path / "src"
    src.mkdir()
    (src / "new.txt").write_text("new")
    await sandbox.upload(src, "/app/dest")
    r = await sandbox.exec("ls dest")
    assert r.stdout.split() == ["keep.txt", "new.txt"]

    single = tmp_path / "single.bin"
    single.write_bytes(b"\x00\x01single")
    await sandbox.upload(single, "/tmp/x/single.bin")
    assert await sandbox.read_file("/tmp/x/single.bin") == b"\x00\x01single"
    dest = tmp_path / "dl" / "single.bin"
    await sandbox.download("/tmp/x/single.bin", dest)
    assert dest.read_bytes() == b"\x00\x01single"

    with pytest.raises(FileNotFoundError):
        await sandbox.upload(tmp_path / "nope", "/app/nope")
    with pytest.raises(FileNotFoundError):
        await sandbox.download("/app/nope", tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


async def test_transfer_mount_is_internal(sandbox: BwrapSandbox) -> None:
    r = await sandbox.exec(f"ls -A {XFER_MOUNT}")
    assert r.exit_code == 0
    assert r.stdout == ""


async def test_a_failed_file_transfer_keeps_the_session_shell(sandbox: BwrapSandbox) -> None:
    """Transfers run in a subshell: their early `exit` must not end the agent's shell."""
    await sandbox.exec("export KEPT=yes; mkdir -p /tmp/here")
    with pytest.raises(FileNotFoundError):
        await sandbox.read_file("/app/missing.txt")
    with pytest.raises(IsADirectoryError):
        await sandbox.write_file("/tmp/here", b"x")
    assert (await sandbox.exec("echo $KEPT")).stdout == "yes\n"


async def test_big_files_move_without_blocking_the_loop(tmp_path: Path) -> None:
    """256 MiB in and out: reading it whole on the event loop takes over 100 ms here (every
    other rollout would wait); above 1 MiB the host side reads, writes, copies and moves in a
    thread, and nothing else in the transfer is proportional to the size on the loop. (A
    loaded machine can stall any step now and then: a blocking step is slow every time, so up
    to 3 tries.)"""
    config = LocalSandboxConfig(state_dir=str(tmp_path / "state"))
    data = os.urandom(1 << 20) * 256
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    async with await open_sandbox(config) as sandbox:
        for _ in range(3):
            (tmp_path / "downloaded.bin").unlink(missing_ok=True)
            async with slow_callbacks(0.05) as slow:
                await sandbox.write_file("/tmp/written.bin", data)
                back = await sandbox.read_file("/tmp/written.bin", max_bytes=1 << 30)
                await sandbox.upload(big, "/tmp/uploaded.bin")
                await sandbox.download("/tmp/uploaded.bin", tmp_path / "downloaded.bin")
            if not slow:
                break
        assert slow == []
        sums = await sandbox.exec("cmp /tmp/written.bin /tmp/uploaded.bin && echo same")
    assert sums.stdout == "same\n"
    assert back == data
    assert (tmp_path / "downloaded.bin").read_bytes() == data


async def test_a_planted_link_in_the_transfer_folder_is_not_followed(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    """The sandbox can swap the file it left for the host in its transfer folder; the host
    reads it without following a link (and a FIFO cannot block it)."""
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    xfer = sandbox.state / "xfer"
    (xfer / "link").symlink_to(secret)
    os.mkfifo(xfer / "fifo")
    with pytest.raises(OSError):
        await read_host_file(xfer / "link", follow_symlinks=False)
    with pytest.raises(OSError, match="not a regular file"):
        await asyncio.wait_for(read_host_file(xfer / "fifo", follow_symlinks=False), 5)
    assert await read_host_file(xfer / "link") == b"host only"  # a host path of our own
