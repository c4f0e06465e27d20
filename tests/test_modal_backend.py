"""The modal backend and the slot-host pool logic, against test doubles: Modal cannot run
here. `FakeModalClient` stands in for Modal's API: each "Modal sandbox" is a local bash
whose scripts run on this host (the slot folders and workdirs under a temporary folder)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox_fixtures import alive
from tests.support import wait_until

from clotho.sandbox.remote.modal_backend import CONFIG_LABEL, ModalBackend, config_hash
from clotho.sandbox.remote.slots import SlotHosts
from clotho.sandbox.remote_config import ModalSandboxConfig


class FakeModalHandle:
    """Test double of one Modal sandbox: scripts run in a local bash."""

    def __init__(self, name: str, tags: dict[str, str]) -> None:
        self.id = f"sb-{name}"
        self.name = name
        self._tags = dict(tags)
        self.terminated = False
        self.runs = 0

    async def tags(self) -> dict[str, str]:
        return dict(self._tags)

    async def run(
        self, script: str, stdin: bytes | None, timeout: float | None
    ) -> tuple[int, bytes, bytes]:
        assert not self.terminated, "a terminated sandbox was used"
        self.runs += 1
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            script,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        return int(proc.returncode or 0), out, err

    async def terminate(self) -> None:
        self.terminated = True


class FakeModalClient:
    """Test double of Modal's API: named sandboxes, tags, listing."""

    def __init__(self) -> None:
        self.live: dict[str, FakeModalHandle] = {}
        self.created: list[FakeModalHandle] = []

    async def create(
        self, config: ModalSandboxConfig, *, name: str, tags: dict[str, str], image: Any
    ) -> FakeModalHandle:
        assert name not in self.live, "Modal refuses a second live sandbox of one name"
        handle = FakeModalHandle(name, tags)
        self.live[name] = handle
        self.created.append(handle)
        return handle

    async def from_name(self, app_name: str, name: str) -> FakeModalHandle | None:
        handle = self.live.get(name)
        return None if handle is None or handle.terminated else handle

    async def list(self, app_name: str, tags: dict[str, str]) -> list[FakeModalHandle]:
        return [
            h
            for h in self.live.values()
            if not h.terminated and all(h._tags.get(k) == v for k, v in tags.items())
        ]

    async def image(self, config: ModalSandboxConfig) -> str:
        return config.image or ""


def modal_config(tmp_path: Path, **kw: Any) -> ModalSandboxConfig:
    return ModalSandboxConfig(
        workdir=str(tmp_path / "app"), slot_root=str(tmp_path / "slots"), **kw
    )


async def test_slots_share_a_host_and_do_what_a_sandbox_does(tmp_path: Path) -> None:
    client = FakeModalClient()
    backend = ModalBackend(client)
    config = modal_config(tmp_path, slots_per_sandbox=3, max_sandboxes=2)
    boxes = [await backend.open(config, {"clotho.run": "r1"}) for _ in range(4)]
    assert len(client.created) == 2, "3 slots on the first sandbox, the fourth on a new one"
    a, b = boxes[0], boxes[1]
    assert a.workdir != b.workdir
    r = await a.exec("echo hi; echo err >&2; exit 3")
    assert (r.exit_code, r.stdout, r.stderr) == (3, "hi\n", "err\n")
    assert (await a.exec("sleep 300", timeout=0.5)).timed_out
    big = os.urandom(3 << 20)
    await a.write_file("d/big.bin", big)
    assert await a.read_file("d/big.bin") == big
    with pytest.raises(OSError) as too_big:
        await a.read_file("d/big.bin", max_bytes=1024)
    assert too_big.value.errno == errno.EFBIG
    with pytest.raises(FileNotFoundError):
        await b.read_file("d/big.bin")  # the neighbour's workdir is its own
    tree = tmp_path / "tree"
    (tree / "s").mkdir(parents=True)
    (tree / "s" / "f").write_text("x")
    await a.upload(tree, "up")
    await a.download("up", tmp_path / "back")
    assert (tmp_path / "back" / "s" / "f").read_text() == "x"
    # stop_agent ends the slot's processes, not the neighbour's
    await a.exec("sleep 300 & echo $! > pid")
    await b.exec("sleep 300 & echo $! > pid")
    await a.stop_agent()
    pid_a = int((await a.exec_fresh("cat pid", timeout=10)).stdout)
    pid_b = int((await b.exec("cat pid")).stdout)
    assert await wait_until(lambda: not alive(pid_a))
    assert alive(pid_b)  # after a's is gone
    digests = await a.digests(["d/big.bin", "nothing"])
    assert digests["nothing"] is None and len(digests["d/big.bin"] or "") == 64
    for box in boxes:
        await box.close()
    assert await wait_until(lambda: not alive(pid_b))
    await backend.aclose()
    assert all(h.terminated for h in client.created)


