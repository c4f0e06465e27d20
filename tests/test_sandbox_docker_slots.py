"""Several sandboxes (slots) per container (sandbox/docker/slots.py) against a real Docker engine.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true), where the
daemon is set up on purpose, its absence fails the tests instead. `clotho/base:bookworm` has
bubblewrap and util-linux, so isolated slots are tested for real; an image built from it
without bwrap shows the error (`bwrap` and `auto` alike: no silent fallback).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import run_past_timeout
from tests.support import PATIENCE_S, wait_until

from clotho.errors import ConfigError, ErrorInfo, SandboxError
from clotho.sandbox import open_sandbox
from clotho.sandbox.base import ExecResult
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.slot_sandbox import IsolatedSlotSandbox, SlotSandbox
from clotho.sandbox.docker.slots import SlotHost
from clotho.sandbox.host import proctree
from clotho.sandbox.host.leases import SLOT_ISOLATION, SLOTS, docker_records
from clotho.sandbox.pool import PoolConfig, SlotPool

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = requires_docker


@pytest.fixture
def marker() -> str:
    return f"slots-{secrets.token_hex(4)}"


@pytest.fixture
async def no_bwrap_image(docker: Any, tmp_path: Path) -> AsyncIterator[str]:
    """The base image without bubblewrap, with a workspace file baked into /app."""
    from clotho.sandbox.docker.images import build_image

    (tmp_path / "Dockerfile").write_text(
        "FROM clotho/base:bookworm\n"
        "RUN rm -f /usr/bin/bwrap && mkdir -p /app && echo seeded > /app/seed.txt\n"
    )
    tag = await build_image(docker, tmp_path, f"clotho-test/nobwrap:{secrets.token_hex(3)}")
    try:
        yield tag
    finally:
        await docker.images.delete(tag, force=True)


async def containers(docker: Any, marker: str) -> list[dict[str, Any]]:
    found = await docker.containers.list(all=True, filters={"label": [f"probe={marker}"]})
    return [await c.show() for c in found]


async def open_slots(
    slot_host: SlotHost, config: DockerSandboxConfig, marker: str, count: int
) -> list[SlotSandbox]:
    return list(
        await asyncio.gather(*(slot_host.open(config, {"probe": marker}) for _ in range(count)))
    )


async def ps_args(sandbox: SlotSandbox) -> list[str]:
    """Every process of the container (any slot sees the container's /proc)."""
    r = await sandbox.exec("ps -eo args=")
    assert r.exit_code == 0, r.stderr
    return r.stdout.splitlines()


async def with_token(sandbox: SlotSandbox, token: str) -> list[str]:
    return [a for a in await ps_args(sandbox) if token in a]


async def wait_count(sandbox: SlotSandbox, token: str, count: int) -> list[str]:
    """The container's processes with `token` in their arguments, once there are `count`."""
    found: list[str] = []

    async def counted() -> bool:
        found[:] = await with_token(sandbox, token)
        return len(found) == count

    await wait_until(counted)
    return found


async def gone(docker: Any, container_id: str) -> bool:
    from aiodocker.exceptions import DockerError

    try:
        await docker.containers.container(container_id).show()
    except DockerError as exc:
        return exc.status == 404
    return False


# --- without isolation -------------------------------------------------------------------------


async def test_three_slots_share_one_container_without_isolation(
    slot_host: SlotHost, docker: Any, marker: str, tmp_path: Path
) -> None:
    config = DockerSandboxConfig(slots_per_container=3, slot_isolation="none")
    slots = await open_slots(slot_host, config, marker, 3)
    try:
        found = await containers(docker, marker)
        assert len(found) == 1
        labels = found[0]["Config"]["Labels"]
        assert (labels[SLOTS], labels[SLOT_ISOLATION]) == ("3", "none")
        assert not found[0]["HostConfig"].get("SecurityOpt")  # Docker's default seccomp
        assert {s.container_id for s in slots} == {found[0]["Id"]}
        assert sorted(s.slot for s in slots) == [0, 1, 2]
        for s in slots:
            assert type(s) is SlotSandbox and s.isolation == "none"
            assert s.workdir == f"/slots/{s.slot}/app"
            r = await s.exec('pwd; echo "$HOME|$TMPDIR"; id -u')
            assert r.stdout == f"{s.workdir}\n/slots/{s.slot}/home|/slots/{s.slot}/tmp\n0\n"

        # The same relative path, a different file per slot.
        for s in slots:
            await s.exec(f"echo exec-{s.slot} > same.txt")
            await s.write_file("written.txt", f"api-{s.slot}".encode())
        for s in slots:
            assert await s.read_file("same.txt") == f"exec-{s.slot}\n".encode()
            assert (await s.exec("cat written.txt")).stdout == f"api-{s.slot}"
        # Documented: without isolation a slot can see (and write) its neighbours' folders.
        first, second = slots[0], slots[1]
        r = await first.exec(f"cat /slots/{second.slot}/app/same.txt")
        assert r.stdout == f"exec-{second.slot}\n"

        # Files in and out, paths are the container's own.
        src = tmp_path / "src"
        (src / "nested").mkdir(parents=True)
        (src / "nested" / "leaf.txt").write_text("leaf")
        await second.upload(src, "proj")
        assert await second.read_file(f"{second.workdir}/proj/nested/leaf.txt") == b"leaf"
        await second.download("proj", tmp_path / "out")
        assert (tmp_path / "out" / "nested" / "leaf.txt").read_text() == "leaf"
        with pytest.raises(FileNotFoundError):
            await first.read_file("proj/nested/leaf.txt")
    finally:
        await asyncio.gather(*(s.close() for s in slots))
    # Closing the last slot removed the container and the host-side FIFO folder.
    assert await containers(docker, marker) == []
    assert slot_host.stats() == {"containers": 0, "slots_in_use": 0}


async def test_close_kills_every_process_of_the_slot_and_wipes_it(
    slot_host: SlotHost, marker: str
) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="none")
    victim, witness = await open_slots(slot_host, config, marker, 2)
    token = f"reap-{secrets.token_hex(3)}"
    try:
        await victim.exec("echo old > mine.txt")
        r = await victim.exec(
            f"(exec -a {token}-job sleep 300) & "
            f"setsid bash -c '(exec -a {token}-daemon sleep 301) &' & "
            f"nohup bash -c 'exec -a {token}-nohup sleep 302' >/dev/null 2>&1 & echo started"
        )
        assert r.stdout == "started\n"
        assert len(await wait_count(witness, token, 3)) == 3  # detached ones start late
        folder = f"/slots/{victim.slot}"
        await victim.close()
        assert await wait_count(witness, token, 0) == []
        assert (await witness.exec(f"[ -e {folder} ] || echo wiped")).stdout == "wiped\n"
        with pytest.raises(SandboxError):
            await victim.exec("true")
        await victim.close()  # idempotent

        # The number is used again, for a fresh slot in the same container.
        again = await slot_host.open(config, {"probe": marker})
        try:
            assert again.container_id == witness.container_id
            assert again.slot == victim.slot
            assert (await again.exec("ls -A")).stdout == ""
        finally:
            await again.close()
        assert (await witness.exec("echo still here")).stdout == "still here\n"
    finally:
        await witness.close()


