"""The unsafe-local backend: the same Sandbox API, plain processes in a host temp dir."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tests.sandbox_fixtures import alive, wait_dead

from clotho.errors import SandboxError
from clotho.sandbox import UnsafeLocalSandboxConfig, open_sandbox
from clotho.sandbox.host.leases import LEASE_FILE, STATE_PREFIX
from clotho.sandbox.local.unsafe_local import UnsafeLocalSandbox

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures


async def test_workdir_is_a_temp_dir(unsafe_sandbox: UnsafeLocalSandbox, tmp_path: Path) -> None:
    workdir = Path(unsafe_sandbox.workdir)
    assert workdir.is_dir()
    assert workdir.is_relative_to(tmp_path / "state")
    assert workdir.parent.name.startswith(STATE_PREFIX)
    assert '"k": "v"' in (workdir.parent / LEASE_FILE).read_text()
    r = await unsafe_sandbox.exec("pwd")
    assert r.stdout == f"{workdir}\n"
    assert unsafe_sandbox.labels == {"k": "v"}


async def test_exec_basics(unsafe_sandbox: UnsafeLocalSandbox) -> None:
    r = await unsafe_sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 3, False)
    r = await unsafe_sandbox.exec('echo "$EXTRA|${PYTEST_CURRENT_TEST-unset}|$TMPDIR"')
    extra, leaked, tmpdir = r.stdout.rstrip("\n").split("|")
    assert extra == "x y"
    assert leaked == "unset"
    assert Path(tmpdir) == Path(unsafe_sandbox.workdir).parent
    r = await unsafe_sandbox.exec("mkdir -p sub && cd sub && pwd")
    assert r.stdout == f"{unsafe_sandbox.workdir}/sub\n"
    r = await unsafe_sandbox.exec("pwd", cwd="sub")
    assert r.stdout == f"{unsafe_sandbox.workdir}/sub\n"
    r = await unsafe_sandbox.exec('echo "${V-unset}"', env={"V": "1"})
    assert r.stdout == "1\n"
    r = await unsafe_sandbox.exec('echo "${V-unset}"')
    assert r.stdout == "unset\n"
    r = await unsafe_sandbox.exec("sleep 300", timeout=0.3)
    assert r.timed_out
    assert r.exit_code == -9


async def test_files_are_the_hosts_files_in_the_workdir(unsafe_sandbox: UnsafeLocalSandbox) -> None:
    """No isolation: what the API writes is a plain host file, and the other way round."""
    data = bytes(range(256)) + random.Random(7).randbytes(100_000)
    await unsafe_sandbox.write_file("a/b/data.bin", data)
    assert (Path(unsafe_sandbox.workdir) / "a" / "b" / "data.bin").read_bytes() == data
    (Path(unsafe_sandbox.workdir) / "host.txt").write_text("from the host")
    assert await unsafe_sandbox.read_file("host.txt") == b"from the host"


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
    assert await wait_dead([bg]) == []
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")
