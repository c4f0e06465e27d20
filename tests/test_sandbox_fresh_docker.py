"""Verification primitives of Docker sandboxes against a real engine: `exec_fresh` shares
nothing with the agent's shell, `stop_agent` stops what the agent left for good (a slot's
only its own), `digests` see replaced and shadowed programs from outside the container.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true) its absence
fails the tests instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.support import PATIENCE_S, wait_until

from clotho.errors import SandboxError
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DEFAULT_PATH, DockerSandboxConfig
from clotho.sandbox.docker import freeze
from clotho.sandbox.docker.sandbox import DockerSandbox
from clotho.sandbox.docker.slot_sandbox import IsolatedSlotSandbox, SlotSandbox
from clotho.sandbox.docker.slots import SlotHost

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = requires_docker

# A detached loop rewriting a file; `tag` (its $0) names it in ps.
LOOP = (
    "nohup setsid bash -c 'while :; do date +%s%N > {path}; sleep 0.05; done' {tag} "
    ">/dev/null 2>&1 &"
)


async def changing(read: Callable[[str], Awaitable[str]], path: str) -> bool:
    """Whether the file a loop rewrites is seen to change: the loop runs (a positive control
    that makes "stopped" mean something)."""
    first = await read(path)

    async def moved() -> bool:
        return (await read(path)) not in ("", first)

    return await wait_until(moved)


async def running_is_empty(slot: Any, tag: str) -> bool:
    return await running(slot, tag) == []


async def running(slot: Any, tag: str) -> list[str]:
    """The container's processes with `tag` in their arguments that are not stopped or dead."""
    ps = (await slot.exec("ps -eo stat=,args=")).stdout.splitlines()
    return [line for line in ps if tag in line and line.lstrip()[:1] not in "TZ"]


# --- exec_fresh --------------------------------------------------------------------------


async def test_fresh_process_ignores_what_the_session_set(docker_sandbox: DockerSandbox) -> None:
    setup = (
        "f() { echo FUNC; }; export -f f; alias ls='echo ALIAS'; shopt -s expand_aliases; "
        "printf 'echo BASHENV\\n' > /tmp/benv; export BASH_ENV=/tmp/benv ENV=/tmp/benv; "
        "mkdir -p /tmp/evil; printf '#!/bin/sh\\necho EVIL\\n' > /tmp/evil/cat; "
        "chmod +x /tmp/evil/cat; export PATH=/tmp/evil:$PATH; export SECRET=agent; "
        "trap 'echo DEBUG' DEBUG"
    )
    assert (await docker_sandbox.exec(setup)).exit_code == 0
    assert "FUNC" in (await docker_sandbox.exec("f")).stdout  # the session does have them
    r = await docker_sandbox.exec_fresh(
        'type f 2>&1 || true; ls /; echo x | cat; echo "[$SECRET][$MINE]"; pwd; id -u',
        timeout=30,
        env={"MINE": "given"},
    )
    assert r.exit_code == 0, r.stderr
    for planted in ("FUNC", "ALIAS", "BASHENV", "EVIL", "DEBUG", "agent"):
        assert planted not in r.stdout + r.stderr
    assert "[][given]" in r.stdout
    assert r.stdout.splitlines()[-2:] == [docker_sandbox.workdir, "0"]