# --- with bubblewrap ---------------------------------------------------------------------------


async def test_isolated_slots_see_only_their_own_workspace(
    slot_host: SlotHost, docker: Any, marker: str, tmp_path: Path
) -> None:
    config = DockerSandboxConfig(slots_per_container=3, slot_isolation="bwrap")
    slots = await open_slots(slot_host, config, marker, 3)
    try:
        found = await containers(docker, marker)
        assert len(found) == 1
        assert found[0]["Config"]["Labels"][SLOT_ISOLATION] == "bwrap"
        assert found[0]["HostConfig"]["SecurityOpt"] == ["seccomp=unconfined"]
        for s in slots:
            assert isinstance(s, IsolatedSlotSandbox) and s.workdir == "/app"
            r = await s.exec('pwd; echo "$HOME"; id -u; ls -A /slots; hostname')
            assert r.stdout == "/app\n/root\n0\nclotho\n", r.stderr

        for s in slots:
            await s.exec(f"echo exec-{s.slot} > /app/same.txt; echo tmp-{s.slot} > /tmp/t")
            await s.write_file("written.txt", f"api-{s.slot}".encode())
            await s.exec(f"echo home-{s.slot} > ~/h")
        for s in slots:
            assert await s.read_file("/app/same.txt") == f"exec-{s.slot}\n".encode()
            assert await s.read_file("/tmp/t") == f"tmp-{s.slot}\n".encode()
            assert await s.read_file("/root/h") == f"home-{s.slot}\n".encode()
            assert (await s.exec("cat written.txt")).stdout == f"api-{s.slot}"

        first, second = slots[0], slots[1]
        # A neighbour's folder is out of sight, also through a symlink handed to the API.
        r = await first.exec(f"cat /slots/{second.slot}/app/same.txt")
        assert r.exit_code != 0
        await first.exec(f"ln -s /slots/{second.slot}/app/same.txt link")
        with pytest.raises(FileNotFoundError):
            await first.read_file("link")
        # Its processes are visible in ps (the container's /proc) but out of reach.
        token = f"iso-{secrets.token_hex(3)}"
        await second.exec(f"(exec -a {token} sleep 300) &")
        r = await first.exec(
            f"pid=$(pgrep -f '^{token}'); echo pid=$pid; kill -9 $pid; "
            f"cat /proc/$pid/root/app/same.txt"
        )
        assert r.stdout.startswith("pid=") and r.stdout != "pid=\n"
        assert "Operation not permitted" in r.stderr and "Permission denied" in r.stderr
        assert [a for a in await ps_args(second) if token in a] == [f"{token} 300"]
        # Its own network namespace: only loopback, so ports do not collide.
        r = await first.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert r.stdout == "lo\n"
        # The image is read-only to a slot: it cannot change what its neighbours run.
        r = await first.exec("echo x > /usr/bin/evil")
        assert r.exit_code != 0

        # Files in and out through the slot's own shell, any path it can write.
        src = tmp_path / "src"
        (src / "nested").mkdir(parents=True)
        (src / "nested" / "leaf.txt").write_text("leaf")
        (src / "secret").write_text("mode 600")
        (src / "secret").chmod(0o600)
        (src / "link").symlink_to("nested/leaf.txt")
        await second.upload(src, "/tests")
        r = await second.exec("cat /tests/nested/leaf.txt /tests/secret; readlink /tests/link")
        assert r.stdout == "leafmode 600nested/leaf.txt\n", r.stderr
        await second.download("/tests", tmp_path / "out")
        assert (tmp_path / "out" / "nested" / "leaf.txt").read_text() == "leaf"
        assert os.readlink(tmp_path / "out" / "link") == "nested/leaf.txt"
        assert (await first.exec("ls -A /tests")).stdout == ""
        # (What every sandbox does with files, a slot too: test_sandbox_backends.py.)
        with pytest.raises(FileNotFoundError):
            await second.download("missing", tmp_path / "never")
        assert (await second.exec("ls -A /.clotho")).stdout == ""  # transfers cleaned up
    finally:
        await asyncio.gather(*(s.close() for s in slots))
    assert await containers(docker, marker) == []


