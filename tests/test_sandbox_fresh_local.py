"""Verification from nothing the agent controls, on the local backends: exec_fresh (a new
process joining the sandbox's namespaces from the host), stop_agent (the freezer cgroup) and
digests (hashed on the host), with real bubblewrap sandboxes and a hostile agent."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from tests.sandbox_fixtures import (
    alive,
    kernel_text,
    pids_with_argv0,
    requires_bwrap,
    requires_root,
    run_past_timeout,
)
from tests.support import wait_until

from clotho.errors import SandboxError
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.base import ExecResult, Sandbox
from clotho.sandbox.host.cgroups import CGROUP_ROOT, PARENT
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.pool import PoolConfig, SlotPool

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = [pytest.mark.bwrap, requires_bwrap]

# The hostile agent's leftover: detached twice (setsid, double fork), renamed, in a loop
# rewriting the reward file the verifier will read.
FORGER = (
    "mkdir -p /logs/verifier; "
    "(setsid bash -c 'exec -a kworker/0:1 bash -c \""
    "while :; do echo 1 > /logs/verifier/reward.txt; date +%s%N > /logs/beat; done\"' "
    "</dev/null >/dev/null 2>&1 &)"
)


def cgroups_of(pid: int) -> str:
    return kernel_text(f"/proc/{pid}/cgroup")


def stopped_for_good(pid: int) -> bool:
    """Gone, or in a frozen cgroup: either way it can never run again."""
    groups = cgroups_of(pid).splitlines()
    if not groups or not alive(pid):
        return True
    freezer = next(line.split(":", 2)[2] for line in groups if line.split(":")[1] == "freezer")
    state = CGROUP_ROOT / "freezer" / freezer.lstrip("/") / "freezer.state"
    return state.read_text().strip() == "FROZEN"


async def changing(read: Callable[[], Awaitable[str]]) -> bool:
    """Whether a file a loop rewrites is seen to change (the loop runs): a positive control
    that makes "it no longer changes" mean something."""
    first = await read()

    async def moved() -> bool:
        return (await read()) not in ("", first)

    return await wait_until(moved)


async def test_exec_fresh_sees_the_agents_files_but_none_of_its_shell(
    bwrap_sandbox: BwrapSandbox, root_mode: str
) -> None:
    await bwrap_sandbox.exec(
        "export SECRET=agent; f() { echo hijacked; }; export -f f; alias ls='echo hijacked'; "
        "echo 'echo hijacked' > /tmp/rc; export BASH_ENV=/tmp/rc; "
        "echo in-app > /app/a.txt; echo in-tmp > /tmp/t.txt"
    )
    r = await bwrap_sandbox.exec_fresh(
        'echo "${SECRET:-unset} $HOME $(pwd)"; type f 2>&1 | head -1; cat a.txt /tmp/t.txt; '
        "cat; id -u; readlink /proc/1/exe >/dev/null; echo pid1=$(cat /proc/1/comm)",
        timeout=20,
        env={"EXTRA": "1"},
        stdin=b"from-stdin\n",
    )
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "unset /root /app"
    assert "not found" in lines[1]
    assert lines[2:5] == ["in-app", "in-tmp", "from-stdin"]
    assert lines[5] == "0"
    assert lines[6] == "pid1=bwrap"  # the sandbox's own pid namespace
    assert "hijacked" not in r.stdout + r.stderr
    r = await bwrap_sandbox.exec_fresh(
        "echo $EXTRA; pwd", timeout=10, cwd="/tmp", env={"EXTRA": "1"}
    )
    assert r.stdout == "1\n/tmp\n"


async def test_exec_fresh_output_is_capped_and_timeout_kills_its_tree(
    bwrap_sandbox: BwrapSandbox,
) -> None:
    r = await bwrap_sandbox.exec_fresh(
        "head -c 5000000 /dev/zero | tr '\\0' a; head -c 300000 /dev/zero >&2",
        timeout=30,
        max_output_bytes=1000,
    )
    assert r.stdout.startswith("a" * 1000) and len(r.stdout) < 1100
    assert "4999000 more bytes cut" in r.stdout
    assert len(r.stderr) < 1100
    # A detached child (setsid, holding no pipe) must not outlive its exec_fresh.
    token = f"fresh-{secrets.token_hex(4)}"
    beat = bwrap_sandbox.state / "app" / "fresh-beat"

    async def run(timeout: float) -> ExecResult:
        beat.unlink(missing_ok=True)
        return await bwrap_sandbox.exec_fresh(
            f"(setsid bash -c 'exec -a {token} bash -c \"while :; do "
            f"date +%s%N > /app/fresh-beat; sleep 0.01; done\"' </dev/null >/dev/null 2>&1 &); "
            "sleep 300",
            timeout=timeout,
        )

    r = await run_past_timeout(run, beat.exists)  # the child had written: it had started
    assert r.timed_out
    assert await wait_until(lambda: pids_with_argv0(token) == [])


@requires_root
async def test_stop_agent_freezes_a_detached_forger_for_good(
    bwrap_sandbox: BwrapSandbox, root_mode: str
) -> None:
    await bwrap_sandbox.exec(FORGER)

    async def beat() -> str:
        return (await bwrap_sandbox.exec_fresh("cat /logs/beat 2>/dev/null", timeout=30)).stdout

    assert await changing(beat)  # it runs, rewriting the reward
    forger = [
        p for p in pids_with_argv0("kworker/0:1") if bwrap_sandbox.state.name in cgroups_of(p)
    ]
    assert forger
    await bwrap_sandbox.stop_agent()
    assert bwrap_sandbox.stopped
    assert all(stopped_for_good(p) for p in forger)
    # The verifier's own steps: a fresh reward folder, then the reward it writes stays.
    r = await bwrap_sandbox.exec_fresh(
        "rm -rf /logs/verifier && mkdir -p /logs/verifier && echo 0 > /logs/verifier/reward.txt "
        "&& cat /logs/beat",
        timeout=30,
    )
    assert r.exit_code == 0, r.stderr
    r2 = await bwrap_sandbox.exec_fresh("cat /logs/verifier/reward.txt /logs/beat", timeout=30)
    assert r2.stdout == "0\n" + r.stdout
    for call in (
        bwrap_sandbox.exec("true"),
        bwrap_sandbox.read_file("/app/x"),
        bwrap_sandbox.write_file("/app/x", b"x"),
    ):
        with pytest.raises(SandboxError, match="stopped"):
            await call
    await bwrap_sandbox.stop_agent()  # idempotent, and the namespace is still there
    r = await bwrap_sandbox.exec_fresh("cat /logs/verifier/reward.txt", timeout=10)
    assert r.stdout == "0\n"
    name = bwrap_sandbox.state.name
    await bwrap_sandbox.close()
    assert not (CGROUP_ROOT / "freezer" / PARENT / name).exists()


async def looped(sb: BwrapSandbox, times: int) -> bool:
    """Whether the spawner's loop has gone round `times` times (stopped at varied points)."""
    try:
        return (await sb.read_file("/logs/v/n")).count(b"\n") >= times
    except FileNotFoundError:
        return False


