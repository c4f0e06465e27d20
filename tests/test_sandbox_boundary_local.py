"""Nothing crosses the local sandbox's boundary: the transfer folder under a racing agent, reads
bounded in size and kind, downloads that never lead out, host files closed to the sandbox's
uid, and no way to the host's own services with the network on. Real bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.host.state import SANDBOX_UID_BASE, SANDBOX_UID_COUNT
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.local.netguard import guard_host_addresses, remove_guard

pytestmark = [
    pytest.mark.bwrap,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
]
ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids need root")
ROOT_MODES = ["ro", pytest.param("overlay", marks=ROOT)]


@pytest.fixture(params=ROOT_MODES)
def root_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sandbox(root_mode: str, tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    config = LocalSandboxConfig(root=root_mode, state_dir=str(tmp_path / "state"))
    sb = await open_sandbox(config)
    assert isinstance(sb, BwrapSandbox)
    try:
        yield sb
    finally:
        await sb.close()


def swapper(target: str) -> str:
    """A background loop in the sandbox replacing every entry of the transfer folder (and
    every entry inside one that is a folder) with a symlink to a host path."""
    return (
        '(while :; do for f in /.clotho/* /.clotho/*/*; do [ -e "$f" ] || [ -L "$f" ] '
        f'|| continue; rm -rf "$f" 2>/dev/null; ln -sfn {target} "$f" 2>/dev/null; done; '
        "done </dev/null >/dev/null 2>&1 &)"
    )


async def test_racing_agent_cannot_make_read_file_return_a_host_file(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    token = secrets.token_hex(16)
    secret.write_text(token)
    secret.chmod(0o600)
    await sandbox.write_file("/app/real.txt", b"real")
    await sandbox.exec(swapper(str(secret)))
    outcomes: dict[str, int] = {}
    for _ in range(150):
        try:
            data = await sandbox.read_file("/app/real.txt")
        except OSError as exc:
            outcomes["error"] = outcomes.get("error", 0) + 1
            assert token not in str(exc)
            continue
        assert token.encode() not in data
        assert data == b"real"
        outcomes["ok"] = outcomes.get("ok", 0) + 1
    # Downloads (a file, a tree) go through the same folder.
    await sandbox.exec("mkdir -p /app/tree && echo leaf > /app/tree/leaf")
    for i in range(40):
        for remote in ("/app/real.txt", "/app/tree"):
            local = tmp_path / f"dl{i}-{Path(remote).name}"
            try:
                await sandbox.download(remote, local)
            except OSError:
                outcomes["error"] = outcomes.get("error", 0) + 1
                assert not local.exists()
                continue
            for found in [local, *local.rglob("*")] if local.is_dir() else [local]:
                if found.is_file():
                    assert token not in found.read_text()
    # The race was real: the loop got in between at least now and then.
    assert outcomes.get("error", 0) > 0, outcomes


async def test_racing_agent_cannot_make_uploads_write_outside(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    outside.chmod(0o777)
    tests = tmp_path / "tests"
    for d in range(6):  # a tree wide enough that a swap lands mid-copy
        (tests / f"sub{d}").mkdir(parents=True)
        for i in range(60):
            (tests / f"sub{d}" / f"t{i}.py").write_text(f"print({i})\n")
    (tests / "test.sh").write_text("echo hi\n")
    await sandbox.exec(swapper(str(outside)))
    failures = 0
    for i in range(40):
        try:
            await sandbox.upload(tests, f"/app/t{i}")
            await sandbox.write_file(f"/app/w{i}.txt", b"w")
            await sandbox.upload(tests / "test.sh", f"/app/s{i}.sh")
        except OSError:
            failures += 1
    assert list(outside.iterdir()) == []
    assert failures > 0  # the loop did get in between


async def test_read_file_refuses_devices_fifos_and_big_files(sandbox: BwrapSandbox) -> None:
    await sandbox.exec(
        "ln -s /dev/zero /app/zero; mkfifo /app/fifo; truncate -s 1G /app/sparse; "
        "head -c 100 /dev/zero > /app/hundred"
    )
    for path in ("/app/zero", "/app/fifo", "/dev/urandom"):
        with pytest.raises(OSError) as info:
            await asyncio.wait_for(sandbox.read_file(path), 10)
        assert info.value.errno == errno.EINVAL
    with pytest.raises(OSError, match=str(64 << 20)) as big:
        await sandbox.read_file("/app/sparse")
    assert big.value.errno == errno.EFBIG
    assert await sandbox.read_file("/app/hundred", max_bytes=100) == b"\0" * 100
    with pytest.raises(OSError, match="limit of 99 bytes"):
        await sandbox.read_file("/app/hundred", max_bytes=99)
    assert list((sandbox.state / "xfer").iterdir()) == []  # nothing big left on the host


async def test_download_never_leads_out_and_is_capped(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    await sandbox.exec(
        "mkdir -p /app/d/in && echo ok > /app/d/in/f && ln -s /etc/passwd /app/d/abs && "
        "ln -s ../../../../../../etc/passwd /app/d/up && ln -s in/f /app/d/rel && "
        "mkfifo /app/d/fifo && head -c 5000 /dev/zero > /app/d/z"
    )
    local = tmp_path / "got"
    await sandbox.download("/app/d", local)
    assert (local / "in" / "f").read_text() == "ok\n"
    assert os.readlink(local / "rel") == "in/f"
    assert not (local / "abs").exists() and not (local / "abs").is_symlink()
    assert not (local / "up").exists() and not (local / "up").is_symlink()
    assert not (local / "fifo").exists()
    with pytest.raises(OSError) as info:
        await sandbox.download("/app/d", tmp_path / "small", max_bytes=4000)
    assert info.value.errno == errno.EFBIG
    assert not (tmp_path / "small").exists()
    await sandbox.exec("truncate -s 2G /app/sparse")
    with pytest.raises(OSError) as info:
        await sandbox.download("/app/sparse", tmp_path / "sparse", max_bytes=1 << 20)
    assert info.value.errno == errno.EFBIG
    assert not (tmp_path / "sparse").exists()


@ROOT
async def test_root_only_host_files_are_closed_to_the_sandbox(
    sandbox: BwrapSandbox, root_mode: str
) -> None:
    # A task stored on the host where the sandbox sees the host (/usr/local, which it keeps
    # for interpreters installed there): its hidden tests in a folder only root may enter.
    # /etc/shadow is not even there: the sandbox's /etc is its own.
    task = Path("/usr/local") / f"clotho-task-{secrets.token_hex(6)}"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test_outputs.py").write_text("SECRET = 1\n")
    task.chmod(0o700)
    try:
        r = await sandbox.exec(f"cat /etc/shadow; ls {task}; cat {task}/tests/test_outputs.py")
        assert r.exit_code != 0
        assert r.stdout == ""
        assert r.stderr.count("Permission denied") == 2, r.stderr
        assert "/etc/shadow: No such file or directory" in r.stderr
        # ... and the sandbox still works: its files, its tools, a fresh process
        r = await sandbox.exec("echo x > /app/x && cat /app/x && git --version >/dev/null && id -u")
        assert r.stdout == "x\n0\n", r.stderr
        if root_mode == "overlay":
            r = await sandbox.exec(
                "echo y > /usr/local/bin/y && echo z > /z && cat /usr/local/bin/y /z"
            )
            assert r.stdout == "y\nz\n", r.stderr
        r = await sandbox.exec_fresh(f"cat /app/x; ls {task} 2>&1", timeout=10)
        assert r.stdout.startswith("x\n") and "Permission denied" in r.stdout
        assert (
            sandbox.uid is not None and os.stat(sandbox.state / "app" / "x").st_uid == sandbox.uid
        )
    finally:
        shutil.rmtree(task)


@ROOT
@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="apt-get install slirp4netns")
async def test_network_does_not_reach_the_hosts_own_services(tmp_path: Path) -> None:
    reached: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reached.append("yes")
        writer.close()

    server = await asyncio.start_server(handle, "0.0.0.0", 0)
    port = server.sockets[0].getsockname()[1]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("10.255.255.255", 1))  # no packet: picks the host's outward address
    host_ip = probe.getsockname()[0]
    probe.close()
    config = LocalSandboxConfig(state_dir=str(tmp_path), network=True)
    try:
        async with await open_sandbox(config) as sb:
            for address in ("127.0.0.1", "10.0.2.2", host_ip):
                r = await sb.exec(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{address}/{port}'")
                assert r.exit_code != 0, address
            r = await sb.exec("ip -4 addr show tap0")
            assert "10.0.2.100" in r.stdout
        assert reached == []
    finally:
        server.close()
        await server.wait_closed()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def other_hosts() -> Iterator[tuple[str, str, str, int]]:
    """Hosts of our own in a network namespace behind a veth pair: `node` (another cluster
    node's address), `open` (an address nothing blocks) and the cloud's metadata address,
    169.254.169.254, routed into it; each with a TCP server on `port`."""
    tag = secrets.token_hex(3)
    ns, outer, inner = f"clotho-t{tag}", f"ct{tag}h", f"ct{tag}n"
    net = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(250)}"
    node, open_ = f"{net}.2", f"{net}.3"
    _ip("netns", "add", ns)
    server = None
    try:
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", ns)
        _ip("addr", "add", f"{net}.1/24", "dev", outer)
        _ip("link", "set", outer, "up")
        for address in (f"{node}/24", f"{open_}/24", "169.254.169.254/32"):
            _ip("-n", ns, "addr", "add", address, "dev", inner)
        _ip("-n", ns, "link", "set", inner, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "route", "add", "default", "dev", inner)
        _ip("route", "add", "169.254.169.254/32", "dev", outer)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", SERVER],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield node, open_, "169.254.169.254", port
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", outer], capture_output=True)  # its route too
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


SERVER = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen(64)
print(s.getsockname()[1], flush=True)
while True:
    s.accept()[0].close()
"""


@ROOT
@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="apt-get install slirp4netns")
async def test_network_reaches_neither_the_clusters_nodes_nor_the_metadata_service(
    tmp_path: Path, other_hosts: tuple[str, str, str, int]
) -> None:
    """What the Ray host actor does before a networked sandbox opens on a node: the other
    nodes' addresses join the guard. The sandbox then reaches an address outside it, but
    neither the node nor 169.254.169.254, which the host itself reaches."""
    node, open_, metadata, port = other_hosts
    config = LocalSandboxConfig(state_dir=str(tmp_path), network=True)
    await guard_host_addresses(SANDBOX_UID_BASE, SANDBOX_UID_COUNT, [node])
    try:
        async with await open_sandbox(config) as sb:

            async def reaches(address: str) -> bool:
                probe = f"timeout 10 bash -c 'exec 3<>/dev/tcp/{address}/{port}'"
                return (await sb.exec(probe)).exit_code == 0

            assert await reaches(open_), "the sandbox has no network: the test proves nothing"
            assert not await reaches(node), "the sandbox reached another node"
            assert not await reaches(metadata), "the sandbox reached the metadata service"
        for address in (node, metadata):  # there, for the host: the guard is what stops it
            _, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 30)
            writer.close()
    finally:
        await remove_guard(SANDBOX_UID_BASE, SANDBOX_UID_COUNT, [node])


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to an unprivileged user")
def test_network_without_root_is_refused() -> None:
    """Without root there is no sandbox uid for the guard to match: a networked sandbox is
    refused with a message that says what to do, never started unguarded."""
    state = Path(tempfile.mkdtemp(prefix="clotho-noroot-", dir="/tmp"))
    state.chmod(0o777)  # open to the unprivileged user: where a sandbox would have gone
    script = (
        "import asyncio\n"
        "from clotho.errors import ConfigError\n"
        "from clotho.sandbox import LocalSandboxConfig, open_sandbox\n"
        "async def main():\n"
        f"    config = LocalSandboxConfig(state_dir={str(state)!r}, network=True)\n"
        "    try:\n"
        "        await open_sandbox(config)\n"
        "    except ConfigError as exc:\n"
        "        print('refused:', exc)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(state)},
    )  # fmt: skip
    try:
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("refused: network=True on the local backend needs root")
        assert "without --network" in done.stdout
        assert list(state.iterdir()) == [], "a sandbox was started"
    finally:
        shutil.rmtree(state)
