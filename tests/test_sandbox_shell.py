"""The persistent shell (sandbox/shell.py) with real bash processes on the host."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tests.sandbox_fixtures import alive, pids_with_argv0, run_past_timeout, wait_dead
from tests.support import PATIENCE_S, wait_until

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecResult
from clotho.sandbox.config import base_env
from clotho.sandbox.host import proctree
from clotho.sandbox.shell import PersistentShell

BASH = ["bash", "--noprofile", "--norc"]
DROPPED = re.compile(r"\n\[\.\.\. (\d+) bytes of output dropped \.\.\.\]\n")


@contextlib.asynccontextmanager
async def shell_maker(
    tmp_path: Path, extra_env: dict[str, str]
) -> AsyncIterator[Callable[..., Awaitable[PersistentShell]]]:
    """For a `make_shell` fixture: `make(max_output_bytes, session=False)` starts a bash
    `PersistentShell` in `tmp_path` (the base environment and `extra_env`); all are closed
    when the test is done."""
    shells: list[PersistentShell] = []

    async def make(max_output_bytes: int = 8 << 20, session: bool = False) -> PersistentShell:
        shell = PersistentShell(
            BASH,
            env=base_env(str(tmp_path), extra_env),
            cwd=str(tmp_path),
            max_output_bytes=max_output_bytes,
            session=session,
        )
        await shell.start()
        shells.append(shell)
        return shell

    try:
        yield make
    finally:
        for shell in shells:
            await shell.close()


@pytest.fixture
async def make_shell(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[PersistentShell]]]:
    async with shell_maker(tmp_path, {"CLOTHO_TEST_BASE": "base"}) as make:
        yield make


@pytest.fixture
async def shell(make_shell) -> PersistentShell:
    return await make_shell()


# --- output and exit codes -------------------------------------------------------------------


async def test_stdout_and_stderr_are_separate(shell: PersistentShell) -> None:
    r = await shell.run("echo out1; echo err1 >&2; echo out2; echo err2 >&2")
    assert r.stdout == "out1\nout2\n"
    assert r.stderr == "err1\nerr2\n"
    assert r.exit_code == 0
    assert r.ok
    assert not r.timed_out


@pytest.mark.parametrize("code", [0, 1, 2, 42, 255])
async def test_exit_codes(shell: PersistentShell, code: int) -> None:
    r = await shell.run(f"echo before; (exit {code})")
    assert r.exit_code == code
    assert r.stdout == "before\n"
    assert r.ok is (code == 0)


async def test_exit_code_of_signalled_command(shell: PersistentShell) -> None:
    r = await shell.run("kill -9 $BASHPID")
    assert r.exit_code == 128 + 9
    assert not r.timed_out


async def test_output_without_trailing_newline_is_exact(shell: PersistentShell) -> None:
    r = await shell.run("printf abc; printf xyz >&2")
    assert r.stdout == "abc"
    assert r.stderr == "xyz"
    r = await shell.run("true")
    assert r.stdout == ""
    assert r.stderr == ""


async def test_binary_ish_output(shell: PersistentShell) -> None:
    r = await shell.run(r"printf 'a\000b\001\377c\n'")
    assert r.exit_code == 0
    assert r.stdout == "a\x00b\x01\ufffdc\n"


async def test_multibyte_utf8_across_read_chunks(shell: PersistentShell) -> None:
    # 200 000 bytes: several 64 KiB reads, some of which end in the middle of a character.
    r = await shell.run("yes é | head -n 100000 | tr -d '\\n'")
    assert r.stdout == "é" * 100_000


async def test_stdin_is_dev_null_and_cannot_eat_the_protocol(shell: PersistentShell) -> None:
    r = await shell.run('cat; read -r line; echo "got:[$line]"')
    assert r.stdout == "got:[]\n"
    r = await shell.run("echo next")
    assert r.stdout == "next\n"


# --- state between calls ---------------------------------------------------------------------


async def test_cwd_per_call_and_cd_does_not_persist(shell: PersistentShell, tmp_path: Path) -> None:
    sub = tmp_path / "sub dir"
    sub.mkdir()
    r = await shell.run("pwd", cwd=str(sub))
    assert r.stdout == f"{sub}\n"
    r = await shell.run("cd / && pwd")
    assert r.stdout == "/\n"
    r = await shell.run("pwd")
    assert r.stdout == f"{tmp_path}\n"


async def test_missing_cwd_fails_with_126(shell: PersistentShell, tmp_path: Path) -> None:
    r = await shell.run("echo should-not-run", cwd=str(tmp_path / "missing"))
    assert r.exit_code == 126
    assert "should-not-run" not in r.stdout
    assert "missing" in r.stderr


async def test_env_per_call_does_not_leak(shell: PersistentShell) -> None:
    tricky = "a b 'q' \"d\" $HOME `x` \\ ;|&"
    r = await shell.run('printf %s "$FOO"', env={"FOO": tricky})
    assert r.stdout == tricky
    r = await shell.run('echo "${FOO-unset}"')
    assert r.stdout == "unset\n"
    r = await shell.run("export BAR=1; echo $BAR")
    assert r.stdout == "1\n"
    r = await shell.run('echo "${BAR-unset}"')
    assert r.stdout == "unset\n"
    # The shell's own environment is the one it was started with, and only that.
    r = await shell.run('echo "$CLOTHO_TEST_BASE ${PYTEST_CURRENT_TEST-unset}"')
    assert r.stdout == "base unset\n"


async def test_invalid_env_name_is_rejected_and_shell_survives(shell: PersistentShell) -> None:
    with pytest.raises(ValueError, match="invalid environment variable name"):
        await shell.run("true", env={"A;rm -rf /": "x"})
    r = await shell.run("echo fine")
    assert r.stdout == "fine\n"


async def test_exit_in_command_does_not_kill_shell(shell: PersistentShell) -> None:
    pid = shell.pid
    r = await shell.run("echo bye; exit 7; echo unreachable")
    assert r.exit_code == 7
    assert r.stdout == "bye\n"
    r = await shell.run("exec true")
    assert r.exit_code == 0
    r = await shell.run("echo alive")
    assert r.stdout == "alive\n"
    assert shell.pid == pid
    assert pid is not None and alive(pid)


async def test_syntax_error_does_not_kill_shell(shell: PersistentShell) -> None:
    r = await shell.run("if then fi (")
    assert r.exit_code != 0
    assert "syntax error" in r.stderr
    r = await shell.run('echo "unterminated')
    assert r.exit_code != 0
    r = await shell.run("echo alive")
    assert r.exit_code == 0
    assert r.stdout == "alive\n"


async def test_shell_killed_raises_sandbox_error(shell: PersistentShell) -> None:
    # $$ in the command's subshell is the persistent shell itself.
    with pytest.raises(SandboxError):
        await shell.run("kill -9 $$")
    with pytest.raises(SandboxError):
        await shell.run("echo hi")


# --- timeouts and process trees --------------------------------------------------------------


async def test_timeout_kills_the_whole_process_tree(shell: PersistentShell, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    async def run(timeout: float) -> ExecResult:
        pidfile.unlink(missing_ok=True)
        return await shell.run(
            f"echo before; sleep 300 & echo $! >> {pidfile}; "
            f"bash -c 'sleep 301 & echo $! >> {pidfile}; echo $$ >> {pidfile}; wait'",
            timeout=timeout,
        )

    r = await run_past_timeout(
        run, lambda: pidfile.exists() and len(pidfile.read_text().split()) == 3
    )
    assert r.timed_out
    assert r.exit_code == -9
    assert not r.ok
    assert r.stdout == "before\n"  # output before the timeout is kept
    pids = [int(line) for line in pidfile.read_text().split()]
    assert len(pids) == 3
    assert await wait_dead(pids) == []
    assert shell.pid is not None and alive(shell.pid)
    r = await shell.run("echo after")
    assert r.stdout == "after\n"
    assert not r.timed_out


async def test_background_process_survives_calls_and_timeouts(shell: PersistentShell) -> None:
    r = await shell.run("sleep 300 >/dev/null 2>&1 & echo $!")
    bg = int(r.stdout)
    assert alive(bg)
    assert bg not in proctree.descendants(shell.pid or 0)  # reparented away from the shell
    r = await shell.run(f"kill -0 {bg} && echo running")
    assert r.stdout == "running\n"
    r = await shell.run("sleep 300", timeout=0.3)
    assert r.timed_out
    assert alive(bg)
    r = await shell.run(f"kill -0 {bg} && echo running")
    assert r.stdout == "running\n"


async def test_cancelled_caller_kills_command_and_next_call_is_clean(
    shell: PersistentShell, tmp_path: Path
) -> None:
    pidfile = tmp_path / "pid"
    running = asyncio.create_task(
        shell.run(
            f"echo stale; sleep 300 & echo $! > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; wait"
        )
    )
    assert await wait_until(pidfile.exists)  # the command is under way
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    r = await shell.run("echo fresh")
    assert r.stdout == "fresh\n"
    assert r.stderr == ""
    assert r.exit_code == 0
    assert await wait_dead([int(pidfile.read_text())]) == []


# --- output cap ------------------------------------------------------------------------------


def _split_capped(text: str) -> tuple[str, int, str]:
    match = DROPPED.search(text)
    assert match is not None, text[:200]
    return text[: match.start()], int(match.group(1)), text[match.end() :]


async def test_huge_output_is_capped_with_marker(make_shell) -> None:
    shell = await make_shell(max_output_bytes=64 << 10)
    r = await shell.run("head -c 30000000 /dev/zero | tr '\\0' a; printf END")
    head, dropped, tail = _split_capped(r.stdout)
    assert head == "a" * len(head)
    assert tail.endswith("aaaEND")
    assert len(head) + len(tail) <= 64 << 10
    assert len(head) + dropped + len(tail) == 30_000_003
    # The next command starts clean.
    r = await shell.run("echo small")
    assert r.stdout == "small\n"


async def test_stderr_is_capped_independently(make_shell) -> None:
    shell = await make_shell(max_output_bytes=4096)
    r = await shell.run("echo tiny; head -c 100000 /dev/zero | tr '\\0' e >&2")
    assert r.stdout == "tiny\n"
    head, dropped, tail = _split_capped(r.stderr)
    assert len(head) + dropped + len(tail) == 100_000
    assert set(head + tail) == {"e"}


@pytest.mark.parametrize("size", [0, 1, 900, 1500, 2048, 5000, 70_000, 300_000])
async def test_cap_keeps_exact_head_and_tail(make_shell, size: int) -> None:
    cap = 2048
    shell = await make_shell(max_output_bytes=cap)
    # A pattern where every position is distinguishable: 10-byte numbered records.
    expected = "".join(f"{i:09d}\n" for i in range(size // 10 + 1))[:size]
    r = await shell.run(f"seq -f '%09g' 0 {size // 10} | head -c {size}")
    if DROPPED.search(r.stdout) is None:
        assert r.stdout == expected
        assert size <= cap
    else:
        head, dropped, tail = _split_capped(r.stdout)
        assert expected.startswith(head)
        assert expected.endswith(tail)
        assert len(head) + dropped + len(tail) == size
        assert len(head) + len(tail) <= cap
        assert len(head) >= cap // 4 and len(tail) >= cap // 4
    if size <= cap // 2:
        assert r.stdout == expected


# --- concurrency and lifecycle ---------------------------------------------------------------


async def test_concurrent_calls_serialize(shell: PersistentShell) -> None:
    results = await asyncio.gather(
        *(
            shell.run(f"echo out{i}; echo err{i} >&2; exit {i % 7}", env={"N": str(i)})
            for i in range(50)
        )
    )
    for i, r in enumerate(results):
        assert r.stdout == f"out{i}\n"
        assert r.stderr == f"err{i}\n"
        assert r.exit_code == i % 7


async def test_close_kills_every_process(make_shell) -> None:
    shell = await make_shell()
    token = f"clotho-probe-{secrets.token_hex(6)}"
    r = await shell.run(
        f"(exec -a {token}-bg sleep 300) & "
        f"nohup bash -c '(exec -a {token}-nohup sleep 300) & wait' >/dev/null 2>&1 & "
        "echo started"
    )
    assert r.stdout == "started\n"
    running = asyncio.create_task(shell.run(f"exec -a {token}-fg sleep 300"))
    assert await wait_until(lambda: len(pids_with_argv0(token)) >= 3)
    probes = pids_with_argv0(token)
    assert len(probes) == 3
    shell_pid = shell.pid
    assert shell_pid is not None
    tree = [shell_pid, *proctree.descendants(shell_pid)]
    await shell.close()
    # The command in flight ends with the sandbox: killed (137) or the shell gone (SandboxError).
    try:
        result = await asyncio.wait_for(running, PATIENCE_S)
    except SandboxError:
        pass
    else:
        assert result.exit_code == 128 + 9
    assert await wait_dead(tree + probes) == []
    assert pids_with_argv0(token) == []
    await shell.close()  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        await shell.run("true")


async def test_start_failures_raise_sandbox_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot start"):
        await PersistentShell([str(tmp_path / "no-such-shell")], env={}).start()
    with pytest.raises(SandboxError, match="failed to start"):
        await PersistentShell(["bash", "-c", "echo broken >&2; exit 3"], env={}).start()


async def test_run_before_start_raises() -> None:
    shell = PersistentShell(BASH, env={})
    with pytest.raises(SandboxError, match="not started"):
        await shell.run("true")