async def test_a_named_sandbox_is_reused_only_when_its_labels_match(tmp_path: Path) -> None:
    client = FakeModalClient()
    config = modal_config(tmp_path, slots_per_sandbox=2)
    key = config_hash(config)
    same = FakeModalHandle(f"clotho-{key}-0", {CONFIG_LABEL: key, "clotho": "1", "clotho.run": "r"})
    same._tags.update({"clotho.owner": "x"})
    client.live[same.name] = same
    backend = ModalBackend(client)
    box = await backend.open(config, {"clotho.run": "other-run"})
    assert client.created and client.created[0].name != same.name, "labels differ: not reused"
    await box.close()
    await backend.aclose()
    assert not same.terminated, "a sandbox of another run is never touched"


async def test_a_single_slot_host_is_replaced_not_reused(tmp_path: Path) -> None:
    client = FakeModalClient()
    backend = ModalBackend(client)
    config = modal_config(tmp_path)
    first = await backend.open(config, {})
    await first.write_file("x", b"agent was here")
    await first.close()
    second = await backend.open(config, {})
    assert len(client.created) == 2 and client.created[0].terminated
    await second.close()
    await backend.aclose()


class Host:
    def __init__(self, n: int) -> None:
        self.id = f"h{n}"
        self.ended = False

    async def terminate(self) -> None:
        self.ended = True


async def test_scale_down_and_lifetime_never_end_a_host_under_an_acquired_slot() -> None:
    now = [0.0]
    made: list[Host] = []

    async def create() -> Host:
        made.append(Host(len(made)))
        return made[-1]

    hosts: SlotHosts[Host] = SlotHosts(
        create,
        slots=2,
        min_hosts=1,
        max_hosts=3,
        idle_timeout_s=60,
        max_lifetime_s=1000,
        acquire_timeout_s=0.2,
        clock=lambda: now[0],
    )
    await hosts.warm()
    assert len(made) == 1
    h0, s0 = await hosts.acquire()
    h0b, s1 = await hosts.acquire()
    h1, s2 = await hosts.acquire()
    assert h0 is h0b is made[0] and h1 is made[1] and {s0, s1} == {0, 1}
    now[0] = 400  # both idle-timed-out if idle, but every host has a slot acquired
    assert await hosts.maintain() == []
    await hosts.release(h1, s2)
    now[0] = 470
    assert await hosts.maintain() == ["h1"], "idle beyond min_hosts: scaled down"
    assert await wait_until(lambda: made[1].ended)  # ended in the background
    assert not made[0].ended
    now[0] = 600  # past half its lifetime: no new slot on h0, yet it keeps its two
    assert await hosts.maintain() == []
    h2, _ = await hosts.acquire()
    assert h2 is made[2], "an old host takes no new slot"
    await hosts.release(h0, s0)
    assert not made[0].ended
    await hosts.release(h0, s1)
    assert await wait_until(lambda: made[0].ended), "an old host ends with its last slot"
    for _ in range(5):  # h2's second slot, then two new hosts of two: 3 live, the max
        await hosts.acquire()
    assert len(made) == 5
    with pytest.raises(Exception, match="no free slot"):
        await hosts.acquire()
    await hosts.close()
    assert all(h.ended for h in made)
