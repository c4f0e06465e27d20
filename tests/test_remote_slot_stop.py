"""Modal and Nomad slots: stopping the agent and closing the slot reach every process it
started, whatever that process changed about itself (its CLOTHO_SLOT variable, its
environment, its session), and nothing of a neighbour.

Modal and Nomad cannot run here: `FakeModalClient` (Modal's API, each "sandbox" a local
bash) and `FakeNomad` (Nomad's API, each allocation a real sandbox server on 127.0.0.1)
are the test doubles of tests/test_modal_backend.py and tests/test_nomad_backend.py. Their
scripts run on this host, as root: a slot on a shared host runs as a uid of its own, a
one-slot Modal sandbox in a pid namespace of its own.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest
from tests.sandbox_fixtures import alive, host_pids
from tests.support import wait_until
from tests.test_modal_backend import FakeModalClient, modal_config
from tests.test_nomad_backend import FakeNomad, nomad, nomad_config  # noqa: F401 (fixture)

from clotho.sandbox.remote.modal_backend import ModalBackend
from clotho.sandbox.remote.nomad_backend import NomadBackend
from clotho.sandbox.remote.slot_sandbox import RemoteSlotSandbox


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the doubles run the hosts' scripts on this machine, which needs root")


def naps() -> tuple[str, str, str]:
    """Three sleep lengths no other process on this machine uses (its command line)."""
    base = 4000 + secrets.randbelow(10**6) / 10**6
    return f"{base:.6f}", f"{base + 1:.6f}", f"{base + 2:.6f}"


def sleeping(length: str) -> list[int]:
    return host_pids(lambda line: line == f"sleep\0{length}\0".encode())


def environ(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


async def escape(slot: Any, plain: str, bare: str) -> tuple[int, int]:
    """The issue's escapes: one process without CLOTHO_SLOT in its own session, one with no
    environment at all, double-forked; their host pids once both run."""
    await slot.exec(f"env -u CLOTHO_SLOT setsid sleep {plain} > /dev/null 2>&1 &")
    await slot.exec(f"env -i setsid bash -c '(sleep {bare} &)' > /dev/null 2>&1")
    assert await wait_until(lambda: len(sleeping(plain)) == len(sleeping(bare)) == 1)
    pids = sleeping(plain)[0], sleeping(bare)[0]
    for pid in pids:
        assert b"CLOTHO_SLOT" not in environ(pid)  # the token is no way to find them
        assert os.getsid(pid) != os.getsid(0)
    return pids


async def stop_reaches_the_escapes_and_spares_the_neighbour(
    slot: RemoteSlotSandbox, neighbour: RemoteSlotSandbox
) -> None:
    plain, bare, theirs = naps()
    escaped = await escape(slot, plain, bare)
    await neighbour.exec(f"sleep {theirs} > /dev/null 2>&1 &")
    assert await wait_until(lambda: len(sleeping(theirs)) == 1)
    other = sleeping(theirs)[0]
    await slot.stop_agent()
    assert not any(alive(pid) for pid in escaped)  # the stop returns once they are gone
    assert alive(other)
    await neighbour.close()
    assert not alive(other)


async def test_modal_slots_on_a_shared_host_each_run_as_a_uid_of_their_own(
    tmp_path: Path,
) -> None:
    backend = ModalBackend(FakeModalClient())
    config = modal_config(tmp_path, slots_per_sandbox=2)
    a = await backend.open(config, {})
    b = await backend.open(config, {})
    try:
        assert isinstance(a, RemoteSlotSandbox) and isinstance(b, RemoteSlotSandbox)
        assert (a.jail, b.jail) == ("uid", "uid") and a.uid != b.uid
        r = await a.exec("id -u; echo x > mine; cat mine")
        assert r.stdout == f"{a.uid}\nx\n", r.stderr
        # The slot cannot take its uid back, nor signal its neighbour.
        nap = naps()[0]
        await b.exec(f"sleep {nap} > /dev/null 2>&1 &")
        assert await wait_until(lambda: len(sleeping(nap)) == 1)
        r = await a.exec(f"setpriv --reuid=0 true || kill -9 {sleeping(nap)[0]}")
        assert r.exit_code != 0 and alive(sleeping(nap)[0])
        await stop_reaches_the_escapes_and_spares_the_neighbour(a, b)
        # Closing without a stop reaches them too.
        c = await backend.open(config, {})
        assert isinstance(c, RemoteSlotSandbox)
        escaped = await escape(c, *naps()[:2])
        await c.close()
        assert not any(alive(pid) for pid in escaped)
    finally:
        await a.close()
        await b.close()
        await backend.aclose()


async def test_a_one_slot_modal_sandbox_keeps_root_in_a_pid_namespace(tmp_path: Path) -> None:
    backend = ModalBackend(FakeModalClient())
    config = modal_config(tmp_path)
    slot = await backend.open(config, {})
    try:
        assert isinstance(slot, RemoteSlotSandbox) and slot.jail == "pidns"
        r = await slot.exec("id -u; echo $$; ps -e -o pid= | wc -l")
        uid, pid, count = r.stdout.split()
        assert uid == "0" and int(pid) < 10 and int(count) < 10, r.stdout  # its own pids
        escaped = await escape(slot, *naps()[:2])
        # From inside, nothing outside its namespace can be signalled: not even by pid.
        r = await slot.exec(f"kill -9 {os.getpid()}")
        assert r.exit_code != 0
        await slot.stop_agent()
        assert not any(alive(pid) for pid in escaped)
        escaped_too = await escape_again(backend, config)
        assert not any(alive(pid) for pid in escaped_too)
    finally:
        await slot.close()
        await backend.aclose()


async def escape_again(backend: ModalBackend, config: Any) -> tuple[int, int]:
    """A fresh one-slot sandbox whose escapes end with its close (no stop before)."""
    slot = await backend.open(config, {})
    escaped = await escape(slot, *naps()[:2])
    await slot.close()
    return escaped


async def test_nomad_slots_stop_by_uid(nomad: FakeNomad, tmp_path: Path) -> None:  # noqa: F811
    config = nomad_config(nomad, tmp_path, slots_per_allocation=2)
    backend = NomadBackend(config)
    a = await backend.open(config, {})
    b = await backend.open(config, {})
    try:
        assert isinstance(a, RemoteSlotSandbox) and isinstance(b, RemoteSlotSandbox)
        assert (a.jail, b.jail) == ("uid", "uid") and a.uid != b.uid
        await stop_reaches_the_escapes_and_spares_the_neighbour(a, b)
    finally:
        await a.close()
        await b.close()
        await backend.aclose()
