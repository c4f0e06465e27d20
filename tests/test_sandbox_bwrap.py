"""The bubblewrap sandbox (sandbox/local/bwrap.py) with real namespaces, in both root modes."""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from pathlib import Path

import pytest
from tests.sandbox_fixtures import alive, cmdline, pids_with_argv0, requires_bwrap, run_past_timeout
from tests.support import PATIENCE_S, wait_until

from clotho.errors import SandboxError
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.base import ExecResult
from clotho.sandbox.host import proctree
from clotho.sandbox.host.leases import LEASE_FILE, STATE_PREFIX
from clotho.sandbox.local.bwrap import XFER_MOUNT, BwrapSandbox
from clotho.sandbox.transfer import read_host_file

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = [pytest.mark.bwrap, requires_bwrap]


# --- isolation -------------------------------------------------------------------------------


async def test_workdir_is_app(bwrap_sandbox: BwrapSandbox) -> None:
    assert bwrap_sandbox.workdir == "/app"
    r = await bwrap_sandbox.exec("pwd")
    assert r.stdout == "/app\n"
    r = await bwrap_sandbox.exec("mkdir -p sub && cd sub && pwd")
    assert r.stdout == "/app/sub\n"
    r = await bwrap_sandbox.exec("pwd", cwd="sub")
    assert r.stdout == "/app/sub\n"
    r = await bwrap_sandbox.exec("pwd")
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


async def test_network_is_off_by_default(bwrap_sandbox: BwrapSandbox) -> None:
    r = await bwrap_sandbox.exec("cat /proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]
    server, port, received = await _serve_once(b"hello")
    try:
        r = await bwrap_sandbox.exec(CONNECT.format(port=port), timeout=10)
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
                "c,_=s.accept();c.sendall(b'own')\" > /tmp/port & "
                "until [ -s /tmp/port ]; do sleep 0.01; done; "
                "python3 -c \"import socket;s=socket.create_connection(('127.0.0.1',"
                "int(open('/tmp/port').read())));print(s.recv(9).decode())\""
            )
            r = await sb.exec(own, timeout=10)
            assert r.stdout == "own\n", r.stderr
    finally:
        server.close()
        await server.wait_closed()


async def test_host_root_is_protected(bwrap_sandbox: BwrapSandbox, root_mode: str) -> None:
    probe = f"/etc/clotho-probe-{secrets.token_hex(8)}"
    r = await bwrap_sandbox.exec(f"echo inside > {probe} && cat {probe}")
    assert r.exit_code != 0
    # ro: a read-only bind; overlay: /etc is host root's, and the sandbox runs as its own uid
    assert ("Read-only file system" if root_mode == "ro" else "Permission denied") in r.stderr
    if root_mode == "overlay":  # what the sandbox's root owns in the overlay is writable
        r = await bwrap_sandbox.exec("echo inside > /probe && cat /probe")
        assert r.stdout == "inside\n", r.stderr
    assert not os.path.exists(probe)
    await bwrap_sandbox.close()
    assert not os.path.exists(probe)


async def test_write_file_outside_writable_areas(
    bwrap_sandbox: BwrapSandbox, root_mode: str
) -> None:
    probe = f"/usr/local/clotho-probe-{secrets.token_hex(8)}/f.bin"
    if root_mode == "ro":
        with pytest.raises(OSError, match="Read-only file system"):
            await bwrap_sandbox.write_file(probe, b"x")
    else:
        await bwrap_sandbox.write_file(probe, b"x")
        assert await bwrap_sandbox.read_file(probe) == b"x"
    assert not os.path.exists(os.path.dirname(probe))


async def test_existing_host_file_cannot_be_changed(
    bwrap_sandbox: BwrapSandbox, root_mode: str
) -> None:
    # In a system tree the sandbox sees (/var/tmp, say, is a private tmpfs inside).
    host_file = Path(f"/usr/share/clotho-probe-{secrets.token_hex(8)}")
    host_file.write_text("original\n")
    try:
        # A root-owned host file is not the sandbox uid's, even through the overlay.
        r = await bwrap_sandbox.exec(f"echo changed > {host_file}; cat {host_file}")
        assert r.stdout == "original\n"
        r = await bwrap_sandbox.exec(f"rm -f {host_file}; [ -e {host_file} ] && echo still-there")
        assert r.stdout == "still-there\n"
        assert host_file.read_text() == "original\n"
    finally:
        host_file.unlink(missing_ok=True)


async def test_tmp_is_private(bwrap_sandbox: BwrapSandbox) -> None:
    with tempfile.NamedTemporaryFile(dir="/tmp", prefix="clotho-host-") as host_tmp:
        assert os.path.exists(host_tmp.name)
        r = await bwrap_sandbox.exec(
            f"[ -e {host_tmp.name} ] && echo visible || echo hidden; ls -A /tmp"
        )
        assert r.stdout == "hidden\n"
    r = await bwrap_sandbox.exec("echo x > /tmp/inside-only && ls /tmp")
    assert r.stdout == "inside-only\n"
    assert not os.path.exists("/tmp/inside-only")


