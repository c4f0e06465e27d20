"""The ssh backend against a real sshd (Debian's openssh-server) that these tests start on
127.0.0.1, on a free port, with a throw-away host key and an authorized key made in tmp.

The file contract every backend keeps runs here too (the tests of
tests/test_sandbox_backends.py, imported, on an ssh sandbox with and without bubblewrap),
then what is the ssh backend's own: its stated isolation, commands and timeouts killed on
the remote side, close ending even processes that left with setsid and `env -u`, the host
key refused when unknown, and gc of what a killed owner left.

Without sshd the tests are skipped with the reason shown; in CI (CI=true) they fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox_fixtures import pids_with_argv0, wait_dead
from tests.support import PATIENCE_S, wait_until, wait_until_sync

# The file contract, run here on ssh sandboxes through this module's `any_sandbox`.
from tests.test_sandbox_backends import (  # noqa: F401
    test_all_byte_values_and_odd_names_round_trip,
    test_file_errors_leave_the_session_shell,
    test_large_random_file_round_trip,
    test_only_regular_files_under_the_cap_are_read,
    test_upload_download_tree_and_single_files,
)

from clotho.errors import ConfigError
from clotho.sandbox import open_sandbox
from clotho.sandbox.backends import make_backend
from clotho.sandbox.config import sandbox_kinds
from clotho.sandbox.host.leases import OWNER

SSHD = "/usr/sbin/sshd"
IN_CI = os.environ.get("CI") == "true"


def _sshd_problem() -> str | None:
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        return "openssh-server is not installed (scripts/install-system-deps.sh installs it)"
    try:
        import asyncssh  # noqa: F401
    except ImportError:
        return "asyncssh is not installed (pip install -e '.[ssh]')"
    if os.geteuid() != 0:
        return "sshd's privilege separation needs root here"
    return None


@dataclass(frozen=True)
class Sshd:
    port: int
    key: Path  # the client's private key
    known_hosts: Path
    folder: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _start_sshd(folder: Path, port: int) -> subprocess.Popen[bytes] | None:
    """sshd on `port` once it answers, or None when it exited (the port was taken)."""
    options = {
        "Port": str(port),
        "ListenAddress": "127.0.0.1",
        "HostKey": str(folder / "host_key"),
        "AuthorizedKeysFile": str(folder / "authorized_keys"),
        "UsePAM": "no",
        "PidFile": "none",
        "StrictModes": "no",
        "PermitRootLogin": "prohibit-password",
        "PasswordAuthentication": "no",
        "KbdInteractiveAuthentication": "no",
        "MaxSessions": "64",
        "MaxStartups": "64",
        "Subsystem": "sftp internal-sftp",
    }
    argv = [SSHD, "-D", "-e", "-f", "/dev/null"]  # an absolute path: sshd re-executes itself
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    with (folder / "sshd.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    if wait_until_sync(lambda: proc.poll() is not None or _answers(port)) and proc.poll() is None:
        return proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    return None


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 that only our throw-away key opens."""
    problem = _sshd_problem()
    if problem is not None:
        if IN_CI:
            pytest.fail(f"CI=true runs the ssh backend's tests, but: {problem}")
        pytest.skip(problem)
    folder = tmp_path_factory.mktemp("sshd")
    _keygen(folder / "host_key")
    _keygen(folder / "client_key")
    shutil.copy(folder / "client_key.pub", folder / "authorized_keys")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    host_key = (folder / "host_key.pub").read_text().split()[:2]
    proc = None
    for _attempt in range(5):  # a free port may be taken between the probe and the bind
        port = _free_port()
        proc = _start_sshd(folder, port)
        if proc is not None:
            break
    if proc is None:
        pytest.fail(f"sshd did not start: {(folder / 'sshd.log').read_text()[-2000:]}")
    (folder / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_key)}\n")
    try:
        yield Sshd(port, folder / "client_key", folder / "known_hosts", folder)
    finally:
        proc.terminate()
        proc.wait()


def _config(sshd: Sshd, root: Path, **more: Any) -> Any:
    from clotho.sandbox.ssh.config import SshSandboxConfig

    return SshSandboxConfig(
        host="127.0.0.1",
        port=sshd.port,
        user="root",
        key_file=str(sshd.key),
        known_hosts=str(sshd.known_hosts),
        remote_root=str(root),
        **more,
    )


