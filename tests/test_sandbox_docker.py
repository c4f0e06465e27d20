"""The Docker sandbox (sandbox/docker/) against a real Docker engine.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true), where the
daemon is set up on purpose, its absence fails the tests instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import run_past_timeout
from tests.support import PATIENCE_S, wait_until

from clotho.errors import LimitExceeded, SandboxError
from clotho.sandbox import open_sandbox
from clotho.sandbox.base import ExecResult
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker import archive
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.host import proctree
from clotho.sandbox.host.leases import LEASE_EXPIRES, OWNER

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

BASE_IMAGE = "clotho/base:bookworm"


async def inspect(docker: Any, sb: DockerSandbox) -> dict[str, Any]:
    return await docker.containers.container(sb.id).show()


async def container_args(sb: DockerSandbox) -> list[str]:
    r = await sb.exec("ps -eo args=")
    assert r.exit_code == 0, r.stderr
    return r.stdout.splitlines()


async def wait_for_args(sb: DockerSandbox, token: str, count: int) -> list[str]:
    """The container's processes with `token` in their arguments, once there are `count`."""
    found: list[str] = []

    async def counted() -> bool:
        found[:] = [a for a in await container_args(sb) if token in a]
        return len(found) == count

    await wait_until(counted)
    return found


FORK_100 = """python3 -c '
import subprocess
procs = []
try:
    for _ in range(100):
        procs.append(subprocess.Popen(["sleep", "30"]))
    print("started", len(procs))
except OSError:
    print("limited at", len(procs))
for p in procs:
    p.kill()
    p.wait()
'"""


# --- exec ------------------------------------------------------------------------------------


@requires_docker
async def test_exec_output_exit_code_and_cwd(docker_sandbox: DockerSandbox) -> None:
    r = await docker_sandbox.exec("echo out; echo err >&2; exit 3")
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == ("out\n", "err\n", 3, False)
    assert not r.ok
    r = await docker_sandbox.exec("printf 'no newline'")
    assert r.stdout == "no newline" and r.ok
    assert docker_sandbox.workdir == "/app"
    assert (await docker_sandbox.exec("pwd")).stdout == "/app\n"
    assert (await docker_sandbox.exec("mkdir -p sub/dir && cd sub && pwd")).stdout == "/app/sub\n"
    assert (await docker_sandbox.exec("pwd", cwd="sub/dir")).stdout == "/app/sub/dir\n"
    assert (await docker_sandbox.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await docker_sandbox.exec("pwd")).stdout == "/app\n"  # cd does not stick
    r = await docker_sandbox.exec("pwd", cwd="/no/such/dir")
    assert r.exit_code == 126
    r = await docker_sandbox.exec("exit 7")
    assert r.exit_code == 7
    r = await docker_sandbox.exec("if then fi")
    assert r.exit_code != 0 and "syntax error" in r.stderr
    assert (await docker_sandbox.exec("echo still alive")).stdout == "still alive\n"


@requires_docker
async def test_environment(docker: Any) -> None:
    config = DockerSandboxConfig(env={"FROM_CONFIG": "c 1"})
    assert "PYTEST_CURRENT_TEST" in os.environ
    async with await open_sandbox(config) as sb:
        r = await sb.exec(
            'echo "$FROM_CONFIG|$PER_CALL|${PYTEST_CURRENT_TEST-unset}|$HOME|$PATH"',
            env={"PER_CALL": "it's $quoted"},
        )
        from_config, per_call, leaked, home, path = r.stdout.rstrip("\n").split("|")
        assert from_config == "c 1"
        assert per_call == "it's $quoted"
        assert leaked == "unset"
        assert home == "/root"
        assert "/usr/bin" in path.split(":")
        assert (await sb.exec('echo "${PER_CALL-unset}"')).stdout == "unset\n"
        assert (await sb.exec("id -un")).stdout == "root\n"
        assert (await sb.exec("id -un", user="nobody")).stdout == "nobody\n"


