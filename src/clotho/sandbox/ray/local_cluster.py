"""A real Ray cluster on 127.0.0.1 for the tests and `clotho bench scale`: a head and worker
nodes, each a `ray start` of its own with its own custom resource (`clotho_nodeK`), so one
machine can stand in for several (they share its cores).

Each node's daemons share the process group of the `ray start` that launched them (started
in a new session); Ray's workers (the actors) are children of the node's raylet in groups
of their own. `kill_node` and `stop` end exactly these processes, by id (`kill_node` all at
once, as a dying machine would), and `leftovers` says whether any survived: nothing else on
the machine is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port(taken: set[int]) -> int:
    """A port free now and not in `taken` (which it joins): two ports asked for one after the
    other may be the same one, freed in between, and Ray refuses a port given to two of its
    components (`gcs_server` and `dashboard_agent_http` were once both 56425)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if fields[0] == "Z":
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


class _StartFailed(Exception):
    """`ray start` exited with an error (its output is the message)."""


class LocalRayCluster:
    """`nodes` Ray nodes on this machine (node 0 is the head), 1 CPU each."""

    def __init__(self, nodes: int = 3) -> None:
        self.nodes = nodes
        self.temp_dir = Path(tempfile.mkdtemp(prefix="clotho-ray-", dir="/tmp"))
        self._ports: set[int] = set()
        self.port = _free_port(self._ports)
        self.address = f"127.0.0.1:{self.port}"
        self.groups: list[int] = []  # process group of each node's daemons
        self.ray = str(Path(sys.executable).parent / "ray")
        self._seen: set[int] = set()

    def _start(self, index: int, attempts: int = 3) -> None:
        """Start node `index`. Its ports are chosen free here and bound by Ray moments later,
        so another process may take one in between: a start that fails is ended whole and
        tried again on fresh ports (the head's address too), up to `attempts` times."""
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(index)
                return
            except _StartFailed as failed:
                if attempt == attempts:
                    raise RuntimeError(
                        f"ray start (node {index}) failed {attempts} times:\n{failed}"
                    ) from None
                if index == 0:
                    self.port = _free_port(self._ports)
                    self.address = f"127.0.0.1:{self.port}"

    def _start_once(self, index: int) -> None:
        args = [
            self.ray,
            "start",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=1",
            f"--resources={json.dumps({f'clotho_node{index}': 1})}",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={_free_port(self._ports)}",
        ]
        if index == 0:
            args += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--ray-client-server-port={_free_port(self._ports)}",
                f"--temp-dir={self.temp_dir}",
            ]
        else:
            args += [f"--address={self.address}"]
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            self.kill_node(len(self.groups) - 1)  # whatever daemons it left
            self.groups.pop()
            raise _StartFailed(out[-3000:])

    def start(self) -> LocalRayCluster:
        try:
            for index in range(self.nodes):
                self._start(index)
        except BaseException:
            self.stop()
            raise
        return self

    def add_node(self) -> None:
        """One more worker node (the benchmark grows the cluster between measurements)."""
        try:
            self._start(len(self.groups))
        except BaseException:
            self.stop()
            raise

    def node_processes(self, index: int) -> set[int]:
        """Every live process of node `index`: its daemons and their descendants (workers,
        and the sandboxes those started)."""
        group = self.groups[index]
        tree = _children()
        roots = [pid for pids in tree.values() for pid in pids if _pgid(pid) == group]
        found: set[int] = set()
        stack = list(roots)
        while stack:
            pid = stack.pop()
            if pid in found:
                continue
            found.add(pid)
            stack.extend(tree.get(pid, []))
        self._seen |= found
        return found

    def kill_node(self, index: int) -> None:
        """End every process of one node at once, as a machine that dies loses them: all are
        stopped first (listed again until no new one appears; a stopped process cannot fork),
        then killed. Killed one by one, a host actor could see its sandbox's shell die and
        report that before its own turn came: a death no real machine shows."""
        stopped: set[int] = set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.groups[index], signal.SIGSTOP)
        while fresh := self.node_processes(index) - stopped:
            for pid in fresh:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= fresh
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.groups[index], signal.SIGKILL)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """End every node's processes (workers first, head last) and remove the temp dir."""
        for index in reversed(range(len(self.groups))):
            pids = self.node_processes(index)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.1)
            self.kill_node(index)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.leftovers():
            time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftovers(self) -> list[int]:
        """Processes of this cluster still alive (zombies aside)."""
        return sorted(p for p in self._seen if _alive(p))