async def test_isolated_slot_timeout_and_close_reach_every_process(
    slot_host: SlotHost, marker: str
) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="bwrap")
    victim, witness = await open_slots(slot_host, config, marker, 2)
    token = f"tree-{secrets.token_hex(3)}"
    try:
        await victim.exec(f"(exec -a {token}-bg sleep 300) &")
        assert await wait_count(witness, token, 1) == [f"{token}-bg 300"]

        async def run(timeout: float) -> ExecResult:
            await victim.exec("rm -f started")
            return await victim.exec(
                f"bash -c 'echo >> started; exec -a {token}-child sleep 300'", timeout=timeout
            )

        async def started() -> bool:
            return (await victim.exec("cat started 2>/dev/null")).stdout == "\n"

        r = await run_past_timeout(run, started)
        assert r.timed_out
        assert await wait_count(witness, token, 1) == [f"{token}-bg 300"]
        assert (await victim.exec("echo after")).stdout == "after\n"
        # Gone with the slot even when it left the tree and dropped its environment.
        await victim.exec(f"env -i setsid bash -c '(exec -a {token}-escaped sleep 301) &'")
        assert len(await wait_count(witness, token, 2)) == 2
        await victim.close()
        assert await wait_count(witness, token, 0) == []
    finally:
        await witness.close()


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_a_crashed_slot_shell_leaves_its_neighbours_alone(
    slot_host: SlotHost, docker: Any, marker: str, isolation: str
) -> None:
    config = DockerSandboxConfig(slots_per_container=3, slot_isolation=isolation)
    slots = await open_slots(slot_host, config, marker, 3)
    container_id = slots[0].container_id
    try:
        crashed = slots[1]
        outer = crashed._shell.pid
        assert outer is not None
        inner = proctree.descendants(outer)
        os.kill(outer, signal.SIGKILL)
        for pid in inner:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(SandboxError):
            async with asyncio.timeout(PATIENCE_S):
                await crashed.exec("echo never")
        for s in (slots[0], slots[2]):
            assert (await s.exec("echo fine")).stdout == "fine\n"
        await crashed.close()
        for s in (slots[0], slots[2]):
            assert (await s.exec("echo still fine")).stdout == "still fine\n"
    finally:
        await asyncio.gather(*(s.close() for s in slots))
    assert await gone(docker, container_id)