@requires_docker
async def test_timeout_kills_the_tree_but_not_the_shell_or_background(
    docker_sandbox: DockerSandbox,
) -> None:
    token = f"clotho-probe-{secrets.token_hex(4)}"
    r = await docker_sandbox.exec(f"(exec -a {token}-bg sleep 300) & echo started")
    assert r.stdout == "started\n"

    async def run(timeout: float) -> ExecResult:
        await docker_sandbox.exec("rm -f /tmp/started")
        return await docker_sandbox.exec(
            f"(echo >> /tmp/started; exec -a {token}-child sleep 300) & "
            f"bash -c 'echo >> /tmp/started; exec -a {token}-grandchild sleep 300'",
            timeout=timeout,
        )

    async def started() -> bool:
        return (await docker_sandbox.exec("cat /tmp/started 2>/dev/null")).stdout == "\n\n"

    r = await run_past_timeout(run, started)
    assert r.timed_out and r.exit_code == -9 and not r.ok
    survivors = await wait_for_args(docker_sandbox, token, 1)
    assert survivors == [f"{token}-bg 300"]
    r = await docker_sandbox.exec("echo after")
    assert r.stdout == "after\n" and r.exit_code == 0
    # The background process keeps running across later commands.
    assert await wait_for_args(docker_sandbox, token, 1) == [f"{token}-bg 300"]


# --- container settings ----------------------------------------------------------------------


@requires_docker
async def test_network_is_none_by_default(docker_sandbox: DockerSandbox, docker: Any) -> None:
    r = await docker_sandbox.exec("cat /proc/net/dev")
    interfaces = [line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]
    info = await inspect(docker, docker_sandbox)
    assert info["HostConfig"]["NetworkMode"] == "none"
    assert info["Config"]["WorkingDir"] == "/app"
    assert info["Config"]["Image"] == BASE_IMAGE
    assert info["HostConfig"]["Init"] is True
    assert info["State"]["Running"] is True


@requires_docker
async def test_network_host_only_when_asked_for_by_name(docker: Any) -> None:
    # The host's network, unguarded: refused unless accepted in so many words.
    with pytest.raises(ValueError, match="host_network=true"):
        DockerSandboxConfig(network=True)
    async with await open_sandbox(DockerSandboxConfig(network=True, host_network=True)) as sb:
        assert isinstance(sb, DockerSandbox)
        info = await inspect(docker, sb)
        assert info["HostConfig"]["NetworkMode"] == "host"
        r = await sb.exec("cat /proc/net/dev")
        interfaces = {line.split(":")[0].strip() for line in r.stdout.splitlines()[2:]}
        host = {
            line.split(":")[0].strip()
            for line in Path("/proc/net/dev").read_text().splitlines()[2:]
        }
        assert interfaces == host


@requires_docker
@pytest.mark.parametrize("lease_s", [None, 120])
async def test_labels_and_lease_on_the_container(docker: Any, lease_s: float | None) -> None:
    """The lease runs from the open (6 hours unless said otherwise): bracketed by the
    clock read before and after it, never compared with a window."""
    marker = f"labels-{secrets.token_hex(4)}"
    before = time.time()
    sb = await open_sandbox(
        DockerSandboxConfig(),
        {"clotho.test": marker},
        **({} if lease_s is None else {"lease_s": lease_s}),
    )
    after = time.time()
    try:
        assert isinstance(sb, DockerSandbox)
        labels = (await inspect(docker, sb))["Config"]["Labels"]
        assert labels["clotho"] == "1"
        assert labels[OWNER] == f"{socket.gethostname()}:{os.getpid()}"
        lease = 6 * 3600 if lease_s is None else lease_s
        assert int(before) + lease <= int(labels[LEASE_EXPIRES]) <= after + lease
        assert labels["clotho.test"] == marker and sb.labels == {"clotho.test": marker}
        found = await docker.containers.list(
            all=True, filters={"label": [f"{OWNER}={labels[OWNER]}", f"clotho.test={marker}"]}
        )
        assert [c.id for c in found] == [sb.id]
    finally:
        await sb.close()


