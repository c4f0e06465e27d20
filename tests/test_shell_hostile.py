"""The persistent shell's protocol against an agent that prints anything (real bash).

Whatever a command prints, including the shell's own variables, functions, traps, command
line and `$BASH_COMMAND`, later commands must still get their exact output; a forged end of a
command must break the shell for good (`SandboxError`), never shift later results; and the
host's memory must stay bounded whatever floods the shell's pipes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tests.docker_probe import requires_docker
from tests.support import wait_until
from tests.test_sandbox_shell import shell_maker

from clotho.errors import SandboxError
from clotho.sandbox import shell as shell_module
from clotho.sandbox.shell import PersistentShell

BASH = ["bash", "--noprofile", "--norc"]
MODES = ["session", "isolated"]

# What an agent can print about the shell that runs it.
DUMPS = [
    "set",
    "declare -p",
    "declare -f",
    "typeset",
    "typeset -f",
    "env",
    "export -p",
    "cat /proc/$$/environ",
    "cat /proc/$PPID/environ",
    "cat /proc/$$/cmdline",
    "cat /proc/$PPID/cmdline",
    "history",
    "trap -p",
    "alias",
    'echo "$BASH_COMMAND" "$_"',
    'compgen -v | while read -r v; do printf \'%s=%s\\n\' "$v" "${!v}"; done',
]


def vm_kb(field: str) -> int:
    """A memory figure of this test process from /proc/self/status, in kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


@pytest.fixture
async def make_shell(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[PersistentShell]]]:
    """`make(mode, max_output_bytes)`: a shell in `mode` (one of MODES)."""
    async with shell_maker(tmp_path, {}) as make:

        async def in_mode(mode: str, max_output_bytes: int = 8 << 20) -> PersistentShell:
            return await make(max_output_bytes, session=mode == "session")

        yield in_mode


async def quiet_once(shell: PersistentShell) -> bool:
    r = await shell.run("true", timeout=30)
    return (r.stdout, r.stderr, r.exit_code) == ("", "", 0)


@pytest.fixture
def issued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """Every (nonce, start, end) the shells hand out, in order: what a thief could have read."""
    seen: list[tuple[str, str, str]] = []
    real = shell_module.new_markers

    def record() -> tuple[str, str, str]:
        markers = real()
        seen.append(markers)
        return markers

    monkeypatch.setattr(shell_module, "new_markers", record)
    return seen


async def twenty_exact(shell: PersistentShell, tag: str = "") -> None:
    """Twenty ordinary commands, each with exact stdout, stderr and exit code."""
    for i in range(20):
        r = await shell.run(f"printf 'out {tag}{i}\\nlast'; printf 'err {i}' >&2; (exit {i % 4})")
        assert (r.stdout, r.stderr, r.exit_code) == (f"out {tag}{i}\nlast", f"err {i}", i % 4)


# --- the shell's own state printed ------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dump", DUMPS)
async def test_printing_the_shells_own_state_keeps_the_protocol(
    make_shell, mode: str, dump: str
) -> None:
    shell = await make_shell(mode)
    await shell.run("x_before=1")
    for _ in range(2):  # twice: the first dump also shows what the previous command left
        r = await shell.run(dump)
        assert not r.timed_out
    await twenty_exact(shell)
    if mode == "session":  # the session shell was never restarted: its variables are there
        assert (await shell.run("echo $x_before")).stdout == "1\n"


@pytest.mark.parametrize("mode", MODES)
async def test_everything_the_shell_shows_at_once_then_twenty_commands(make_shell, mode) -> None:
    shell = await make_shell(mode)
    r = await shell.run("; ".join(f"{{ {d}; }} 2>&1" for d in DUMPS) + "; echo END")
    assert r.stdout.endswith("END\n") and r.exit_code == 0
    await twenty_exact(shell)


async def test_a_debug_trap_printing_bash_command(make_shell) -> None:
    shell = await make_shell("session")
    await shell.run("""trap 'echo "dbg:$BASH_COMMAND"; echo "dbg2:$BASH_COMMAND" >&2' DEBUG""")
    for i in range(5):
        r = await shell.run(f"echo value{i}; (exit {i})")
        assert r.exit_code == i and not r.timed_out
        assert "dbg:echo value" in r.stdout and f"\nvalue{i}\n" in r.stdout
        assert "dbg2:" in r.stderr
    await shell.run("set -xv")  # xtrace and verbose print every statement of the protocol too
    r = await shell.run("echo traced")
    assert "\ntraced\n" in r.stdout and r.exit_code == 0
    await shell.run("set +xv; trap - DEBUG")
    await twenty_exact(shell)


