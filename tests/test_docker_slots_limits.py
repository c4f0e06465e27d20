"""Docker slots' own limits against a real engine: a slot's fork bomb or memory hog is its
own `limit` failure, and its neighbour in the same container keeps working.

Each slot gets its own memory and pids cgroups under its container's (`SlotCgroup`): they
need the host's cgroup v1 tree writable by the harness (root, a local daemon). Where that
is missing the guard below skips with the reason (a failure under CI=true).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.support import wait_until

from clotho.errors import ErrorInfo, LimitExceeded
from clotho.sandbox import open_sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.docker.limits import SLOT_PIDS_RESERVE, slot_pids
from clotho.sandbox.docker.slot_sandbox import SlotSandbox
from clotho.sandbox.docker.slots import SlotHost

pytest_plugins = ("tests.sandbox_fixtures",)  # its fixtures

pytestmark = requires_docker

HOG = "python3 -c 'x = bytearray(400 << 20); print(len(x))'"
ISOLATIONS = ["none", "bwrap"]


def needs_slot_cgroups() -> None:
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory/memory.oom_control").exists():
        pytest.skip("slot cgroups need root and the host's cgroup v1 tree")


async def neighbours(slot_host: SlotHost, config: DockerSandboxConfig) -> list[SlotSandbox]:
    slots = list(await asyncio.gather(*(slot_host.open(config) for _ in range(2))))
    assert slots[0].container_id == slots[1].container_id  # one container, two slots
    for s in slots:
        assert s.cgroup is not None
    return slots


def count(path: Path) -> int:
    return int(path.read_text().split()[0])


async def start_bomb(slot: SlotSandbox) -> None:
    """A fork bomb in the background; the command starting it may already end as `limit`
    (the bomb reached the slot's limit before the command's check)."""
    with contextlib.suppress(LimitExceeded):
        await slot.exec("b() { b | b & }; (b) &")


def tasks_of(uid: int) -> int:
    """Tasks (threads included) this host runs as `uid`, as RLIMIT_NPROC counts them."""
    found = 0
    for status in Path("/proc").glob("[0-9]*/task/[0-9]*/status"):
        try:
            for line in status.read_text().splitlines():
                if line.startswith("Uid:"):
                    found += line.split()[1] == str(uid)
                    break
        except OSError:
            continue
    return found


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_slots_fork_bomb_is_its_own_and_the_neighbour_keeps_forking(
    slot_host: SlotHost, isolation: str
) -> None:
    needs_slot_cgroups()
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation, pids_limit=256)
    share = slot_pids(256, 2)
    assert share is not None and 2 * share + SLOT_PIDS_RESERVE <= 256
    bomber, neighbour = await neighbours(slot_host, config)
    group = bomber.cgroup
    assert group is not None
    try:
        assert count(group.pids / "pids.max") == share
        await start_bomb(bomber)
        assert await wait_until(lambda: group.counters()[1] > 0)  # the kernel refused its fork
        # The neighbour forks freely while the bomb holds its slot's share.
        r = await neighbour.exec("for i in $(seq 30); do (true) || exit 1; done; echo forked")
        assert (r.exit_code, r.stdout) == (0, "forked\n"), r.stderr
        assert count(group.pids / "pids.current") > share // 2  # the bomb was still there
        # The bomber's failure is `limit`, for good, verification included.
        with pytest.raises(LimitExceeded, match="process limit") as caught:
            await bomber.exec("true")
        assert ErrorInfo.of(caught.value).kind == "limit"
        with pytest.raises(LimitExceeded):
            await bomber.stop_agent()
        assert group.members()  # still running: closing must end them
        await bomber.close()
        assert not group.pids.exists() and not group.memory.exists()
        assert (await neighbour.exec("echo fine")).stdout == "fine\n"
    finally:
        await bomber.close()
        await neighbour.close()


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_a_slots_oom_kill_is_limit_whatever_its_exit_code(
    slot_host: SlotHost, isolation: str
) -> None:
    """The hog's exit code is hidden (`; echo`, a pipe): the slot's cgroup still counts the
    kernel's OOM kill as its own; the neighbour, running meanwhile, is not charged."""
    needs_slot_cgroups()
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation, memory_mb=192)
    hog, neighbour = await neighbours(slot_host, config)
    try:
        await neighbour.exec("(exec sleep 300) &")
        with pytest.raises(LimitExceeded, match="memory") as caught:
            await hog.exec(f"{HOG}; echo after")
        assert ErrorInfo.of(caught.value).kind == "limit"
        with pytest.raises(LimitExceeded, match="memory"):
            await hog.exec("true")  # failed for good
        assert (await neighbour.exec("echo fine")).stdout == "fine\n"
        await hog.close()
        piped = await slot_host.open(config)  # the freed slot, fresh counters
        assert piped.container_id == neighbour.container_id
        assert (await piped.exec("echo clean")).stdout == "clean\n"
        with pytest.raises(LimitExceeded, match="memory"):
            await piped.exec(f"{HOG} | tail -1")
        await piped.close()
        assert (await neighbour.exec("echo still")).stdout == "still\n"
    finally:
        await hog.close()
        await neighbour.close()