async def test_fresh_stdin_output_cap_and_timeout(docker_sandbox: DockerSandbox) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB through stdin
    r = await docker_sandbox.exec_fresh("cat > /tmp/in; sha256sum /tmp/in", timeout=30, stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    r = await docker_sandbox.exec_fresh("head -c 50000000 /dev/zero; echo tail >&2", timeout=30,
                                 max_output_bytes=1000)  # fmt: skip
    assert r.stdout.startswith("\0" * 1000) and "dropped" in r.stdout and len(r.stdout) < 1200
    assert r.stderr == "tail\n"
    # A child holding the pipe is not waited for: the call ends, it does not time out.
    r = await docker_sandbox.exec_fresh("(sleep 300 &); echo left", timeout=PATIENCE_S)
    assert r.stdout == "left\n" and not r.timed_out and r.exit_code == 0
    r = await docker_sandbox.exec_fresh("sleep 300", timeout=1)
    assert r.timed_out


# --- stop_agent --------------------------------------------------------------------------


@pytest.fixture(params=["local", "remote"])
def daemon(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`remote`: a stand-in (a test double) for a daemon on another host, whose processes
    are not this host's to read or signal: `freeze.local_pid` answers None, so the sandbox
    holds through the Engine alone and stops with its script run in the container."""
    if request.param == "remote":

        async def not_local(container: Any) -> None:
            return None

        monkeypatch.setattr(freeze, "local_pid", not_local)
    return str(request.param)


async def test_stop_agent_stops_a_background_loop_for_good(
    docker_sandbox: DockerSandbox, daemon: str
) -> None:
    await docker_sandbox.exec(LOOP.format(path="/tmp/beat", tag="loop"))
    await docker_sandbox.exec("(setsid sh -c 'sleep 1000 & exec sleep 1001' &) >/dev/null 2>&1")

    async def read(path: str) -> str:
        return (
            await docker_sandbox.exec_fresh(f"cat {path} 2>/dev/null", timeout=PATIENCE_S)
        ).stdout

    assert await changing(read, "/tmp/beat")  # it runs
    await docker_sandbox.stop_agent()
    assert docker_sandbox.stopped
    ps = (await docker_sandbox.exec_fresh("ps -eo stat=,args=", timeout=PATIENCE_S)).stdout
    alive = [line for line in ps.splitlines() if line[:1] not in "TZ" and "ps -eo" not in line]
    assert len(alive) == 1 and "docker-init" in alive[0], ps  # the shell is stopped, no more
    assert await read("/tmp/beat") == await read("/tmp/beat")
    for call in (
        docker_sandbox.exec("true"),
        docker_sandbox.read_file("/tmp/beat"),
        docker_sandbox.write_file("/tmp/x", b"x"),
    ):
        with pytest.raises(SandboxError):
            await call
    await docker_sandbox.stop_agent()  # again: idempotent, ends what a fresh process started
    assert (await docker_sandbox.exec_fresh("echo ok", timeout=PATIENCE_S)).stdout == "ok\n"


async def test_stop_agent_without_docker_init() -> None:
    """The shell is then pid 1, which nothing inside can stop: the host stops it."""
    async with await open_sandbox(DockerSandboxConfig(init=False)) as sb:
        assert isinstance(sb, DockerSandbox)
        await sb.exec(LOOP.format(path="/tmp/beat", tag="loop"))

        async def read(path: str) -> str:
            return (await sb.exec_fresh(f"cat {path} 2>/dev/null", timeout=PATIENCE_S)).stdout

        assert await changing(read, "/tmp/beat")  # it runs
        await sb.stop_agent()
        ps = (await sb.exec_fresh("ps -eo pid=,stat=,args=", timeout=PATIENCE_S)).stdout
        rows = [line.split(None, 2) for line in ps.splitlines()]
        assert [row[1][:1] for row in rows if row[0] == "1"] == ["T"], ps
        alive = [row for row in rows if row[1][:1] not in "TZ" and "ps -eo" not in row[2]]
        assert alive == [], ps  # the loop too
        assert await read("/tmp/beat") == await read("/tmp/beat")


async def test_hold_agent_freezes_until_released(
    docker_sandbox: DockerSandbox, daemon: str
) -> None:
    """Held, a loop the agent left writes nothing (its file, read from the host, stays the
    same) until `release_agent`; then it runs again, and `stop_agent` ends it."""
    await docker_sandbox.exec(LOOP.format(path="/tmp/beat", tag="loop"))

    async def fresh(path: str) -> str:
        return (await docker_sandbox.exec_fresh(f"cat {path}", timeout=PATIENCE_S)).stdout

    async def digest(path: str) -> str:
        return str((await docker_sandbox.digests([path]))[path])

    assert await changing(fresh, "/tmp/beat")  # it runs
    assert (await docker_sandbox.hold_agent() or 0) >= 1  # the loop (and its sleep)
    held = await digest("/tmp/beat")
    # The daemon's pause (a remote one's too): the cgroup freezer holds every process.
    assert (await docker_sandbox.container.show())["State"]["Paused"] is True
    assert await digest("/tmp/beat") == held
    await docker_sandbox.release_agent()
    assert await changing(digest, "/tmp/beat")  # it runs again
    await docker_sandbox.stop_agent()
    assert await digest("/tmp/beat") == await digest("/tmp/beat")


async def test_stop_agent_after_a_hold_that_was_never_released(
    docker_sandbox: DockerSandbox, daemon: str
) -> None:
    """A verification that ends before the tests (tamper, no services) stops a container
    its hold left paused: everything but docker-init ends, and fresh processes run."""
    await docker_sandbox.exec(LOOP.format(path="/tmp/beat", tag="loop"))
    assert (await docker_sandbox.hold_agent() or 0) >= 1
    await docker_sandbox.stop_agent()
    assert (await docker_sandbox.container.show())["State"]["Paused"] is False
    ps = (await docker_sandbox.exec_fresh("ps -eo stat=,args=", timeout=PATIENCE_S)).stdout
    alive = [line for line in ps.splitlines() if line[:1] not in "TZ" and "ps -eo" not in line]
    assert len(alive) == 1 and "docker-init" in alive[0], ps


async def test_the_twin_runs_nothing_of_the_images_own() -> None:
    """A twin runs no entrypoint and no health check of its snapshot (files the agent could
    edit), and finds its first program on the harness's PATH, not the image's."""
    image = f"clotho-test/healthcheck:{secrets.token_hex(4)}"
    dockerfile = (
        "FROM clotho/base:bookworm\nENV PATH=/opt/agent/bin:$PATH\n"
        "RUN printf '#!/bin/sh\\nexec \"$@\"\\n' > /entry.sh && chmod +x /entry.sh\n"
        'ENTRYPOINT ["/entry.sh"]\nHEALTHCHECK --interval=1s CMD /app/health.sh\n'
    )
    built = await asyncio.create_subprocess_exec(
        "docker", "build", "-q", "-t", image, "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await built.communicate(dockerfile.encode())
    assert built.returncode == 0, output.decode()
    try:
        async with await open_sandbox(DockerSandboxConfig(image=image)) as sb:
            assert isinstance(sb, DockerSandbox)
            own = (await sb.container.show())["Config"]
            assert own["Healthcheck"]["Test"][-1] == "/app/health.sh"  # the image's, kept
            assert await sb.hold_agent() is not None
            twin = await sb.verification_twin()
            try:
                config = (await twin.container.show())["Config"]
                assert config["Healthcheck"]["Test"] == ["NONE"], config
                assert not config.get("Entrypoint"), config
                path = [e for e in config["Env"] if e.startswith("PATH=")]
                assert path == [f"PATH={DEFAULT_PATH}"], config["Env"]
                ps = (await twin.exec_fresh("ps -eo args=", timeout=PATIENCE_S)).stdout
                assert "/entry.sh" not in ps, ps
            finally:
                await twin.close()
                await sb.release_agent()
    finally:
        removed = await asyncio.create_subprocess_exec(
            "docker", "rmi", "-f", image, stdout=asyncio.subprocess.DEVNULL
        )
        await removed.wait()


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_slot_stop_leaves_its_neighbour_running(slot_host: SlotHost, isolation: str) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation)
    a, b = await asyncio.gather(slot_host.open(config), slot_host.open(config))
    expected = IsolatedSlotSandbox if isolation == "bwrap" else SlotSandbox
    assert type(a) is expected and a.container_id == b.container_id
    tag_a, tag_b = (f"loop-{secrets.token_hex(4)}" for _ in "ab")
    await a.exec(LOOP.format(path="beat", tag=tag_a))
    await b.exec(LOOP.format(path="beat", tag=tag_b))
    await a.exec("export -f -n; f() { echo FUNC; }; export -f f")

    async def read_a(path: str) -> str:
        return (await a.exec_fresh(f"cat {path} 2>/dev/null", timeout=PATIENCE_S)).stdout

    async def read_b(path: str) -> str:
        return (await b.exec(f"cat {path} 2>/dev/null")).stdout

    assert await changing(read_a, "beat") and await changing(read_b, "beat")
    r = await a.exec_fresh("type f 2>&1; pwd; ls", timeout=PATIENCE_S)
    assert "FUNC" not in r.stdout and r.stdout.splitlines()[1] == a.workdir and "beat" in r.stdout
    await a.stop_agent()
    assert await wait_until(lambda: running_is_empty(b, tag_a))  # a's loop is gone ...
    assert await running(b, tag_b)  # ... b's is not,
    assert await changing(read_b, "beat")  # and it still runs
    assert (await b.exec("echo alive")).stdout == "alive\n"
    with pytest.raises(SandboxError):
        await a.exec("true")
    await a.close()
    await b.close()


# --- digests -----------------------------------------------------------------------------


async def test_digests_see_replaced_shadowing_and_linked_programs(
    docker_sandbox: DockerSandbox,
) -> None:
    paths = ["/usr/bin/python3", "/usr/local/bin/python3", "/usr/bin/bash", "/etc", "/nope"]
    before = await docker_sandbox.digests(paths)
    assert before["/usr/local/bin/python3"] is None and before["/nope"] is None
    assert before["/etc"] == "dir"
    assert (before["/usr/bin/python3"] or "").startswith("link:python3")
    bash = await docker_sandbox.exec_fresh("sha256sum /usr/bin/bash", timeout=PATIENCE_S)
    assert bash.stdout.split()[0] in (before["/usr/bin/bash"] or "")
    assert await docker_sandbox.digests(paths) == before  # stable
    # The link's target replaced: the link's own digest changes too.
    await docker_sandbox.exec(
        "cp /usr/bin/python3.11 /tmp/p && echo >> /tmp/p && cp /tmp/p /usr/bin/python3.11"
    )
    after = await docker_sandbox.digests(paths)
    assert after["/usr/bin/python3"] != before["/usr/bin/python3"]
    # A new program earlier in PATH, and a link in place of a file.
    await docker_sandbox.exec("printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/python3")
    await docker_sandbox.exec(
        "ln -sf /tmp/fake /usr/bin/bash.new && mv /usr/bin/bash.new /usr/bin/bash"
    )
    after = await docker_sandbox.digests(paths)
    assert (after["/usr/local/bin/python3"] or "").startswith("sha256:")
    assert after["/usr/bin/bash"] == "link:/tmp/fake=None"


async def test_host_and_engine_api_digests_agree(docker_sandbox: DockerSandbox) -> None:
    """The host's view (`/proc/<pid>/root`) and the Engine API's archives give one answer,
    so either may stand in for the other; a link out of the container stays inside it."""
    from clotho.sandbox.docker.archive import path_digest

    await docker_sandbox.exec(
        "ln -s /etc/hostname /tmp/abs; ln -s ../../etc/passwd /tmp/rel; mkfifo /tmp/fifo; "
        "ln -s /proc/1/root/etc /tmp/magic; printf x > /tmp/plain; chmod 4755 /tmp/plain"
    )
    paths = ["/usr/bin/python3", "/bin/sh", "/usr/bin/awk", "/tmp/abs", "/tmp/rel",
             "/tmp/fifo", "/tmp/plain", "/etc", "/nope", "/nope/deeper"]  # fmt: skip
    slot_host = await docker_sandbox.digests(paths)
    api = {p: await path_digest(docker_sandbox.container, p) for p in paths}
    assert slot_host == api
    assert slot_host["/tmp/plain"] == f"sha256:{hashlib.sha256(b'x').hexdigest()}:4755"


async def test_a_cancelled_fresh_process_is_killed(docker_sandbox: DockerSandbox) -> None:
    call = asyncio.create_task(
        docker_sandbox.exec_fresh(
            "echo $$ > /tmp/pid.new; mv /tmp/pid.new /tmp/pid; exec sleep 300",
            timeout=PATIENCE_S * 4,
        )
    )

    async def started() -> bool:
        return (await docker_sandbox.exec("cat /tmp/pid 2>/dev/null")).stdout != ""

    assert await wait_until(started)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    r = await docker_sandbox.exec_fresh("kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo gone",
                                 timeout=PATIENCE_S)  # fmt: skip
    assert r.stdout == "gone\n"