# --- stolen and forged markers ----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_stolen_marker_of_an_earlier_command_is_only_output(
    make_shell, issued, mode: str
) -> None:
    shell = await make_shell(mode)
    await shell.run("echo first")
    _, start1, end1 = issued[-1]
    await shell.run("echo one")
    _, start2, end2 = issued[-1]
    # The end markers (with a status) and start markers of the last two commands, printed
    # inside a command on both streams, are only output.
    for start, end in ((start1, end1), (start2, end2)):
        stolen = f"{end}0\\n{start}{end}7 X\\n"
        r = await shell.run(f"printf '{stolen}'; printf '{stolen}' >&2; echo two")
        assert r.stdout == f"{end}0\n{start}{end}7 X\ntwo\n"
        assert r.stderr == f"{end}0\n{start}{end}7 X\n"
        assert r.exit_code == 0
    await twenty_exact(shell)


@pytest.mark.parametrize("mode", MODES)
async def test_the_next_commands_markers_are_fresh_random(make_shell, issued, mode) -> None:
    """No command can know the markers of the next: each is new, from secrets."""
    shell = await make_shell(mode)
    for _ in range(50):
        await shell.run("true")
    nonces = [nonce for nonce, _, _ in issued]
    assert len(set(nonces)) == len(nonces) == 51  # start()'s first command and ours
    assert all(len(n) == 16 for n in nonces)


async def forged_end_of_this_command(shell: PersistentShell, mode: str) -> None:
    """The agent reads its own command's end marker and prints it early, then the real end
    follows: the host took the forged one, and must see the real one as a desync.

    The real end comes 2 s later, so that a busy host reads the forged one first."""
    if mode == "session":  # read from the shell's own EXIT trap, decoded with printf
        forge = (
            "m=$(trap -p EXIT | sed -n 's/.*printf \"\\(E[^%]*\\)%s X.*/\\1/p'); "
            'printf "forged$m%s\\n" 0; printf "$m" >&2; sleep 2; echo real'
        )
        r = await shell.run(forge)
        assert r.stdout == "forged" and r.exit_code == 0  # the forgery was believed ...
    else:  # read from the parent shell's memory in real life; here the test hands it over
        nonce = "f" * 16
        ahead = (nonce, f"S{nonce}S", f"E{nonce}E")
        real = shell_module.new_markers
        shell_module.new_markers = lambda: ahead  # type: ignore[assignment]
        try:
            r = await shell.run(f"printf 'forged{ahead[2]}0\\n'; printf '{ahead[2]}' >&2; sleep 2")
        finally:
            shell_module.new_markers = real  # type: ignore[assignment]
        assert r.stdout == "forged" and r.exit_code == 0
    # ... but the real end came after it: the shell is broken for good.
    with pytest.raises(SandboxError, match="protocol broke"):
        await shell.run("echo next", timeout=10)
    for _ in range(3):
        with pytest.raises(SandboxError):
            await shell.run("true", timeout=5)


@pytest.mark.parametrize("mode", MODES)
async def test_a_forged_end_of_the_running_command_breaks_the_shell(make_shell, mode) -> None:
    shell = await make_shell(mode)
    await twenty_exact(shell)
    await forged_end_of_this_command(shell, mode)


async def test_a_forged_end_printed_between_commands_breaks_the_shell(
    make_shell, tmp_path: Path
) -> None:
    """A background process repeats the end marker of the command that started it after that
    command ended: the next call raises, whatever the next command is."""
    shell = await make_shell("session")
    go, forged = tmp_path / "go", tmp_path / "forged"
    r = await shell.run(
        "m=$(trap -p EXIT | sed -n 's/.*printf \"\\(E[^%]*\\)%s X.*/\\1/p'); "
        f'(until [ -e {go} ]; do sleep 0.01; done; printf "$m%s\\n" 0 >&98; : > {forged}) '
        "& echo started"
    )
    assert r.stdout == "started\n"
    go.touch()  # the command has ended: now the background process forges its end
    assert await wait_until(forged.exists)
    with pytest.raises(SandboxError, match="protocol broke"):
        await shell.run("echo next", timeout=10)
    with pytest.raises(SandboxError):
        await shell.run("true", timeout=5)