@requires_docker
async def test_resource_limits_are_applied(docker: Any) -> None:
    config = DockerSandboxConfig(cpus=0.5, memory_mb=256, pids_limit=64)
    async with await open_sandbox(config) as sb:
        assert isinstance(sb, DockerSandbox)
        host = (await inspect(docker, sb))["HostConfig"]
        assert host["NanoCpus"] == 500_000_000
        assert host["Memory"] == 256 * 1024 * 1024
        assert host["PidsLimit"] == 64
        r = await sb.exec(
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        )
        assert r.stdout.strip() == str(256 * 1024 * 1024)
        # The pids limit bites: 100 processes cannot all start (python, as bash retries
        # forks), and a refused fork is the agent's failure of kind `limit`.
        with pytest.raises(LimitExceeded, match="process limit"):
            await sb.exec(FORK_100, timeout=30)
    # Defaults: a pids limit and a memory limit (without swap), no CPU limit.
    async with await open_sandbox(DockerSandboxConfig()) as sb:
        assert isinstance(sb, DockerSandbox)
        host = (await inspect(docker, sb))["HostConfig"]
        assert host["PidsLimit"] == 4096
        assert not host.get("NanoCpus")
        assert host["Memory"] == host["MemorySwap"] == 4096 << 20


# --- files -----------------------------------------------------------------------------------


@requires_docker
async def test_read_file_follows_symlinks(docker_sandbox: DockerSandbox) -> None:
    await docker_sandbox.write_file("target.txt", b"pointed at")
    await docker_sandbox.exec("ln -s target.txt rel-link && ln -s /app/target.txt /tmp/abs-link")
    assert await docker_sandbox.read_file("rel-link") == b"pointed at"
    assert await docker_sandbox.read_file("/tmp/abs-link") == b"pointed at"


