"""The `ray` backend on a real local Ray cluster: a head and two worker nodes on 127.0.0.1,
each its own `ray start` with its own resource, running bubblewrap sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import TaskFactory, requires_bwrap
from tests.docker_probe import requires_docker
from tests.support import running, wait_until

ray = pytest.importorskip("ray", reason="the ray extra is not installed (make test installs it)")

from clotho.agent.reference import OracleAgent  # noqa: E402
from clotho.errors import ConfigError  # noqa: E402
from clotho.runs.eval import run_eval  # noqa: E402
from clotho.runs.records import EvalConfig, TrialRecord  # noqa: E402
from clotho.sandbox import (  # noqa: E402
    DockerSandboxConfig,
    LocalSandboxConfig,
    PoolConfig,
    SlotPool,
)
from clotho.sandbox.base import PathChange  # noqa: E402
from clotho.sandbox.host.state import SANDBOX_UID_BASE, SANDBOX_UID_COUNT  # noqa: E402
from clotho.sandbox.local.netguard import address_rule  # noqa: E402
from clotho.sandbox.ray import HostLost, RayBackend, RaySandbox  # noqa: E402
from clotho.sandbox.ray.channel import MAGIC  # noqa: E402
from clotho.sandbox.ray.local_cluster import LocalRayCluster  # noqa: E402
from clotho.sandbox.remote_config import RaySandboxConfig  # noqa: E402
from clotho.tasks.harbor import load_task  # noqa: E402
from clotho.tasks.trial import HarborTrial, run_trial  # noqa: E402

pytestmark = requires_bwrap


def disconnect_driver() -> None:
    """Before a cluster stops: a test that failed before closing its backend leaves this
    process connected to it, and Ray ends a driver whose cluster went away (exit 1, a minute
    later): the whole test session, with no summary. Nothing of this process may stay
    connected, whatever failed."""
    import ray

    from clotho.sandbox.ray import backend as ray_backend

    ray_backend._connections = 0
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRayCluster]:
    started = LocalRayCluster(nodes=3).start()
    try:
        yield started
    finally:
        disconnect_driver()
        started.stop()
        assert started.leftovers() == [], "Ray processes survived the cluster's stop"


def ray_config(cluster: LocalRayCluster, **inner: object) -> RaySandboxConfig:
    return RaySandboxConfig(address=cluster.address, inner=LocalSandboxConfig(**inner))


async def test_sandboxes_spread_over_nodes_and_do_everything_a_sandbox_does(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    config = ray_config(cluster)
    async with SlotPool(PoolConfig(max_size=8), labels={"clotho.run": "ray-api"}) as pool:
        sandboxes = [await pool.acquire(config) for _ in range(3)]
        assert all(isinstance(s, RaySandbox) for s in sandboxes)
        nodes = {s.node_id for s in sandboxes}  # type: ignore[attr-defined]
        assert len(nodes) == 3, "three sandboxes on three idle nodes land one per node"
        pids = await asyncio.gather(*(s.exec("echo $$; echo err >&2; exit 3") for s in sandboxes))
        assert all(r.exit_code == 3 and r.stderr == "err\n" for r in pids)
        box = sandboxes[0]
        # state persists in the session shell, on the node
        await box.exec("export X=41")
        assert (await box.exec("echo $((X+1))")).stdout == "42\n"
        assert (await box.exec("sleep 5", timeout=0.5)).timed_out

        # files: small inline, big as Ray objects, binary-exact; errors keep their type
        await box.write_file("small.txt", b"hi\n")
        assert (await box.exec("cat small.txt")).stdout == "hi\n"
        big = os.urandom(3 << 20)
        await box.write_file("big.bin", big)
        assert await box.read_file("big.bin") == big
        with pytest.raises(OSError) as too_big:
            await box.read_file("big.bin", max_bytes=1 << 20)
        assert too_big.value.errno == errno.EFBIG
        with pytest.raises(FileNotFoundError):
            await box.read_file("missing")
        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "sub" / "blob").write_bytes(big)
        (tree / "a.txt").write_text("a")
        await box.upload(tree, "/app/up")
        assert (await box.exec("cat up/a.txt; wc -c < up/sub/blob")).stdout == f"a{len(big)}\n"
        await box.download("/app/up", tmp_path / "back")
        assert (tmp_path / "back" / "sub" / "blob").read_bytes() == big
        await box.download("/app/small.txt", tmp_path / "one")
        assert (tmp_path / "one").read_bytes() == b"hi\n"

        # verification from outside the agent's session, forwarded to the node
        other = sandboxes[1]
        await other.write_file("/app/t.sh", b"echo fresh $X")
        await other.exec("export X=agent; sleep 300 &")
        digests = await other.digests(["/app/t.sh", "/app/none"])
        assert digests["/app/none"] is None and digests["/app/t.sh"]
        await other.stop_agent()
        fresh = await other.exec_fresh("bash /app/t.sh", timeout=30)
        assert fresh.stdout == "fresh\n"

        backend = pool._backends[next(k for k in pool._backends if k.startswith("ray"))]
        assert isinstance(backend, RayBackend)
        listed = [r for r in await backend.records() if r.labels.get("clotho.run") == "ray-api"]
        assert len(listed) == 3 and not any(r.orphaned() for r in listed)
        for s in sandboxes:
            await pool.release(s)
    # the pool closed: nothing of this run is left on any node
    async with SlotPool() as pool:
        backend = pool._backend(config)
        assert isinstance(backend, RayBackend)
        left = [r for r in await backend.records() if r.labels.get("clotho.run") == "ray-api"]
        assert left == []


def _listening(pid: int) -> set[tuple[str, int]]:
    """The TCP addresses process `pid` listens on, read from the kernel (/proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, size in (("tcp", 4), ("tcp6", 16)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, size, 4))
            found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def _outward_address() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet: picks the host's outward address
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") else address


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return os.system, (f"touch {self.marker}",)