async def test_an_end_marker_with_a_bad_status_breaks_the_shell(make_shell, issued) -> None:
    shell = await make_shell("isolated")
    nonce = "a" * 16
    ahead = (nonce, f"S{nonce}S", f"E{nonce}E")
    real = shell_module.new_markers
    shell_module.new_markers = lambda: ahead  # type: ignore[assignment]
    try:
        with pytest.raises(SandboxError, match="protocol broke"):
            await shell.run(f"printf '{ahead[2]}zero\\n'", timeout=10)
    finally:
        shell_module.new_markers = real  # type: ignore[assignment]
    with pytest.raises(SandboxError):
        await shell.run("true", timeout=5)


# --- restarts the agent causes -----------------------------------------------------------------


async def test_session_shell_killed_between_commands_restarts_cleanly(
    make_shell, tmp_path: Path
) -> None:
    shell = await make_shell("session")
    await shell.run("kept=1")
    go, killed = tmp_path / "go", tmp_path / "killed"
    r = await shell.run(
        f"(until [ -e {go} ]; do sleep 0.01; done; kill -9 $$; : > {killed}) >/dev/null 2>&1 "
        "& echo bye"
    )
    assert r.stdout == "bye\n"
    go.touch()  # the command has ended: now the shell is killed (SIGKILL sent cannot be undone)
    assert await wait_until(killed.exists)
    r = await shell.run("echo after; echo ${kept:-gone}")
    assert r.stdout == "after\ngone\n" and r.exit_code == 0
    assert "the shell was restarted" in r.stderr
    await twenty_exact(shell)


async def test_exit_then_twenty_commands(make_shell) -> None:
    shell = await make_shell("session")
    r = await shell.run("echo x; exit 3")
    assert (r.stdout, r.exit_code) == ("x\n", 3)
    await twenty_exact(shell)


# --- floods: the host's memory stays bounded --------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_a_background_flood_between_commands_keeps_memory_bounded(
    make_shell, tmp_path: Path, mode: str
) -> None:
    """2 GiB on stdout and 512 MiB on stderr from a background writer, while the host runs
    commands now and then: it reads and drops what comes between commands, keeps at most
    max_output_bytes of what comes during one, and the writer gets to its end."""
    shell = await make_shell(mode, max_output_bytes=1 << 20)
    go, done = tmp_path / "go", tmp_path / "flood.done"
    before = vm_kb("VmHWM")
    r = await shell.run(
        # It starts after this command has ended (else its first bytes are this command's).
        f"(until [ -e {go} ]; do sleep 0.01; done; "
        f"yes | head -c 2G; yes | head -c 512M >&2; touch {done}) & echo started",
        timeout=10,
    )
    assert r.stdout == "started\n"
    go.touch()
    deadline = time.monotonic() + 240
    while not done.exists():
        assert time.monotonic() < deadline, "the flood did not get through"
        r = await shell.run("sleep 0.1", timeout=30)  # commands now and then, during the flood
        assert r.exit_code == 0 and len(r.stdout) <= (1 << 20) + 100
    # The writer has ended; what it wrote last may still be on its way through the pipes:
    # commands absorb it until one comes back clean, then every command is exact again.
    assert await wait_until(lambda: quiet_once(shell))
    r = await shell.run("echo quiet; echo e >&2", timeout=30)
    assert (r.stdout, r.stderr) == ("quiet\n", "e\n")
    grown_mb = (vm_kb("VmHWM") - before) / 1024
    assert grown_mb < 64, f"the host grew by {grown_mb:.0f} MB reading a flood"
    assert vm_kb("VmRSS") < before + 64 * 1024
    await twenty_exact(shell)