async def test_pid_namespace(bwrap_sandbox: BwrapSandbox) -> None:
    r = await bwrap_sandbox.exec("echo $$")
    assert int(r.stdout) < 10
    r = await bwrap_sandbox.exec("ls /proc | grep -c '^[0-9]'")
    assert int(r.stdout) < 10
    host_pid = os.getpid()
    r = await bwrap_sandbox.exec(f"cat /proc/{host_pid}/cmdline 2>/dev/null | tr '\\0' ' '")
    own_cmdline = cmdline(host_pid).replace(b"\0", b" ").decode()
    assert r.stdout != own_cmdline
    r = await bwrap_sandbox.exec("cat /proc/[0-9]*/comm")
    assert "pytest" not in r.stdout and "python" not in r.stdout


async def test_root_without_host_capabilities(bwrap_sandbox: BwrapSandbox) -> None:
    r = await bwrap_sandbox.exec("id -u; id -g")
    assert r.stdout == "0\n0\n"
    r = await bwrap_sandbox.exec("mknod /tmp/blk b 8 0")
    assert r.exit_code != 0
    assert "Operation not permitted" in r.stderr
    r = await bwrap_sandbox.exec("[ -e /tmp/blk ] && echo exists || echo absent")
    assert r.stdout == "absent\n"
    r = await bwrap_sandbox.exec("touch /tmp/f && chown 1234:1234 /tmp/f")
    assert r.exit_code != 0


async def test_hostname_is_private(bwrap_sandbox: BwrapSandbox) -> None:
    r = await bwrap_sandbox.exec("hostname")
    assert r.stdout == "clotho\n"


# --- lifecycle -------------------------------------------------------------------------------


async def test_state_dir_is_removed_on_close(root_mode: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = LocalSandboxConfig(root=root_mode, state_dir=str(state))
    sb = await open_sandbox(config, labels={"who": "me"})
    assert isinstance(sb, BwrapSandbox)
    assert sb.state.parent == state
    assert sb.state.name.startswith(STATE_PREFIX)
    assert '"who": "me"' in (sb.state / LEASE_FILE).read_text()
    await sb.write_file("x.txt", b"data")
    assert (sb.state / "app" / "x.txt").read_bytes() == b"data"
    await sb.read_file("x.txt")
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "f").write_text("f")
    await sb.upload(tmp_path / "tree", "tree")
    await sb.download("tree", tmp_path / "back")
    assert list((sb.state / "xfer").iterdir()) == []  # transfer files are cleaned up
    await sb.close()
    assert not sb.state.exists()
    assert list(state.iterdir()) == []
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
    assert await wait_until(lambda: len(pids_with_argv0(token)) == 2)
    shell_pid = sb._shell.pid
    assert shell_pid is not None
    tree = [shell_pid, *proctree.descendants(shell_pid)]
    await sb.close()
    assert await wait_until(lambda: not any(alive(p) for p in tree))
    assert pids_with_argv0(token) == []


async def test_timeout_kills_tree_but_not_background(bwrap_sandbox: BwrapSandbox) -> None:
    token = f"clotho-probe-{secrets.token_hex(6)}"
    r = await bwrap_sandbox.exec(f"(exec -a {token}-bg sleep 300) & echo started")
    assert r.stdout == "started\n"
    started = bwrap_sandbox.state / "app" / "started"

    async def run(timeout: float) -> ExecResult:
        started.unlink(missing_ok=True)
        return await bwrap_sandbox.exec(
            f"(echo >> started; exec -a {token}-child sleep 300) & "
            f"bash -c 'echo >> started; exec -a {token}-grandchild sleep 300'",
            timeout=timeout,
        )

    r = await run_past_timeout(run, lambda: started.exists() and started.read_text() == "\n\n")
    assert r.timed_out
    assert r.exit_code == -9
    assert await wait_until(lambda: len(pids_with_argv0(token)) == 1)
    survivors = pids_with_argv0(token)
    assert cmdline(survivors[0]).startswith(f"{token}-bg".encode())
    r = await bwrap_sandbox.exec("echo after")
    assert r.stdout == "after\n"


async def test_bwrap_missing_fails_closed(
    monkeypatch: pytest.MonkeyPatch, root_mode: str, tmp_path: Path
) -> None:
    monkeypatch.setattr("clotho.sandbox.local.bwrap.shutil.which", lambda name, *a, **k: None)
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        await open_sandbox(LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path)))
    assert list(tmp_path.iterdir()) == []


async def test_failed_start_leaves_no_state(tmp_path: Path) -> None:
    config = LocalSandboxConfig(root="ro", state_dir=str(tmp_path), workdir="/dev/null/app")
    with pytest.raises(SandboxError):
        await open_sandbox(config)
    assert list(tmp_path.iterdir()) == []


# --- files -----------------------------------------------------------------------------------


async def test_transfer_mount_is_internal(bwrap_sandbox: BwrapSandbox) -> None:
    r = await bwrap_sandbox.exec(f"ls -A {XFER_MOUNT}")
    assert r.exit_code == 0
    assert r.stdout == ""


async def test_a_planted_link_in_the_transfer_folder_is_not_followed(
    bwrap_sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    """The sandbox can swap the file it left for the host in its transfer folder; the host
    reads it without following a link (and a FIFO cannot block it)."""
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    xfer = bwrap_sandbox.state / "xfer"
    (xfer / "link").symlink_to(secret)
    os.mkfifo(xfer / "fifo")
    with pytest.raises(OSError):
        await read_host_file(xfer / "link", follow_symlinks=False)
    with pytest.raises(OSError, match="not a regular file"):
        await asyncio.wait_for(read_host_file(xfer / "fifo", follow_symlinks=False), PATIENCE_S)
    assert await read_host_file(xfer / "link") == b"host only"  # a host path of our own
