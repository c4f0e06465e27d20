"""Closing a local sandbox, and `clotho sandbox gc`, remove its folder whatever the agent left.

Real bubblewrap sandboxes: the agent makes a 5,000-level-deep folder (`shutil.rmtree` raised
RecursionError at 1,500), a chmod 000 folder holding files, a link to a host folder outside
(which must survive), and a file made immutable. An agent cannot set the immutable flag
itself (that needs CAP_LINUX_IMMUTABLE on the host), so the test sets it from the host on the
agent's file: what a root-run tool in the sandbox could leave. Where the file system has no
such flag the test skips, and fails under CI=true, where it must run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.sandbox_fixtures import outside_folder, requires_bwrap
from tests.support import PATIENCE_S

from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.host.leases import STATE_PREFIX
from clotho.sandbox.host.trees import remove_tree
from clotho.sandbox.local.bwrap import BwrapSandbox

DEPTH = 5000
AGENT_WORK = 300.0  # a deep tree on a loaded disk: thousands of journalled mkdirs

pytestmark = requires_bwrap


def agent_script(outside: Path) -> str:
    """What the agent runs in its workdir: every shape a plain rmtree trips on."""
    deep = f"import os\nfor _ in range({DEPTH}):\n    os.mkdir('d')\n    os.chdir('d')\n"
    return (
        f"python3 -c {sh(deep)} && "
        "mkdir -p locked/inner && echo a > locked/a && echo b > locked/inner/b && "
        "chmod 000 locked/inner locked && echo z > frozen && "
        f"ln -s {sh(str(outside))} escape && ln -s / root-link && echo made"
    )


def sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def set_immutable(path: Path) -> None:
    """`chattr +i` from the host; skips (fails under CI) where the file system has no flag."""
    if shutil.which("chattr") is None or shutil.which("lsattr") is None:
        missing = "chattr/lsattr missing (apt-get install e2fsprogs)"
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        why = f"the file system under {path} has no immutable flag: {done.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    flags = subprocess.run(["lsattr", str(path)], capture_output=True, text=True, check=True)
    assert "i" in flags.stdout.split()[0], flags.stdout
    with pytest.raises(PermissionError):
        path.unlink()  # the flag holds: only clearing it lets the file go


@contextlib.contextmanager
def unstuck_on_failure(folder: Path) -> Iterator[None]:
    """If the code under test fails, leave no immutable file behind in /tmp."""
    try:
        yield
    finally:
        if folder.exists():
            subprocess.run(["chattr", "-i", str(folder / "app" / "frozen")], check=False)
            subprocess.run(["chmod", "-R", "u+rwx", str(folder)], check=False)
            subprocess.run(["rm", "-rf", str(folder)], check=False)


async def test_close_removes_what_the_agent_left(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with outside_folder(tmp_path) as outside:
        sb = await open_sandbox(LocalSandboxConfig(state_dir=str(state)), {"clotho.test": "gc"})
        assert isinstance(sb, BwrapSandbox)
        folder = sb.state
        with unstuck_on_failure(folder):
            try:
                result = await sb.exec(agent_script(outside), timeout=AGENT_WORK)
                assert result.exit_code == 0 and result.stdout.strip() == "made", result
                assert (folder / "app" / "d" / "d").is_dir()
                set_immutable(folder / "app" / "frozen")
            finally:
                await sb.close()
            assert not folder.exists(), sorted(p.name for p in folder.iterdir())
    assert list(state.glob(f"{STATE_PREFIX}*")) == []


async def test_gc_removes_what_a_killed_run_left(tmp_path: Path) -> None:
    """A run SIGKILLed with its sandbox open leaves the folder; `clotho sandbox gc` removes it."""
    state = tmp_path / "state"
    with outside_folder(tmp_path) as outside:
        run = textwrap.dedent(
            f"""
            import asyncio, os, signal
            from clotho.sandbox import open_sandbox
            from clotho.sandbox import LocalSandboxConfig

            async def main():
                sb = await open_sandbox(LocalSandboxConfig(state_dir={str(state)!r}), {{}})
                result = await sb.exec({agent_script(outside)!r}, timeout={AGENT_WORK})
                print(result.exit_code, result.stdout.strip(), sb.state, flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # no close, no atexit

            asyncio.run(main())
            """
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", run, stdout=asyncio.subprocess.PIPE
        )
        stdout, _ = await asyncio.wait_for(proc.communicate(), AGENT_WORK + PATIENCE_S)
        assert proc.returncode == -9
        code, made, where = stdout.decode().split()
        folder = Path(where)
        assert (code, made) == ("0", "made")
        with unstuck_on_failure(folder):
            assert folder.parent == state and (folder / "app" / "d" / "d").is_dir()
            assert (folder / "app" / "locked").stat().st_mode & 0o777 == 0
            set_immutable(folder / "app" / "frozen")
            gc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "clotho", "sandbox", "gc", "--state-dir", str(state),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await asyncio.wait_for(gc.communicate(), AGENT_WORK)
            assert gc.returncode == 0, err.decode()
            assert "not checked" not in out.decode() and "removed 1 " in out.decode(), out
            assert not folder.exists()


def test_remove_tree_reopens_folders_closed_by_their_owner_without_root() -> None:
    """Without root (a non-root host runs the agent as its own uid), a chmod 000 folder
    refuses even its owner: `remove_tree` gives the owner its rights back, inode by inode.
    Run as an unprivileged uid (root bypasses the modes, so would prove nothing)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to an unprivileged uid needs root and setpriv")
    nobody = 65534
    folder = Path(tempfile.mkdtemp(prefix=STATE_PREFIX))  # /tmp: reachable by that uid
    try:
        os.chown(folder, nobody, nobody)
        script = (
            "import os, pathlib, sys\n"
            "from clotho.sandbox.host.trees import remove_tree\n"
            "root = pathlib.Path(sys.argv[1])\n"
            "os.chdir(root)\n"
            "for _ in range(300):\n"
            "    os.mkdir('d'); os.chdir('d')\n"
            "os.chdir(root)\n"
            "(root / 'shut' / 'inner').mkdir(parents=True)\n"
            "(root / 'shut' / 'inner' / 'f').write_text('x')\n"
            "(root / 'shut' / 'g').write_text('y')\n"
            "os.chmod(root / 'shut' / 'inner', 0); os.chmod(root / 'shut', 0)\n"
            "os.chmod(root / 'd' / 'd', 0o500)\n"  # no write: entries cannot be unlinked
            "assert not os.access(root / 'shut', os.R_OK)\n"
            "remove_tree(root)\n"
            "print('removed', root.exists())\n"
        )
        done = subprocess.run(
            ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups",
             sys.executable, "-c", script, str(folder)],
            capture_output=True, text=True, timeout=AGENT_WORK,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["removed", "False"]
        assert not folder.exists()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_remove_tree_detaches_a_mount_and_keeps_what_it_held(tmp_path: Path) -> None:
    """A file system mounted under the folder (root only) is detached, not emptied: a bind
    mount of a host folder left there must not cost the host its files."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    host = tmp_path / "host"
    host.mkdir()
    (host / "precious").write_text("keep")
    folder = tmp_path / f"{STATE_PREFIX}mounted"
    (folder / "app" / "bound").mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(host), str(folder / "app" / "bound")], check=True)
    try:
        remove_tree(folder)
    finally:
        subprocess.run(["umount", str(folder / "app" / "bound")], check=False)
    assert not folder.exists()
    assert (host / "precious").read_text() == "keep"