@requires_root
async def test_stop_agent_freezes_a_vforking_spawner(tmp_path: Path) -> None:
    """A shell forking in a loop, stopped at different moments: a parent waiting in vfork for
    a child the freezer caught first never counts as frozen unless it is killed while the
    freeze runs (before that fix, some round of 40 hung for 10 s in about half the runs)."""
    for round_ in range(40):
        config = LocalSandboxConfig(root="overlay", state_dir=str(tmp_path / f"s{round_}"))
        sb = await open_sandbox(config)
        assert isinstance(sb, BwrapSandbox)
        try:
            await sb.exec(
                "mkdir -p /logs/v; ( ( exec -a kworker sh -c 'while :; do echo >> /logs/v/n; "
                "sleep 0.01; done' & ) & ) >/dev/null 2>&1 </dev/null"
            )
            assert await wait_until(lambda sb=sb, times=round_ % 5 + 1: looped(sb, times))
            await sb.stop_agent()
            r = await sb.exec_fresh("echo ok", timeout=10)
            assert r.stdout == "ok\n", r.stderr
        finally:
            await sb.close()


async def test_digests_see_the_sandbox_files_from_the_host(
    bwrap_sandbox: BwrapSandbox, root_mode: str, tmp_path: Path
) -> None:
    host_only = Path("/tmp") / f"clotho-digest-{secrets.token_hex(6)}"
    host_only.write_text("host\n")
    try:
        await bwrap_sandbox.exec(
            f"echo sandbox > {host_only}; ln -s /tmp /app/l; ln -s /etc/shadow /app/s; "
            "ln -s ../../../../../.. /app/up"
        )
        paths = [
            str(host_only),  # private /tmp: the sandbox's file, not the host's
            f"/app/l/{host_only.name}",  # through a link, resolved inside the sandbox
            "/app/s",  # a link: its text, never its target
            "/app/up/etc/hostname",  # `..` never climbs above the sandbox root
            "/nothing/here",
            "/usr/bin/env",
        ]
        got = await bwrap_sandbox.digests(paths)
        mine = hashlib.sha256(b"sandbox\n").hexdigest()
        assert got[paths[0]] == mine and got[paths[1]] == mine
        assert got["/app/s"] == "link:/etc/shadow"
        inside = await bwrap_sandbox.exec("sha256sum < /etc/hostname")  # the sandbox's own
        assert got["/app/up/etc/hostname"] == inside.stdout.split()[0]
        assert got["/nothing/here"] is None
        env = hashlib.sha256(Path("/usr/bin/env").read_bytes()).hexdigest()
        assert got["/usr/bin/env"] == env
    finally:
        host_only.unlink()