@pytest.fixture(params=["bwrap", "none"])
async def any_sandbox(
    request: pytest.FixtureRequest, sshd: Sshd, tmp_path: Path
) -> AsyncIterator[Any]:
    """An ssh sandbox, isolated by bubblewrap on the remote host or not at all."""
    sb = await open_sandbox(
        _config(sshd, tmp_path / "remote", isolation=request.param), {"clotho.test": "ssh"}
    )
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def ssh_sandbox(sshd: Sshd, tmp_path: Path) -> AsyncIterator[Any]:
    """An ssh sandbox in bubblewrap (this host has it)."""
    sb = await open_sandbox(_config(sshd, tmp_path / "remote"), {"clotho.test": "ssh"})
    try:
        yield sb
    finally:
        await sb.close()


def test_the_kind_is_registered_for_the_cli() -> None:
    assert "ssh" in sandbox_kinds(place="host")
    assert "ssh" in sandbox_kinds(place="host", isolated=True)


async def test_commands_and_the_session_shell(ssh_sandbox: Any) -> None:
    sb = ssh_sandbox
    r = await sb.exec("echo out; echo err >&2; exit_code() { return 3; }; exit_code")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 3, False)
    await sb.exec("export KEPT=1; cd /tmp; x=5")
    r = await sb.exec('echo "$KEPT $x"; pwd')
    assert r.stdout == f"1 5\n{sb.workdir}\n"  # variables persist, the cwd is set each call
    r = await sb.exec("echo $A-$KEPT", env={"A": "a"})  # isolated: env does not leak
    assert r.stdout == "a-1\n"
    assert (await sb.exec("echo ${A:-unset}")).stdout == "unset\n"
    r = await sb.exec("exit 7")
    assert r.exit_code == 7
    r = await sb.exec('echo "${KEPT:-gone}"')
    assert r.stdout == "gone\n"  # exit restarted the session shell
    assert "restarted" not in r.stderr


async def test_bubblewrap_isolates_and_says_so(ssh_sandbox: Any, tmp_path: Path) -> None:
    """With bubblewrap on the host the sandbox sees an allow-list of it (no /work, no
    clotho folders, no host key), has no network, and states it; the label says it too."""
    sb = ssh_sandbox
    assert sb.facts["isolation"] == "bwrap" and sb.facts["network"] == "none"
    assert sb.labels["clotho.ssh-isolation"] == "bwrap"
    r = await sb.exec(
        f"ls / ; test -e {tmp_path} && echo SEEN; test -e /work && echo WORK; "
        "cat /etc/ssh/ssh_host_ed25519_key 2>/dev/null && echo KEY; "
        "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"
    )
    assert "SEEN" not in r.stdout and "WORK" not in r.stdout and "KEY" not in r.stdout
    interfaces = r.stdout.split()[-1:]
    assert interfaces == ["lo"], r.stdout  # its own network namespace: loopback only
    assert (await sb.exec("echo $$")).stdout.strip() != str(os.getpid())