@pytest.mark.parametrize("mode", MODES)
async def test_a_flood_on_stderr_while_stdout_is_awaited_keeps_memory_bounded(
    make_shell, mode: str
) -> None:
    shell = await make_shell(mode, max_output_bytes=1 << 20)
    before = vm_kb("VmHWM")
    r = await shell.run("yes | head -c 1G >&2; echo out", timeout=120)
    assert r.stdout == "out\n" and r.exit_code == 0
    assert r.stderr.startswith("y\ny\n") and "bytes of output dropped" in r.stderr
    assert len(r.stderr) < (1 << 20) + 100
    grown_mb = (vm_kb("VmHWM") - before) / 1024
    assert grown_mb < 64, f"the host grew by {grown_mb:.0f} MB reading a flood"
    await twenty_exact(shell)


# --- a broken shell leaves the pool -----------------------------------------------------------


async def test_the_pool_discards_a_sandbox_whose_shell_protocol_broke(tmp_path: Path) -> None:
    """A real bubblewrap sandbox: the agent forges its command's end, the next call raises,
    and the pool's health check throws the sandbox away instead of handing it out again."""
    from clotho.sandbox import LocalSandboxConfig
    from clotho.sandbox.pool import PoolConfig, SlotPool

    config = LocalSandboxConfig(state_dir=str(tmp_path))
    async with SlotPool(PoolConfig(max_size=2, health_interval_s=0)) as pool:
        sandbox = await pool.acquire(config)
        r = await sandbox.exec(
            "m=$(trap -p EXIT | sed -n 's/.*printf \"\\(E[^%]*\\)%s X.*/\\1/p'); "
            'printf "$m%s\\n" 0; printf "$m" >&2; sleep 2'
        )
        assert (r.stdout, r.exit_code) == ("", 0)  # the forgery was believed ...
        with pytest.raises(SandboxError, match="protocol broke"):
            await sandbox.exec("echo next", timeout=10)  # ... until the true end came
        await pool.release(sandbox, reset=False)  # as if it were still good
        again = await pool.acquire(config)
        assert again is not sandbox
        assert (await again.exec("echo fine")).stdout == "fine\n"
        await pool.release(again)
        # The pool destroys it in the background.
        destroyed = await wait_until(lambda: pool.stats()["destroyed"] >= 1)
        assert destroyed, "the broken sandbox was not destroyed"


# --- the same through a container's channels ----------------------------------------------------


@requires_docker
@pytest.mark.parametrize("stdio", ["fifo", "attach"])
async def test_docker_shell_survives_dumps_forgeries_and_floods(stdio: str) -> None:
    """Through the FIFO and the attach-socket channels (a real container): the shell's own
    state printed, twenty exact commands, a background flood with bounded host memory, and a
    forged end that breaks the shell."""
    from clotho.sandbox import open_sandbox
    from clotho.sandbox.config import DockerSandboxConfig

    sb = await open_sandbox(DockerSandboxConfig(stdio=stdio))
    try:
        for dump in ("set", "declare -p", "trap -p", "cat /proc/$$/cmdline /proc/1/cmdline"):
            assert not (await sb.exec(dump)).timed_out
        for i in range(20):
            r = await sb.exec(f"printf 'out {i}'; printf 'err {i}' >&2; (exit {i % 4})")
            assert (r.stdout, r.stderr, r.exit_code) == (f"out {i}", f"err {i}", i % 4)
        before = vm_kb("VmHWM")
        r = await sb.exec("rm -f /tmp/done; (yes | head -c 512M; touch /tmp/done) & echo ok")
        assert r.stdout == "ok\n"

        async def flood_done() -> bool:
            r = await sb.exec("sleep 0.1; test -e /tmp/done && echo DONE")
            return r.stdout[-5:] == "DONE\n"

        assert await wait_until(flood_done, timeout=240), "the flood did not get through"
        grown_mb = (vm_kb("VmHWM") - before) / 1024
        assert grown_mb < 100, f"the host grew by {grown_mb:.0f} MB reading a flood"
        assert (await sb.exec("echo quiet")).stdout == "quiet\n"
        r = await sb.exec(
            "m=$(trap -p EXIT | sed -n 's/.*printf \"\\(E[^%]*\\)%s X.*/\\1/p'); "
            'printf "$m%s\\n" 0; printf "$m" >&2; sleep 2'
        )
        assert (r.stdout, r.exit_code) == ("", 0)
        with pytest.raises(SandboxError, match="protocol broke"):
            await sb.exec("echo next", timeout=10)
    finally:
        await sb.close()
