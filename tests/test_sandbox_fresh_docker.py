"""Verification primitives of Docker sandboxes against a real engine: `exec_fresh` shares
nothing with the agent's shell, `stop_agent` stops what the agent left for good (a slot's
only its own), `digests` see replaced and shadowed programs from outside the container.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true) its absence
fails the tests instead.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import DOCKER_PROBLEM, requires_docker

from clotho.errors import SandboxError
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.backend import DockerSandbox
from clotho.sandbox.docker.slot_sandbox import IsolatedSlotSandbox, SlotSandbox
from clotho.sandbox.docker.slots import SlotHost

pytestmark = requires_docker

LOOP = "nohup setsid bash -c 'while :; do date +%s%N > {path}; sleep 0.05; done' >/dev/null 2>&1 &"


@pytest.fixture
async def sandbox() -> AsyncIterator[DockerSandbox]:
    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    sb = await open_sandbox(DockerSandboxConfig(), labels={"clotho.test": "fresh-docker"})
    assert isinstance(sb, DockerSandbox)
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
async def host() -> AsyncIterator[SlotHost]:
    import aiodocker

    docker = aiodocker.Docker()
    slot_host = SlotHost(docker, owns_client=True)
    try:
        yield slot_host
    finally:
        await slot_host.close()


async def still(read: Any, path: str) -> bool:
    """Whether the file a loop rewrites stays the same over half a second."""
    first = await read(path)
    await asyncio.sleep(0.5)
    return first == await read(path)


# --- exec_fresh --------------------------------------------------------------------------


async def test_fresh_process_ignores_what_the_session_set(sandbox: DockerSandbox) -> None:
    setup = (
        "f() { echo FUNC; }; export -f f; alias ls='echo ALIAS'; shopt -s expand_aliases; "
        "printf 'echo BASHENV\\n' > /tmp/benv; export BASH_ENV=/tmp/benv ENV=/tmp/benv; "
        "mkdir -p /tmp/evil; printf '#!/bin/sh\\necho EVIL\\n' > /tmp/evil/cat; "
        "chmod +x /tmp/evil/cat; export PATH=/tmp/evil:$PATH; export SECRET=agent; "
        "trap 'echo DEBUG' DEBUG"
    )
    assert (await sandbox.exec(setup)).exit_code == 0
    assert "FUNC" in (await sandbox.exec("f")).stdout  # the session does have them
    r = await sandbox.exec_fresh(
        'type f 2>&1 || true; ls /; echo x | cat; echo "[$SECRET][$MINE]"; pwd; id -u',
        timeout=30,
        env={"MINE": "given"},
    )
    assert r.exit_code == 0, r.stderr
    for planted in ("FUNC", "ALIAS", "BASHENV", "EVIL", "DEBUG", "agent"):
        assert planted not in r.stdout + r.stderr
    assert "[][given]" in r.stdout
    assert r.stdout.splitlines()[-2:] == [sandbox.workdir, "0"]


async def test_fresh_stdin_output_cap_and_timeout(sandbox: DockerSandbox) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB through stdin
    r = await sandbox.exec_fresh("cat > /tmp/in; sha256sum /tmp/in", timeout=30, stdin=data)
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    r = await sandbox.exec_fresh("head -c 50000000 /dev/zero; echo tail >&2", timeout=30,
                                 max_output_bytes=1000)  # fmt: skip
    assert r.stdout.startswith("\0" * 1000) and "dropped" in r.stdout and len(r.stdout) < 1200
    assert r.stderr == "tail\n"
    r = await sandbox.exec_fresh("(sleep 300 &); echo left", timeout=30)
    assert r.stdout == "left\n" and r.duration_s < 5  # a child holding the pipe is not waited for
    r = await sandbox.exec_fresh("sleep 300", timeout=1)
    assert r.timed_out and r.duration_s < 10


# --- stop_agent --------------------------------------------------------------------------


async def test_stop_agent_stops_a_background_loop_for_good(sandbox: DockerSandbox) -> None:
    await sandbox.exec(LOOP.format(path="/tmp/beat"))
    await sandbox.exec("(setsid sh -c 'sleep 1000 & exec sleep 1001' &) >/dev/null 2>&1")

    async def read(path: str) -> str:
        return (await sandbox.exec_fresh(f"cat {path}", timeout=10)).stdout

    assert not await still(read, "/tmp/beat")  # it runs
    await sandbox.stop_agent()
    assert sandbox.stopped
    assert await still(read, "/tmp/beat")
    ps = (await sandbox.exec_fresh("ps -eo stat=,args=", timeout=10)).stdout
    alive = [line for line in ps.splitlines() if line[:1] not in "TZ" and "ps -eo" not in line]
    assert len(alive) == 1 and "docker-init" in alive[0], ps  # the shell is stopped, no more
    for call in (
        sandbox.exec("true"),
        sandbox.read_file("/tmp/beat"),
        sandbox.write_file("/tmp/x", b"x"),
    ):
        with pytest.raises(SandboxError):
            await call
    await sandbox.stop_agent()  # again: idempotent, ends what a fresh process started
    assert (await sandbox.exec_fresh("echo ok", timeout=10)).stdout == "ok\n"


async def test_stop_agent_without_docker_init() -> None:
    """The shell is then pid 1, which nothing inside can stop: the host stops it."""
    async with await open_sandbox(DockerSandboxConfig(init=False)) as sb:
        assert isinstance(sb, DockerSandbox)
        await sb.exec(LOOP.format(path="/tmp/beat"))

        async def read(path: str) -> str:
            return (await sb.exec_fresh(f"cat {path}", timeout=10)).stdout

        await sb.stop_agent()
        assert await still(read, "/tmp/beat")
        ps = (await sb.exec_fresh("ps -eo pid=,stat=", timeout=10)).stdout.split("\n")
        assert any(line.split()[:2] == ["1", "Ts"] or line.split()[:2] == ["1", "T"]
                   for line in ps), ps  # fmt: skip


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_slot_stop_leaves_its_neighbour_running(host: SlotHost, isolation: str) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation)
    a, b = await asyncio.gather(host.open(config), host.open(config))
    expected = IsolatedSlotSandbox if isolation == "bwrap" else SlotSandbox
    assert type(a) is expected and a.container_id == b.container_id
    for slot in (a, b):
        await slot.exec(LOOP.format(path="beat"))
    await a.exec("export -f -n; f() { echo FUNC; }; export -f f")

    async def read_a(path: str) -> str:
        return (await a.exec_fresh(f"cat {path}", timeout=10)).stdout

    async def read_b(path: str) -> str:
        return (await b.exec(f"cat {path}")).stdout

    r = await a.exec_fresh("type f 2>&1; pwd; ls", timeout=10)
    assert "FUNC" not in r.stdout and r.stdout.splitlines()[1] == a.workdir and "beat" in r.stdout
    await a.stop_agent()
    assert await still(read_a, "beat")
    assert not await still(read_b, "beat")
    assert (await b.exec("echo alive")).stdout == "alive\n"
    with pytest.raises(SandboxError):
        await a.exec("true")
    await a.close()
    await b.close()


# --- digests -----------------------------------------------------------------------------


async def test_digests_see_replaced_shadowing_and_linked_programs(sandbox: DockerSandbox) -> None:
    paths = ["/usr/bin/python3", "/usr/local/bin/python3", "/usr/bin/bash", "/etc", "/nope"]
    before = await sandbox.digests(paths)
    assert before["/usr/local/bin/python3"] is None and before["/nope"] is None
    assert before["/etc"] == "dir"
    assert (before["/usr/bin/python3"] or "").startswith("link:python3")
    bash = await sandbox.exec_fresh("sha256sum /usr/bin/bash", timeout=10)
    assert bash.stdout.split()[0] in (before["/usr/bin/bash"] or "")
    assert await sandbox.digests(paths) == before  # stable
    # The link's target replaced: the link's own digest changes too.
    await sandbox.exec(
        "cp /usr/bin/python3.11 /tmp/p && echo >> /tmp/p && cp /tmp/p /usr/bin/python3.11"
    )
    after = await sandbox.digests(paths)
    assert after["/usr/bin/python3"] != before["/usr/bin/python3"]
    # A new program earlier in PATH, and a link in place of a file.
    await sandbox.exec("printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/python3")
    await sandbox.exec("ln -sf /tmp/fake /usr/bin/bash.new && mv /usr/bin/bash.new /usr/bin/bash")
    after = await sandbox.digests(paths)
    assert (after["/usr/local/bin/python3"] or "").startswith("sha256:")
    assert after["/usr/bin/bash"] == "link:/tmp/fake=None"


async def test_read_file_only_regular_files_under_the_cap(sandbox: DockerSandbox) -> None:
    await sandbox.exec(
        "ln -s /dev/zero zero; mkfifo fifo; truncate -s 1G sparse; echo hi > small; "
        "ln -s small link"
    )
    for path in ("zero", "fifo"):
        with pytest.raises(OSError) as info:
            await asyncio.wait_for(sandbox.read_file(path), 10)
        assert not isinstance(info.value, FileNotFoundError)
    with pytest.raises(OSError) as info:
        await asyncio.wait_for(sandbox.read_file("sparse"), 10)
    assert info.value.errno == errno.EFBIG
    with pytest.raises(OSError) as info:
        await sandbox.read_file("small", max_bytes=2)
    assert info.value.errno == errno.EFBIG
    assert await sandbox.read_file("link") == b"hi\n"


async def test_host_and_engine_api_digests_agree(sandbox: DockerSandbox) -> None:
    """The host's view (`/proc/<pid>/root`) and the Engine API's archives give one answer,
    so either may stand in for the other; a link out of the container stays inside it."""
    from clotho.sandbox.docker.archive import path_digest

    await sandbox.exec(
        "ln -s /etc/hostname /tmp/abs; ln -s ../../etc/passwd /tmp/rel; mkfifo /tmp/fifo; "
        "ln -s /proc/1/root/etc /tmp/magic; printf x > /tmp/plain; chmod 4755 /tmp/plain"
    )
    paths = ["/usr/bin/python3", "/bin/sh", "/usr/bin/awk", "/tmp/abs", "/tmp/rel",
             "/tmp/fifo", "/tmp/plain", "/etc", "/nope", "/nope/deeper"]  # fmt: skip
    host = await sandbox.digests(paths)
    api = {p: await path_digest(sandbox.container, p) for p in paths}
    assert host == api
    assert host["/tmp/plain"] == f"sha256:{hashlib.sha256(b'x').hexdigest()}:4755"


async def test_download_is_capped(sandbox: DockerSandbox, tmp_path: Path) -> None:
    await sandbox.exec("mkdir -p tree && head -c 3000000 /dev/urandom > tree/a && echo b > tree/b")
    with pytest.raises(OSError) as info:
        await sandbox.download("tree", tmp_path / "capped", max_bytes=1 << 20)
    assert info.value.errno == errno.EFBIG and not (tmp_path / "capped").exists()
    await sandbox.download("tree", tmp_path / "whole")
    assert (tmp_path / "whole" / "b").read_text() == "b\n"


async def test_isolated_slot_reads_only_regular_files_under_the_cap(
    host: SlotHost, tmp_path: Path
) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="bwrap")
    slot = await host.open(config)
    assert isinstance(slot, IsolatedSlotSandbox)
    await slot.exec("ln -s /dev/zero zero; mkfifo fifo; truncate -s 1G sparse; echo hi > small")
    for path in ("zero", "fifo"):
        with pytest.raises(OSError) as info:
            await asyncio.wait_for(slot.read_file(path), 20)
        assert not isinstance(info.value, FileNotFoundError)
    with pytest.raises(OSError) as info:
        await asyncio.wait_for(slot.read_file("sparse"), 20)
    assert info.value.errno == errno.EFBIG
    assert await slot.read_file("small") == b"hi\n"
    await slot.exec("mkdir t && head -c 3000000 /dev/urandom > t/a")
    with pytest.raises(OSError) as info:
        await slot.download("t", tmp_path / "t", max_bytes=1 << 20)
    assert info.value.errno == errno.EFBIG
    await slot.download("t", tmp_path / "t2")
    assert (tmp_path / "t2" / "a").stat().st_size == 3000000
    await slot.close()


async def test_a_cancelled_fresh_process_is_killed(sandbox: DockerSandbox) -> None:
    running = asyncio.create_task(
        sandbox.exec_fresh("echo $$ > /tmp/pid; exec sleep 300", timeout=60)
    )
    await asyncio.sleep(1.0)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    r = await sandbox.exec_fresh("kill -0 $(cat /tmp/pid) 2>/dev/null && echo alive || echo gone",
                                 timeout=10)  # fmt: skip
    assert r.stdout == "gone\n"