async def test_the_command_channel_listens_on_the_nodes_address_and_unpickles_nothing(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """The issue's exploit on a real host actor: one pickled frame to its channel's port ran
    a command as root. Now the port is bound to the address the node was started with
    (127.0.0.1 here, not the machine's other addresses), and the frame runs nothing: the
    actor closes the connection and its channel goes on serving the driver."""
    config = ray_config(cluster)
    async with SlotPool(PoolConfig(max_size=2), labels={"clotho.run": "ray-chan"}) as pool:
        box = await pool.acquire(config)
        assert isinstance(box, RaySandbox)
        host = box.host
        assert host.channel is not None and host.listen is not None
        address, port = host.listen
        assert address == "127.0.0.1", "the node was started with --node-ip-address=127.0.0.1"
        pid = (await host.actor.ping.remote())["pid"]
        bound = {a for a in _listening(pid) if a[1] == port}
        assert bound == {("127.0.0.1", port)}, bound
        assert await host.actor.listening.remote() == [("127.0.0.1", port)]
        outward = _outward_address()
        if outward is not None:  # not reachable on the machine's network address
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(outward, port)

        marker = tmp_path / "pwned"
        data = pickle.dumps(_Evil(marker))
        reader, writer = await asyncio.open_connection(address, port)
        challenge = await asyncio.wait_for(reader.read(1024), 30)
        assert challenge.startswith(MAGIC)
        writer.write(struct.pack("!I", len(data)) + data)
        try:
            rest = await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:
            rest = b""
        writer.close()
        assert rest == b"", "the actor answered a frame it should have refused"
        assert not marker.exists(), "a pickle sent to the channel ran"
        # the driver's channel is untouched and still carries the sandbox's commands
        assert (await box.exec("echo still")).stdout == "still\n"
        assert not host.channel.lost
        await pool.release(box)
    assert not marker.exists()


async def test_a_network_on_the_cluster_is_refused_where_no_guard_holds(
    cluster: LocalRayCluster,
) -> None:
    """Docker's network is the host's: nothing keeps a container off the other nodes, so a
    networked Docker sandbox on a cluster is refused (before any Docker is touched)."""
    config = RaySandboxConfig(
        address=cluster.address,
        inner=DockerSandboxConfig(image="x", network=True, host_network=True),
    )
    async with SlotPool(PoolConfig(max_size=1)) as pool:
        with pytest.raises(ConfigError, match="needs the local backend"):
            await pool.acquire(config)


@pytest.mark.skipif(os.geteuid() != 0, reason="a networked sandbox needs root")
async def test_a_networked_sandbox_on_the_cluster_reaches_no_node(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """Every node's address joins the network guard before a networked sandbox opens: the
    sandbox reaches neither its host actor's channel nor Ray's own port (GCS)."""
    config = ray_config(cluster, network=True)
    async with SlotPool(PoolConfig(max_size=2), labels={"clotho.run": "ray-net"}) as pool:
        box = await pool.acquire(config)
        assert isinstance(box, RaySandbox) and box.host.listen is not None
        node = box.host.address  # as Ray reports it: this machine's network address
        rule = address_rule(SANDBOX_UID_BASE, SANDBOX_UID_COUNT, ipaddress.ip_network(node))
        checked = await asyncio.to_thread(
            subprocess.run, ["iptables", "-w", "-C", *rule], capture_output=True
        )
        assert checked.returncode == 0, "the node's address is not in the guard"
        channel, port = box.host.listen
        for address, target in ((channel, port), (node, cluster.port), (channel, cluster.port)):
            r = await box.exec(f"timeout 10 bash -c 'exec 3<>/dev/tcp/{address}/{target}'")
            assert r.exit_code != 0, f"the sandbox reached {address}:{target}"
        assert (await box.exec("echo up")).stdout == "up\n"
        await pool.release(box)


async def test_a_killed_host_actor_is_replaced_and_what_it_left_is_reaped(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """A host actor killed while its node lives (out of memory, a stray kill): its sandbox
    fails as lost, the next sandbox on that node opens through a new actor, and the new
    actor removes what the old one left (its processes, its folder)."""
    state = tmp_path / "state"
    state.mkdir()
    config = RaySandboxConfig(
        address=cluster.address,
        node_resource="clotho_node1",  # one node: nowhere else to go
        inner=LocalSandboxConfig(state_dir=str(state)),
    )
    marker = [f"clotho-left-{os.getpid()}-{id(state)}", "1000"]
    async with SlotPool(PoolConfig(max_size=4), labels={"clotho.run": "ray-kill"}) as pool:
        box = await pool.acquire(config)
        assert isinstance(box, RaySandbox)
        await box.exec(f"(exec -a {marker[0]} sleep 1000 &)")
        assert await wait_until(lambda: running(marker))
        old_folders = set(state.iterdir())
        pid = (await box.host.actor.ping.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(HostLost):
            await box.exec("true")
        assert box.host_lost
        await pool.release(box)

        again = await asyncio.wait_for(pool.acquire(config), 120)
        assert isinstance(again, RaySandbox) and again.node_id == box.node_id
        assert again.host is not box.host and not again.host.dead
        assert (await again.host.actor.ping.remote())["pid"] != pid
        assert (await again.exec("echo back")).stdout == "back\n"
        assert await wait_until(lambda: not running(marker)), "the old sandbox still runs"
        assert await wait_until(lambda: not (old_folders & set(state.iterdir())))
        await pool.release(again)


async def test_a_host_that_never_starts_does_not_hold_the_driver_closing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose Python hangs importing clotho (a broken install): its host actor never
    answers. Closing the backend meanwhile cancels the wait for it: it does not sit out the
    start timeout, nor a shutdown call the actor would never answer."""
    broken = tmp_path / "site" / "clotho"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("import time\ntime.sleep(10**6)\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))  # the cluster's processes alone
    stuck = LocalRayCluster(nodes=1)
    waiting: asyncio.Future[object] | None = None
    try:
        stuck.start()
        monkeypatch.delenv("PYTHONPATH")
        backend = RayBackend(RaySandboxConfig(address=stuck.address))
        waiting = asyncio.ensure_future(backend.hosts())
        assert await wait_until(lambda: bool(backend._hosts)), "no host actor was started"
        (host,) = backend._hosts.values()
        assert host.ready is not None and not host.ready.done()
        await asyncio.wait_for(backend.aclose(), 120)
        assert host.ready.cancelled(), "the close waited for the start to time out"
        assert not host.answered
    finally:
        if waiting is not None:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        disconnect_driver()
        stuck.stop()
    assert stuck.leftovers() == []


def _slow_task(root: Path, name: str) -> None:
    """A task whose solution says it started, then waits for /app/go: it cannot finish
    before the test has killed a node under it, however slow the machine is."""
    task = root / name
    for sub in ("tests", "solution", "environment"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(
        'version = "1.0"\n[metadata]\ncategory = "ray"\n'
        "[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 600.0\n"
    )
    (task / "instruction.md").write_text("Write ok into /app/done.txt.")
    (task / "solution" / "solve.sh").write_text(
        f"echo {name} > /app/started\n"
        "until [ -e /app/go ]; do sleep 0.05; done\n"
        "echo ok > /app/done.txt\n"
    )
    (task / "tests" / "test.sh").write_text(
        "mkdir -p /logs/verifier\n"
        'if [ "$(cat /app/done.txt)" = ok ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )


def _started(state: Path) -> dict[str, str]:
    """Sandboxes whose solution has started: their task, by the Ray node they run on."""
    found = {}
    for folder in state.iterdir():
        marker = folder / "app" / "started"
        lease = folder / "lease.json"
        if marker.is_file() and lease.is_file() and marker.read_text().strip():
            node = json.loads(lease.read_text())["labels"]["clotho.ray-node"]
            found[node] = marker.read_text().strip()
    return found


async def test_a_node_that_dies_mid_run_loses_its_rollouts_which_are_retried_on_the_others(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """`run_eval` over the cluster: three slow tasks, one sandbox per node; node 2 is killed
    while they run. Its task's try is an infra error retried within the run on a surviving
    node; every task ends scored and passing, one results line each; nothing of the run is
    left on the surviving nodes, and `clotho sandbox ls/gc` see and remove the dead node's
    leftover folder."""
    # A state folder of its own: other runs' reapers on this machine would take the dead
    # node's orphan before `clotho sandbox gc` is shown to.
    state = tmp_path / "state"
    state.mkdir()
    tasks = tmp_path / "tasks"
    for name in ("slow-a", "slow-b", "slow-c"):
        _slow_task(tasks, name)
    config = EvalConfig(
        paths=[str(tasks)],
        agent="oracle",
        concurrency=3,
        prewarm=False,
        sandbox=ray_config(cluster, state_dir=str(state)),
    )
    out = tmp_path / "ray-death"
    events: list[tuple[str, object]] = []
    run = asyncio.create_task(run_eval(config, out, listener=lambda e, d: events.append((e, d))))

    def all_started() -> bool:  # all three solutions run, one per node
        assert not run.done(), run.result() if not run.exception() else run.exception()
        return len(_started(state)) >= 3

    assert await wait_until(all_started, timeout=300)
    node2 = _node_of(cluster, 2)  # the run's backend connected this process to Ray
    lost_task = _started(state)[node2]
    cluster.kill_node(2)

    def released_until_done() -> bool:
        """Let every started solution off a surviving node finish, the retry's included."""
        for folder in state.iterdir():
            lease, app = folder / "lease.json", folder / "app"
            with contextlib.suppress(OSError, ValueError):  # a folder still being made
                node = json.loads(lease.read_text())["labels"]["clotho.ray-node"]
                if node != node2 and (app / "started").is_file() and not (app / "go").exists():
                    (app / "go").touch()
        return run.done()

    assert await wait_until(released_until_done, timeout=300)
    metrics = await run

    records = [
        TrialRecord.model_validate_json(line)
        for line in (out / "results.jsonl").read_text().splitlines()
    ]
    assert sorted(r.task for r in records) == ["slow-a", "slow-b", "slow-c"], "one line each"
    assert all(r.passed and r.error is None for r in records), records
    lost = {r.task: r.lost_tries for r in records if r.lost_tries}
    assert list(lost) == [lost_task], lost
    assert [e.kind for e in lost[lost_task]] == ["infra"]
    assert "lost" in lost[lost_task][0].message
    retried = [d for e, d in events if e == "trial_retry"]
    assert [r.task for r in retried] == [lost_task]  # type: ignore[attr-defined]
    assert (metrics.n_attempts, metrics.n_scored, metrics.n_passed) == (3, 3, 3)
    assert metrics.errors == {}
    # The retry ran on a surviving node: the only folder left is the dead node's first try.
    leftovers = list(state.iterdir())
    assert len(leftovers) == 1
    lease = json.loads((leftovers[0] / "lease.json").read_text())
    assert lease["labels"]["clotho.ray-node"] == node2

    # the surviving nodes kept nothing of the run; the dead node's folder is an orphan that
    # `clotho sandbox ls/gc --ray` see and remove through a surviving node of its machine
    where = ["--ray", cluster.address, "--state-dir", str(state)]
    listed = await asyncio.to_thread(_clotho, "sandbox", "ls", *where, env={"COLUMNS": "400"})
    rows = [line for line in listed.splitlines() if "ray-death" in line]
    # (listed once through the cluster, and once as a folder of the local --state-dir)
    assert rows and all("yes" in row and lost_task in row for row in rows), listed
    cleaned = await asyncio.to_thread(_clotho, "sandbox", "gc", *where)
    assert "removed" in cleaned and "removed 0 " not in cleaned, cleaned
    assert list(state.iterdir()) == []
    backend = RayBackend(config.sandbox)  # type: ignore[arg-type]
    try:
        left = [r for r in await backend.records() if "ray-death" in r.labels.get("clotho.run", "")]
    finally:
        await backend.aclose()
    assert left == []


async def test_a_sandbox_the_agent_breaks_on_a_live_node_is_its_failure_not_retried(
    cluster: LocalRayCluster, tmp_path: Path
) -> None:
    """The other side of a lost node: the solution kills its own session shell on a node
    whose host actor still answers when asked after the failure. That is the agent's
    failure, scored and run once; a retry would let a policy re-roll what it broke."""
    tasks, state = tmp_path / "tasks", tmp_path / "state"
    state.mkdir()
    _slow_task(tasks, "breaks")
    (tasks / "breaks" / "solution" / "solve.sh").write_text("kill -9 -1\nsleep 5\n")
    config = EvalConfig(
        paths=[str(tasks)],
        agent="oracle",
        concurrency=1,
        retries=2,
        prewarm=False,
        sandbox=ray_config(cluster, state_dir=str(state)),
    )
    events: list[str] = []
    out = tmp_path / "ray-breaks"
    metrics = await run_eval(config, out, listener=lambda e, d: events.append(e))
    (line,) = (out / "results.jsonl").read_text().splitlines()
    record = TrialRecord.model_validate_json(line)
    assert record.error is not None and record.error.kind == "agent", record.error
    assert "backend is healthy" in record.error.message
    assert record.lost_tries == [] and "trial_retry" not in events
    assert (metrics.n_scored, metrics.n_passed) == (1, 0)


async def test_the_runners_rules_judge_a_sandbox_on_a_node(
    cluster: LocalRayCluster, make_task: TaskFactory, tmp_path: Path
) -> None:
    """The node's list of changes reaches the driver, so a sandbox on Ray is judged as on
    its own backend: a right answer beside a `/conftest.py` (pytest's configuration above
    /tests) is `tamper`, not a pass; the same answer alone passes."""
    config = ray_config(cluster, state_dir=str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    async with SlotPool(labels={"clotho.run": "ray-rules"}) as pool:
        box = await pool.acquire(config)
        try:
            await box.exec("echo hi > /app/new.txt")
            await box.stop_agent()
            changes = await box.changed_paths()
        finally:
            await pool.release(box)
        assert changes is not None
        assert PathChange("/app/new.txt", "added", False) in changes
        outcomes = []
        for name, extra in (("honest", ""), ("forger", "echo 'x = 1' > /conftest.py\n")):
            task = load_task(make_task(name, solve_sh=f"echo ok > /app/done.txt\n{extra}"))
            outcomes.append(await run_trial(HarborTrial(task), OracleAgent(), config, pool))
    honest, forger = outcomes
    assert honest.error is None and honest.passed, honest.error
    assert forger.error is not None and forger.error.kind == "tamper", forger.error
    assert "/conftest.py" in forger.error.message and not forger.passed


def _clotho(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "clotho", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _node_of(cluster: LocalRayCluster, index: int) -> str:
    """The Ray node id offering `clotho_node{index}`."""
    for node in ray.nodes():
        if node.get("Alive") and f"clotho_node{index}" in node.get("Resources", {}):
            return str(node["NodeID"])
    raise AssertionError(f"no node {index}")


def test_eval_with_ray_runs_the_bundled_tasks_over_the_cluster_with_the_oracle_passing(
    cluster: LocalRayCluster, examples_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    args = ["eval", str(examples_dir), "--agent", "oracle", "--ray", cluster.address]
    done = subprocess.run(
        [sys.executable, "-m", "clotho", *args, "--concurrency", "6", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == len([p for p in examples_dir.iterdir() if (p / "task.toml").is_file()])
    assert all(r["passed"] for r in records), [r for r in records if not r["passed"]]
    saved = json.loads((out / "config.json").read_text())
    assert saved["sandbox"]["backend"] == "ray"
    assert saved["sandbox"]["inner"]["backend"] == "local"


@requires_docker
async def test_docker_sandboxes_run_on_the_nodes_too(cluster: LocalRayCluster) -> None:
    config = RaySandboxConfig(
        address=cluster.address, inner=DockerSandboxConfig(image="clotho/base:bookworm")
    )
    async with SlotPool(PoolConfig(max_size=4), labels={"clotho.run": "ray-docker"}) as pool:
        boxes = [await pool.acquire(config) for _ in range(2)]
        assert len({b.node_id for b in boxes}) == 2  # type: ignore[attr-defined]
        for box in boxes:
            assert (
                await box.exec("cat /etc/debian_version >/dev/null && echo in")
            ).stdout == "in\n"
            await box.write_file("/app/x", b"through the actor")
            assert await box.read_file("/app/x") == b"through the actor"
        for box in boxes:
            await pool.release(box)


def test_a_head_whose_port_was_taken_starts_again_on_a_fresh_one() -> None:
    """The cluster's ports are chosen free and bound by Ray moments later: another process
    that took the head's port in between fails the start. The failed start is
    ended whole and the head starts on a fresh port."""
    cluster = LocalRayCluster(nodes=1)
    taken_port = cluster.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", taken_port))
        taken.listen()
        try:
            cluster.start()
            assert cluster.port != taken_port
            assert cluster.address == f"127.0.0.1:{cluster.port}"
            assert len(cluster.groups) == 1, "the failed start's group was kept"
        finally:
            cluster.stop()
    assert cluster.leftovers() == []