async def test_output_after_a_shell_died_is_dropped_quietly(
    slot_host: SlotHost, marker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A process the dead shell left behind still holds its FIFOs and writes into them."""
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="none")
    sandbox, witness = await open_slots(slot_host, config, marker, 2)
    go, done = (f"/tmp/late-{secrets.token_hex(4)}-{step}" for step in ("go", "done"))
    try:
        # It writes only once the shell is dead (at a file the test makes then), and says so.
        await sandbox.exec(
            f'(setsid bash -c \'trap "" PIPE; until [ -e {go} ]; do sleep 0.01; done; '
            f"echo late; echo late >&2; touch {done}' &)"
        )
        outer = sandbox._shell.pid
        assert outer is not None
        for pid in [outer, *proctree.descendants(outer)]:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(SandboxError):
            async with asyncio.timeout(PATIENCE_S):
                await sandbox.exec("echo never")
        await witness.exec(f"touch {go}")

        async def written() -> bool:
            return (await witness.exec(f"[ -e {done} ] && echo yes")).stdout == "yes\n"

        assert await wait_until(written)  # the late writes came after the streams ended,
        await witness.exec("true")  # and the loop has had its turns since
    finally:
        await sandbox.close()
        await witness.close()
    assert not [r for r in caplog.records if r.name == "asyncio" and r.levelname == "ERROR"]


@pytest.mark.parametrize("isolation", ["bwrap", "auto"])
async def test_slots_are_never_silently_unisolated(
    slot_host: SlotHost, docker: Any, marker: str, no_bwrap_image: str, isolation: str
) -> None:
    """An image without bubblewrap: `bwrap` and `auto` both refuse (a config error naming
    the image and the fixes), twice (the second from what the image was found to be), and
    leave no container; shared slots without isolation only when asked by name."""
    config = DockerSandboxConfig(
        image=no_bwrap_image, slots_per_container=2, slot_isolation=isolation
    )
    for _ in range(2):
        with pytest.raises(ConfigError) as caught:
            await slot_host.open(config, {"probe": marker})
        message = str(caught.value)
        assert no_bwrap_image in message and "no bwrap" in message
        assert "slot_isolation=none" in message and "slots_per_container=1" in message
        assert ErrorInfo.of(caught.value).kind == "config"
        assert await containers(docker, marker) == []
    # Asked by name: shared, unisolated, and the image's workspace copied into each slot.
    named = config.model_copy(update={"slot_isolation": "none"})
    slots = await open_slots(slot_host, named, marker, 2)
    try:
        found = await containers(docker, marker)
        assert len(found) == 1
        assert found[0]["Config"]["Labels"][SLOT_ISOLATION] == "none"
        assert not found[0]["HostConfig"].get("SecurityOpt")
        for s in slots:
            assert s.isolation == "none" and s.workdir == f"/slots/{s.slot}/app"
            assert await s.read_file("seed.txt") == b"seeded\n"
        records = [r for r in await docker_records(docker) if r.labels.get("probe") == marker]
        assert [(r.slots, r.slot_isolation) for r in records] == [(2, "none")]
    finally:
        await asyncio.gather(*(s.close() for s in slots))
    assert await containers(docker, marker) == []


# --- the pool and open_sandbox -----------------------------------------------------------------


async def test_pool_serves_four_sandboxes_from_two_containers(docker: Any, marker: str) -> None:
    config = DockerSandboxConfig(slots_per_container=2)  # auto: bubblewrap in the base image
    async with SlotPool(PoolConfig(max_size=8), labels={"probe": marker}) as pool:
        leased = await asyncio.gather(*(pool.acquire(config) for _ in range(4)))
        assert all(isinstance(s, IsolatedSlotSandbox) for s in leased)
        by_container: dict[str, list[int]] = {}
        for s in leased:
            assert isinstance(s, SlotSandbox)
            by_container.setdefault(s.container_id, []).append(s.slot)
        assert sorted(sorted(v) for v in by_container.values()) == [[0, 1], [0, 1]]
        found = await containers(docker, marker)
        assert sorted(c["Id"] for c in found) == sorted(by_container)
        assert {c["Config"]["Labels"][SLOTS] for c in found} == {"2"}
        for i, s in enumerate(leased):
            await s.exec(f"echo {i} > mine.txt")
        for i, s in enumerate(leased):
            assert (await s.exec("cat mine.txt")).stdout == f"{i}\n"

        # A released slot is replaced, never handed out again: the next one is clean.
        await pool.release(leased[0])
        fresh = await pool.acquire(config)
        assert (await fresh.exec("ls -A")).stdout == ""
        for s in [fresh, *leased[1:]]:
            await pool.release(s)
    assert await containers(docker, marker) == []


async def test_pool_git_reset_keeps_the_slot(docker: Any, marker: str) -> None:
    config = DockerSandboxConfig(slots_per_container=2)
    pool_config = PoolConfig(max_size=4, reset="git", health_interval_s=0)
    async with SlotPool(pool_config, labels={"probe": marker}) as pool:
        sandbox = await pool.acquire(config)
        r = await sandbox.exec(
            "git init -q . && echo a > a && git add a && "
            "git -c user.name=t -c user.email=t@x commit -qm a && echo dirt > b && echo z > a"
        )
        assert r.exit_code == 0, r.stderr
        await pool.release(sandbox)
        await pool.wait_idle(config, 1, timeout=30)
        again = await pool.acquire(config)
        assert again is sandbox
        assert (await again.exec("cat a; ls")).stdout == "a\na\n"
        await pool.release(again, reset=False)
    assert await containers(docker, marker) == []


async def test_open_sandbox_with_slots_gets_a_container_of_its_own(
    docker: Any, marker: str
) -> None:
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="none")
    first = await open_sandbox(config, {"probe": marker})
    second = await open_sandbox(config, {"probe": marker})
    assert isinstance(first, SlotSandbox) and isinstance(second, SlotSandbox)
    assert first.container_id != second.container_id
    assert first.workdir == "/slots/0/app"
    assert (await first.exec("pwd")).stdout == "/slots/0/app\n"
    await first.close()
    assert await gone(docker, first.container_id)
    await second.close()
    assert await containers(docker, marker) == []