@requires_root
async def test_digests_catch_a_replaced_program(tmp_path: Path) -> None:
    config = LocalSandboxConfig(root="overlay", state_dir=str(tmp_path))
    async with await open_sandbox(config) as sb:
        names = ["/usr/local/bin/python3", "/usr/local/bin/bash", "/bin/bash"]
        before = await sb.digests(names)
        await sb.exec(
            "printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/python3; "
            "ln -s /app/fake /usr/local/bin/bash"
        )
        await sb.stop_agent()
        after = await sb.digests(names)
        assert before["/usr/local/bin/python3"] is None
        assert after["/usr/local/bin/python3"] == hashlib.sha256(b"#!/bin/sh\necho 1\n").hexdigest()
        assert after["/usr/local/bin/bash"] == "link:/app/fake"
        assert after["/bin/bash"] == before["/bin/bash"] is not None


@requires_root
async def test_pool_destroys_a_stopped_sandbox_even_with_git_reset(tmp_path: Path) -> None:
    config = LocalSandboxConfig(root="overlay", state_dir=str(tmp_path))
    async with SlotPool(PoolConfig(max_size=2, reset="git")) as pool:
        sb = await pool.acquire(config)
        await sb.exec(
            "git init -q . && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x"
        )
        await sb.stop_agent()
        await pool.release(sb)
        assert await wait_until(lambda: pool.stats()["destroyed"] == 1)
        assert pool.stats()["idle"] == 0
        again = await pool.acquire(config)
        assert again is not sb
        await pool.release(again)


# --- unsafe-local: what is meaningful without isolation --------------------------------------


async def test_unsafe_local_fresh_process_and_digests(unsafe_sandbox: Sandbox) -> None:
    await unsafe_sandbox.exec("export SECRET=agent; echo data > f.txt")
    r = await unsafe_sandbox.exec_fresh(
        "echo ${SECRET:-unset}; cat f.txt; cat", timeout=10, stdin=b"in"
    )
    assert r.stdout == "unset\ndata\nin"
    got = await unsafe_sandbox.digests(["f.txt", "missing"])
    assert got == {"f.txt": hashlib.sha256(b"data\n").hexdigest(), "missing": None}


@requires_root
async def test_unsafe_local_stop_agent_stops_detached_processes(unsafe_sandbox: Sandbox) -> None:
    token = f"beat-{secrets.token_hex(4)}"
    await unsafe_sandbox.exec(
        f"(setsid bash -c 'exec -a {token} bash -c \"while :; do date +%s%N > beat; "
        "sleep 0.01; done\"' </dev/null >/dev/null 2>&1 &)"
    )

    async def beat() -> str:
        return (await unsafe_sandbox.exec_fresh("cat beat 2>/dev/null", timeout=30)).stdout

    assert await changing(beat)
    loop = pids_with_argv0(token)
    assert loop
    await unsafe_sandbox.stop_agent()
    assert all(stopped_for_good(p) for p in loop)
    assert await beat() == await beat()
    with pytest.raises(SandboxError, match="stopped"):
        await unsafe_sandbox.exec("true")