async def test_a_host_without_bubblewrap_is_said_once_and_stated(
    sshd: Sshd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host whose probe finds no bubblewrap (a test double of the probe's answer: this host
    has one) runs plain processes: a warning once per backend, the facts and label say none,
    and `isolation: bwrap` refuses it."""
    from clotho.sandbox.ssh.backend import SshBackend

    config = _config(sshd, tmp_path / "remote")
    backend = make_backend(config)
    assert isinstance(backend, SshBackend)
    try:
        real = await backend.facts()
        backend._facts = type(real)(real.home, real.uid, "missing", ())  # the double
        caplog.set_level(logging.WARNING, logger="clotho.sandbox.ssh.backend")
        first = await backend.open(config, {})
        second = await backend.open(config, {})
        try:
            for sb in (first, second):
                assert sb.facts["isolation"] == "none" and "missing" in sb.facts["why"]
                assert sb.labels["clotho.ssh-isolation"] == "none"
                assert sb.workdir.startswith(str(tmp_path / "remote"))
                assert (await sb.exec("pwd")).stdout.strip() == sb.workdir
        finally:
            await first.close()
            await second.close()
        warnings = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
        assert len(warnings) == 1
        with pytest.raises(ConfigError, match="bubblewrap is missing"):
            await backend.open(config.model_copy(update={"isolation": "bwrap"}), {})
    finally:
        await backend.aclose()


@pytest.mark.parametrize("shell", ["session", "isolated"])
async def test_a_timeout_kills_the_command_not_earlier_background_work(
    sshd: Sshd, tmp_path: Path, shell: str
) -> None:
    token = f"clotho-ssh-{secrets.token_hex(4)}"
    sb = await open_sandbox(_config(sshd, tmp_path / "remote", shell=shell), {})
    try:
        await sb.exec(f"(exec -a {token}-bg sleep 1000) > /dev/null 2>&1 &")
        assert await wait_until(lambda: bool(pids_with_argv0(f"{token}-bg")))
        r = await sb.exec(f"exec -a {token}-fg sleep 1000", timeout=1)
        assert r.timed_out and r.exit_code == -9
        assert not pids_with_argv0(f"{token}-fg")
        assert pids_with_argv0(f"{token}-bg")  # started by an earlier command: it lives on
        r = await sb.exec("while :; do :; done", timeout=1)  # the shell itself loops
        assert r.timed_out
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    finally:
        await sb.close()
    assert not await wait_dead(pids_with_argv0(token))


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_close_ends_every_process_and_the_folder(
    sshd: Sshd, tmp_path: Path, isolation: str
) -> None:
    """Under bubblewrap nothing leaves the pid namespace: processes that called setsid (and
    dropped the variables a cleanup might look for with `env -u`) die with the sandbox.
    Without it, the session and the tree are killed (a setsid escape is out of its reach,
    which the facts say)."""
    token = f"clotho-ssh-{secrets.token_hex(4)}"
    root = tmp_path / "remote"
    sb = await open_sandbox(_config(sshd, root, isolation=isolation), {})
    folder = Path(sb.folder)
    try:
        await sb.exec(f"(exec -a {token}-plain sleep 1000) > /dev/null 2>&1 &")
        if isolation == "bwrap":
            await sb.exec(
                f"env -u HOME -u PATH /usr/bin/setsid -f bash -c 'exec -a {token}-setsid "
                "sleep 1000' > /dev/null 2>&1 < /dev/null"
            )
        await sb.exec("echo data > file")
        started = 2 if isolation == "bwrap" else 1
        assert await wait_until(lambda: len(pids_with_argv0(token)) == started)
        assert folder.is_dir() and (folder / "lease.json").is_file()
    finally:
        await sb.close()
    assert not await wait_dead(pids_with_argv0(token))
    assert not folder.exists()
    assert list(root.iterdir()) == []


async def test_an_unknown_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    """Known-hosts checking is on by default: a host whose key is not the one recorded (a
    machine in the middle) is refused before anything runs; a missing file is refused too;
    only the explicit opt-out connects."""
    other = tmp_path / "other_key"
    _keygen(other)
    wrong = tmp_path / "known_hosts"
    wrong.write_text(
        f"[127.0.0.1]:{sshd.port} {' '.join(Path(f'{other}.pub').read_text().split()[:2])}\n"
    )
    root = tmp_path / "remote"
    with pytest.raises(ConfigError, match="not in"):
        await open_sandbox(_config(sshd, root).model_copy(update={"known_hosts": str(wrong)}))
    with pytest.raises(ConfigError, match="no known-hosts file"):
        await open_sandbox(
            _config(sshd, root).model_copy(update={"known_hosts": str(tmp_path / "none")})
        )
    assert not root.exists() or list(root.iterdir()) == []  # nothing was made
    from clotho.sandbox.ssh.config import SshSandboxConfig

    assert SshSandboxConfig(host="h").known_hosts == "~/.ssh/known_hosts"  # on by default
    opted_out = _config(sshd, root).model_copy(
        update={"known_hosts": str(wrong), "check_host_key": False}
    )
    async with await open_sandbox(opted_out) as sb:
        assert (await sb.exec("echo in")).stdout == "in\n"


_LEFTOVER = """
import asyncio, json, sys
from clotho.sandbox import open_sandbox
from clotho.sandbox.ssh.config import SshSandboxConfig

async def main():
    sb = await open_sandbox(SshSandboxConfig.model_validate_json(sys.argv[1]), {"clotho.run": "r1"})
    await sb.exec(f"(exec -a {sys.argv[2]} sleep 1000) > /dev/null 2>&1 &")
    print(sb.folder, flush=True)
    await asyncio.Event().wait()  # until the test kills it

asyncio.run(main())
"""


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
async def test_gc_removes_what_a_killed_owner_left(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str
) -> None:
    """An owner killed with SIGKILL leaves its remote folder (and, without bubblewrap, its
    processes): `clotho sandbox gc`, which finds the host through CLOTHO_SSH_*, removes
    exactly that one and kills what ran in it; a live owner's sandbox stays."""
    from clotho.cli.sandbox_cmd import _backends, _collect

    root = tmp_path / "remote"
    token = f"clotho-ssh-{secrets.token_hex(4)}"
    config = _config(sshd, root, isolation=isolation)
    owner = await asyncio.create_subprocess_exec(
        *[sys.executable, "-c", _LEFTOVER, config.model_dump_json(), token],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    try:
        assert owner.stdout is not None
        line = await asyncio.wait_for(owner.stdout.readline(), PATIENCE_S * 2)
        left = Path(line.decode().strip())
        assert left.is_dir()
        assert await wait_until(lambda: bool(pids_with_argv0(token)))
    finally:
        owner.send_signal(signal.SIGKILL)
        await owner.wait()
    if isolation == "bwrap":  # the dropped connection ended its namespace already
        assert not await wait_dead(pids_with_argv0(token))
    else:  # nothing ends a plain process whose session is gone: gc must
        assert pids_with_argv0(token)
    marker = json.loads((left / "lease.json").read_text())
    assert marker["labels"][OWNER].endswith(f":{owner.pid}")
    live = await open_sandbox(config, {})
    try:
        for key, value in {
            "HOST": "127.0.0.1",
            "PORT": str(sshd.port),
            "USER": "root",
            "KEY": str(sshd.key),
            "KNOWN_HOSTS": str(sshd.known_hosts),
            "ROOT": str(root),
        }.items():
            monkeypatch.setenv(f"CLOTHO_SSH_{key}", value)
        # What `clotho sandbox ls/gc` asks (every kind's `listing`), kept to the ssh kind:
        # gc of the other kinds here would touch other tests' folders.
        backends, _problem = _backends(None, None)
        ssh = [b for b in backends if b.kind == "ssh"]
        for other in backends:
            if other.kind != "ssh":
                await other.aclose()
        assert len(ssh) == 1
        found, problems = await _collect(ssh)
        assert not problems
        ours = {r.id: r for _, r in found}
        assert set(ours) == {left.name, Path(live.folder).name}
        assert ours[left.name].orphaned() and not ours[Path(live.folder).name].orphaned()
        assert ours[left.name].labels["clotho.run"] == "r1"
        for backend, record in found:  # `clotho sandbox gc` without --all
            if record.orphaned():
                await backend.remove(record)
        await ssh[0].aclose()
        assert not left.exists()
        assert Path(live.folder).is_dir()
        assert not await wait_dead(pids_with_argv0(token))
        assert (await live.exec("echo still")).stdout == "still\n"
    finally:
        await live.close()


async def test_close_is_idempotent_and_final(sshd: Sshd, tmp_path: Path) -> None:
    from clotho.errors import SandboxError

    sb = await open_sandbox(_config(sshd, tmp_path / "remote"), {})
    await sb.close()
    await sb.close()
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_verification_sees_the_files_and_nothing_else(ssh_sandbox: Any) -> None:
    """Digests by the host's own tools; `stop_agent` ends the agent's processes and shell;
    `exec_fresh` is a new process over the sandbox's files (the workspace and /tmp the agent
    wrote) with none of the agent's environment, stdin given, output capped, and killed
    with what it started at its timeout."""
    from clotho.errors import SandboxError

    sb = ssh_sandbox
    token = f"clotho-ssh-{secrets.token_hex(4)}"
    digests = await sb.digests(["/usr/bin/bash", "/bin/sh", "/no/such/file"])
    bash = await asyncio.to_thread(Path("/usr/bin/bash").read_bytes)
    assert digests["/usr/bin/bash"] == hashlib.sha256(bash).hexdigest()
    assert (
        digests["/bin/sh"] == "link:" + hashlib.sha256(os.readlink("/bin/sh").encode()).hexdigest()
    )
    assert digests["/no/such/file"] is None
    await sb.exec(
        f"export AGENT_VAR=1; echo t > /tmp/t; echo w > work.txt; "
        f"(exec -a {token}-agent sleep 1000) > /dev/null 2>&1 &"
    )
    assert await wait_until(lambda: bool(pids_with_argv0(f"{token}-agent")))
    await sb.stop_agent()
    assert not await wait_dead(pids_with_argv0(f"{token}-agent"))
    with pytest.raises(SandboxError):
        await sb.exec("true")
    r = await sb.exec_fresh(
        'cat /tmp/t work.txt; echo "${AGENT_VAR:-clean} $FRESH"; cat', timeout=PATIENCE_S,
        env={"FRESH": "f"}, stdin=b"in",
    )  # fmt: skip
    assert (r.exit_code, r.stdout) == (0, "t\nw\nclean f\nin")
    r = await sb.exec_fresh("yes | head -c 100000", timeout=PATIENCE_S, max_output_bytes=10)
    assert r.stdout == "y\n" * 5
    r = await sb.exec_fresh(
        f"(exec -a {token}-fresh sleep 1000) & exec -a {token}-fresh sleep 1000", timeout=2
    )
    assert r.timed_out and r.exit_code == -9
    assert not await wait_dead(pids_with_argv0(f"{token}-fresh"))


@pytest.mark.parametrize(("agent", "passed"), [("oracle", 1), ("nop", 0)])
async def test_a_bundled_task_runs_on_ssh(
    sshd: Sshd, tmp_path: Path, agent: str, passed: int
) -> None:
    """`clotho eval --sandbox ssh` end to end: the task's oracle passes, doing nothing
    fails, and nothing is left on the remote host."""
    root = tmp_path / "remote"
    repo = Path(__file__).parent.parent
    env = {
        **os.environ,
        "CLOTHO_SSH_HOST": "127.0.0.1",
        "CLOTHO_SSH_PORT": str(sshd.port),
        "CLOTHO_SSH_USER": "root",
        "CLOTHO_SSH_KEY": str(sshd.key),
        "CLOTHO_SSH_KNOWN_HOSTS": str(sshd.known_hosts),
        "CLOTHO_SSH_ROOT": str(root),
    }
    out = tmp_path / "run"
    proc = await asyncio.create_subprocess_exec(
        *[str(Path(sys.executable).parent / "clotho"), "eval", str(repo / "examples" / "tasks")],
        *["--filter", "fix-roman-numerals", "--agent", agent, "--sandbox", "ssh"],
        *["--out", str(out)],
        env=env,
        cwd=repo,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output, _ = await proc.communicate()
    assert proc.returncode == 0, output.decode(errors="replace")[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["n_scored"], metrics["n_passed"]) == (1, passed)
    assert json.loads((out / "config.json").read_text())["sandbox"]["backend"] == "ssh"
    assert list(root.iterdir()) == []


async def test_limits_are_the_stated_rlimits(sshd: Sshd, tmp_path: Path) -> None:
    """The limits an ssh sandbox has are rlimits, set before its shell starts and stated:
    a file past file_size_mb is cut off, whoever writes it."""
    config = _config(sshd, tmp_path / "remote", memory_mb=2048, pids_limit=4000, file_size_mb=1)
    async with await open_sandbox(config) as sb:
        r = await sb.exec("ulimit -v; ulimit -u; ulimit -f")
        assert r.stdout.split() == [str(2048 * 1024), "4000", "1024"]
        r = await sb.exec("head -c 2M /dev/zero > big; stat -c %s big")
        assert r.stdout.strip() == str(1 << 20) and r.exit_code == 0
        limits = sb.facts["limits"]
        assert "ulimit -v" in limits["memory"] and limits["cpu"] == "none"


async def test_a_flood_between_commands_leaves_the_protocol_whole(ssh_sandbox: Any) -> None:
    """Background programs writing without end on both streams (the channel is paused
    between commands, resumed for each) leave every command its own end and exit code.
    One channel carries both streams: a stream done with its command must not pause the
    channel while the other's end marker is still on its way (that hung about one command
    in eighty under load)."""
    sb = ssh_sandbox
    await sb.exec("(yes flood >&2 &); (yes flood &)", timeout=PATIENCE_S)
    for n in range(20):
        r = await sb.exec(f"(exit {n})", timeout=PATIENCE_S)
        assert (r.exit_code, r.timed_out) == (n, False)
    await sb.exec("cat /proc/[0-9]*/comm | grep -c '^yes$' > floods", timeout=PATIENCE_S)
    assert await sb.read_file("floods") == b"2\n"  # both floods ran throughout