@requires_docker
async def test_a_folder_is_refused_without_fetching_its_archive(
    docker_sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`read_file` of a folder asks for its size and kind, never for the archive of the
    whole tree (of `/`: the container's every file)."""
    asked: list[str] = []
    real = archive.archive_stream

    def recorded(container: Any, path: str, what: str) -> Any:
        asked.append(path)
        return real(container, path, what)

    monkeypatch.setattr(archive, "archive_stream", recorded)
    await docker_sandbox.write_file("f.txt", b"file")
    for folder in ("/", "/usr", "/app"):
        with pytest.raises(IsADirectoryError):
            await docker_sandbox.read_file(folder)
    assert await docker_sandbox.read_file("f.txt") == b"file"
    assert asked == ["/app/f.txt"]  # the recorder does see the archives fetched


# --- lifecycle -------------------------------------------------------------------------------


@requires_docker
async def test_close_removes_the_container_without_a_grace_period(docker: Any) -> None:
    from aiodocker.exceptions import DockerError

    opened = int(time.time())  # the events from here on are replayed: none is missed
    sb = await open_sandbox(DockerSandboxConfig())
    assert isinstance(sb, DockerSandbox)
    # Processes that ignore SIGTERM: a `docker stop` would wait its 10 s grace period.
    r = await sb.exec("(trap '' TERM; exec sleep 300) & (trap '' TERM; exec sleep 301) & echo ok")
    assert r.stdout == "ok\n"
    assert (await inspect(docker, sb))["State"]["Running"] is True
    events = docker.events.subscribe(since=str(opened), filters=json.dumps({"container": [sb.id]}))
    await sb.close()
    seen: list[tuple[str, str]] = []
    while not seen or seen[-1][0] != "destroy":
        event = await asyncio.wait_for(events.get(), PATIENCE_S)
        assert event is not None, seen
        seen.append((event["Action"], event["Actor"]["Attributes"].get("signal", "")))
    await docker.events.stop()
    # No SIGTERM and grace period: the first signal the container got, if any, was SIGKILL.
    # (Its shell, which ends at the end of its input, may have ended the container first:
    # then the removal found nothing to kill.)
    kills = [sig for action, sig in seen if action == "kill"]
    assert kills[:1] in ([], ["9"]) and "15" not in kills, seen
    assert "stop" not in [action for action, _ in seen], seen
    with pytest.raises(DockerError) as info:
        await inspect(docker, sb)
    assert info.value.status == 404
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")


@requires_docker
async def test_failed_start_leaves_no_container(docker: Any) -> None:
    marker = f"failed-start-{secrets.token_hex(4)}"
    with pytest.raises(SandboxError, match="cannot start a container"):
        await open_sandbox(DockerSandboxConfig(workdir="/dev/null/app"), labels={"probe": marker})
    with pytest.raises(SandboxError, match="no-such-image"):
        await open_sandbox(
            DockerSandboxConfig(image="clotho/no-such-image:never"), labels={"probe": marker}
        )
    left = await docker.containers.list(all=True, filters={"label": [f"probe={marker}"]})
    assert left == []


async def test_missing_docker_socket_is_a_sandbox_error(tmp_path: Path) -> None:
    # Needs no daemon: the point is a clear error instead of a hang.
    socket_path = tmp_path / "missing" / "docker.sock"
    config = DockerSandboxConfig(docker_url=f"unix://{socket_path}")
    async with asyncio.timeout(PATIENCE_S):
        with pytest.raises(SandboxError) as info:
            await open_sandbox(config)
    try:
        import aiodocker  # noqa: F401
    except ImportError:
        assert "pip install" in str(info.value)
    else:
        assert str(socket_path) in str(info.value)


async def test_image_without_bash_falls_back_to_sh(docker: Any, tmp_path: Path) -> None:
    from clotho.sandbox.docker.images import build_image

    (tmp_path / "Dockerfile").write_text(
        "FROM clotho/base:bookworm\nRUN rm -f /bin/bash /usr/bin/bash\n"
    )
    tag = await build_image(docker, tmp_path, "clotho-test/nobash:latest")
    try:
        sb = await open_sandbox(DockerSandboxConfig(image=tag))
        assert isinstance(sb, DockerSandbox)
        try:
            r = await sb.exec("echo hi; command -v bash || echo no-bash; exit 3")
            assert (r.stdout, r.exit_code) == ("hi\nno-bash\n", 3)
            r = await sb.exec("sleep 300", timeout=0.3)
            assert r.timed_out
            assert (await sb.exec("echo after")).stdout == "after\n"
        finally:
            await sb.close()
    finally:
        await docker.images.delete(tag, force=True)


async def test_the_shell_is_the_containers_own_process(docker: Any) -> None:
    """No exec to start a sandbox: the container's command is the shell (on the FIFOs)."""
    sb = await open_sandbox(DockerSandboxConfig())
    assert isinstance(sb, DockerSandbox)
    try:
        info = await inspect(docker, sb)
        assert (
            info["Config"]["Cmd"][:2] == ["sh", "-c"]
            and "clotho-shell:" in info["Config"]["Cmd"][2]
        )
        assert not info.get("ExecIDs")
        await sb.exec("export KEPT=yes")  # a session shell: bash was found and announced
        assert (await sb.exec("echo $KEPT $HOME; pwd")).stdout == "yes /root\n/app\n"
        shell_pid = sb._shell.pid
        assert shell_pid is not None and proctree.comm(shell_pid) == "bash"
        assert proctree.comm(info["State"]["Pid"]) == "docker-init"  # pid 1 reaps zombies
    finally:
        await sb.close()


async def test_an_images_entrypoint_still_runs(docker: Any, tmp_path: Path) -> None:
    """An image with an ENTRYPOINT keeps it: the container runs `sleep infinity` through it
    and the shell is exec'd, as `docker compose` would run the task's service."""
    from clotho.sandbox.docker.images import build_image

    (tmp_path / "Dockerfile").write_text(
        "FROM clotho/base:bookworm\n"
        'ENTRYPOINT ["/bin/sh", "-c", "echo entry > /tmp/entry-ran; exec \\"$@\\"", "--"]\n'
    )
    tag = await build_image(docker, tmp_path, f"clotho-test/entrypoint:{secrets.token_hex(4)}")
    try:
        sb = await open_sandbox(DockerSandboxConfig(image=tag))
        assert isinstance(sb, DockerSandbox)
        try:
            assert (await sb.exec("cat /tmp/entry-ran")).stdout == "entry\n"
            assert (await inspect(docker, sb))["Config"]["Cmd"] == ["sleep", "infinity"]
        finally:
            await sb.close()
    finally:
        await docker.images.delete(tag, force=True)


@pytest.mark.parametrize(
    ("dockerfile", "why"),
    [
        ('ENTRYPOINT ["false"]\n', "exited at once (exit code 1)"),
        ("USER nobody\n", "runs as USER nobody"),
    ],
    ids=["entrypoint-false", "user-nobody"],
)
async def test_an_image_that_cannot_run_the_shell_is_the_tasks_error(
    docker: Any, tmp_path: Path, dockerfile: str, why: str
) -> None:
    """A container the image's own ENTRYPOINT ends, or an image whose USER is not root, is
    the task's error (`task`: not retried, not an infrastructure failure), saying why, and
    leaves no container behind."""
    from clotho.errors import TaskError
    from clotho.sandbox.docker.images import build_image

    (tmp_path / "Dockerfile").write_text(f"FROM clotho/base:bookworm\n{dockerfile}")
    tag = await build_image(docker, tmp_path, f"clotho-test/unfit:{secrets.token_hex(4)}")
    try:
        with pytest.raises(TaskError, match=re.escape(why)) as caught:
            await open_sandbox(DockerSandboxConfig(image=tag))
        assert caught.value.kind == "task"
        left = await docker.containers.list(all=True, filters={"ancestor": [tag]})
        assert left == []
    finally:
        await docker.images.delete(tag, force=True)


@pytest.mark.parametrize("stdio", ["fifo", "attach"])
async def test_both_stdio_paths_run_commands(docker: Any, stdio: str) -> None:
    sb = await open_sandbox(DockerSandboxConfig(stdio=stdio))
    assert isinstance(sb, DockerSandbox)
    try:
        r = await sb.exec("echo out; echo err >&2; exit 4")
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 4)
        big = await sb.exec("head -c 300000 /dev/zero | tr '\\0' x")
        assert big.stdout == "x" * 300000
        assert (sb.io_dir is not None) == (stdio == "fifo")
        # A shell killed from outside fails the next command instead of hanging it.
        shell_pid = sb._shell.pid
        assert shell_pid is not None
        inner = proctree.descendants(shell_pid)  # the session shell under the wrapper loop
        os.kill(shell_pid, signal.SIGKILL)  # the wrapper first: it must not restart anything
        for pid in inner:  # it may be gone already: the wrapper was the container's process
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with pytest.raises(SandboxError):
            async with asyncio.timeout(PATIENCE_S):
                await sb.exec("echo never")
    finally:
        await sb.close()
    if stdio == "fifo":
        assert sb.io_dir is not None and not sb.io_dir.exists()


@pytest.mark.parametrize("slots", [1, 2])
async def test_the_fifo_folder_takes_no_files_from_the_agent(docker: Any, slots: int) -> None:
    """The host folder behind /.clotho-io is outside the container's disk quota: the shell
    opens its FIFOs there, and may store nothing (a read-only bind; FIFOs stay writable).
    Slots without isolation see it too (isolated ones get a tmpfs of their own there)."""
    config = DockerSandboxConfig(slots_per_container=slots, slot_isolation="none")
    sb = await open_sandbox(config)
    try:
        r = await sb.exec(
            "for d in /.clotho-io /.clotho-io/*/; do "
            "  head -c 1000000 /dev/zero > $d/fill 2>/dev/null && echo wrote $d; "
            "  mkdir $d/sub 2>/dev/null && echo made $d; done; echo end"
        )
        assert r.stdout == "end\n", r.stdout
        assert (await sb.exec("echo still talking")).stdout == "still talking\n"
    finally:
        await sb.close()


async def test_sandbox_ls_names_fifo_folders_and_slot_containers(docker: Any) -> None:
    run = f"ls-{secrets.token_hex(4)}"
    one = await open_sandbox(DockerSandboxConfig(), labels={"clotho.run": f"{run}-one"})
    shared = await open_sandbox(
        DockerSandboxConfig(slots_per_container=2), labels={"clotho.run": f"{run}-shared"}
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clotho", "sandbox", "ls",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "300"},
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        await one.close()
        await shared.close()
    assert proc.returncode == 0, stderr.decode()
    rows = [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in stdout.decode().splitlines()
        if run in line
    ]
    # backend, id, owner, alive, run, task, slots, ...
    kinds = sorted((cells[0], cells[4], cells[6]) for cells in rows)
    # The shared container says how many slots it hosts and how they are isolated; the host
    # folders holding the containers' FIFOs are named as such, not as local sandboxes.
    assert kinds[:2] == [("docker", f"{run}-one", "-"), ("docker", f"{run}-shared", kinds[1][2])]
    assert kinds[1][2] in ("2 (bwrap)", "2 (none)"), kinds
    assert [k[0] for k in kinds[2:]] == ["docker-io", "docker-io"], kinds