async def test_without_slot_cgroups_an_isolated_slots_fork_bomb_is_still_its_own() -> None:
    """A host where slots cannot get cgroups (`slot_cgroups=False` takes that path here: a
    remote daemon or cgroup v2 would): each isolated slot's uid has its share as
    RLIMIT_NPROC, out of a uid block of its container's own, so the neighbour keeps forking
    and the bomber ends as `limit`."""
    import aiodocker

    config = DockerSandboxConfig(slots_per_container=2, slot_isolation="bwrap", pids_limit=256)
    share = slot_pids(256, 2)
    host = SlotHost(aiodocker.Docker(), owns_client=True, slot_cgroups=False)
    try:
        bomber, neighbour = await asyncio.gather(host.open(config), host.open(config))
        assert bomber.container_id == neighbour.container_id
        assert bomber.cgroup is None and bomber.layout.nproc == share
        assert neighbour.layout.uid != bomber.layout.uid
        uid = bomber.layout.uid
        await start_bomb(bomber)
        assert await wait_until(lambda: tasks_of(uid) >= (share or 0))  # at its limit
        r = await neighbour.exec("for i in $(seq 30); do (true) || exit 1; done; echo forked")
        assert (r.exit_code, r.stdout) == (0, "forked\n"), r.stderr
        assert tasks_of(uid) > (share or 0) // 2  # the bomb was still there
        with pytest.raises(LimitExceeded, match="process limit"):
            await bomber.exec("true")
        with pytest.raises(LimitExceeded):
            await bomber.stop_agent()
        await bomber.close()
        assert tasks_of(uid) == 0
        assert (await neighbour.exec("echo fine")).stdout == "fine\n"
        await neighbour.close()
    finally:
        await host.close()


async def test_a_containers_oom_kill_is_limit_whatever_its_exit_code() -> None:
    async with await open_sandbox(DockerSandboxConfig(memory_mb=128)) as sb:
        with pytest.raises(LimitExceeded, match="memory") as caught:
            await sb.exec(f"{HOG} | tail -1; echo after")
        assert ErrorInfo.of(caught.value).kind == "limit"


@pytest.mark.parametrize("isolation", ISOLATIONS)
async def test_stop_agent_reaches_a_slot_process_whatever_it_changed(
    slot_host: SlotHost, docker: Any, isolation: str
) -> None:
    """A process that cleared its environment and left its session is still in the slot's
    cgroup: stopping the agent kills it (without isolation too); the neighbour's lives."""
    needs_slot_cgroups()
    config = DockerSandboxConfig(slots_per_container=2, slot_isolation=isolation)
    slot, neighbour = await neighbours(slot_host, config)
    try:
        await slot.exec("env -i setsid sh -c 'exec sleep 301' > /dev/null 2>&1 &")
        await neighbour.exec("(exec sleep 302) &")

        async def sleeping() -> list[str]:
            container = docker.containers.container(slot.container_id)
            top = await container.top(ps_args="-o pid,args")
            return sorted(row[1] for row in top["Processes"] if row[1].startswith("sleep 30"))

        assert await wait_until(lambda: _equals(sleeping(), ["sleep 301", "sleep 302"]))
        await slot.stop_agent()
        assert await sleeping() == ["sleep 302"]
    finally:
        await slot.close()
        await neighbour.close()


async def _equals(value: Any, expected: Any) -> bool:
    return await value == expected
