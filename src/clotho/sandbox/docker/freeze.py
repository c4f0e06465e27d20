"""Stopping and holding a container's processes from the host: no program of the container runs.

The harness must not run the container's programs to stop the agent: a `bash` the agent put
first on PATH would run as root before the programs' digests are compared, report nothing
left and remove itself. And a SIGSTOP is no hold: a process can have a timer continue it.
So on a local daemon, where the container's processes are host processes we may signal:

- the daemon's pause (the cgroup freezer) stops every process of the container at once,
  forks included, and nothing frozen runs, whatever signal it is sent;
- while frozen, the processes are listed (the daemon's `top`: host pids, each checked to be
  in the container's cgroup) and read from the host's `/proc`;
- to stop: each is sent SIGKILL from the host, except docker-init (pid 1) and the container's
  main process (docker-init's oldest child: if it ended, the container would), which gets
  SIGSTOP; then the container is thawed and they die;
- to hold: the container stays frozen while the digests and changes are read and the
  snapshot for the verification twin is taken, and is thawed only for the tests (`release`).

A remote daemon's processes are not ours to signal: it holds the same way (the pause is the
Engine's, the count from its process list), and it stops with a script run in the container
(`fresh.STOP_CONTAINER`), once the tests ran in the twin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.docker.fresh import in_container

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostProcess:
    """One process of the container as the host's `/proc/<pid>/stat` shows it."""

    pid: int
    ppid: int
    start: int  # clock ticks after boot: the oldest has the smallest


def _read(pid: int) -> HostProcess | None:
    try:
        with open(f"/proc/{pid}/stat") as file:
            line = file.read()
    except OSError:
        return None
    fields = line[line.rindex(")") + 2 :].split()  # state ppid ... (field 3 onwards)
    return HostProcess(pid=pid, ppid=int(fields[1]), start=int(fields[19]))


async def local_pid(container: Any) -> int | None:
    """The host pid of the container's pid 1 when the daemon is local (its processes are this
    host's: the cgroup of that pid names the container); None otherwise, said once when the
    daemon answers on a unix socket (the harness in another pid namespace, say)."""
    info = await container.show()
    pid = int((info.get("State") or {}).get("Pid") or 0)
    if pid > 0 and await asyncio.to_thread(in_container, pid, str(container.id)):
        return pid
    if pid > 0 and getattr(getattr(container.docker, "connector", None), "path", None):
        _warn_once(
            "the Docker daemon's containers are not processes this host can see (is the "
            "harness in another pid namespace?): the agent is held through the Engine alone and "
            "stopped by a script run in its container (docs/security.md, known gaps)"
        )
    return None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


async def _docker_call(what: str, call: Any, tolerated: str) -> None:
    from aiodocker.exceptions import DockerError

    try:
        await call()
    except DockerError as exc:
        if tolerated not in str(exc).lower():
            raise SandboxError(f"cannot {what} the container: {exc}") from exc


async def freeze(container: Any) -> None:
    """Pause the container (the cgroup freezer); one already paused stays so."""
    await _docker_call("pause", container.pause, "already paused")


async def thaw(container: Any) -> None:
    """Unpause the container; one not paused is left as it is."""
    await _docker_call("unpause", container.unpause, "not paused")


async def frozen_processes(container: Any) -> list[HostProcess]:
    """Every process of the (frozen) container, read from the host."""
    from aiodocker.exceptions import DockerError

    try:
        top = await container.top(ps_args="-o pid")
    except DockerError as exc:
        raise SandboxError(f"cannot list the container's processes: {exc}") from exc
    pids = [int(row[0]) for row in top.get("Processes") or [] if row and row[0].isdigit()]

    def read() -> list[HostProcess]:
        found = (_read(pid) for pid in pids if in_container(pid, str(container.id)))
        return [p for p in found if p is not None]

    return await asyncio.to_thread(read)


def main_process(processes: list[HostProcess], first: int, init: bool) -> int | None:
    """The container's main process: docker-init's oldest child, or pid 1 itself without an
    init (a shell as pid 1, which only SIGKILL and SIGSTOP from the host reach)."""
    if not init:
        return first
    children = [p for p in processes if p.ppid == first]
    return min(children, key=lambda p: p.start).pid if children else None


def kill_frozen(processes: list[HostProcess], first: int, main: int | None) -> int:
    """SIGKILL every process but pid 1 and the main process, which gets SIGSTOP: frozen, they
    take the signals before running a single instruction of their own. Returns how many
    were sent SIGKILL."""
    killed = 0
    for process in processes:
        try:
            if process.pid == main:  # pid 1 itself without an init
                os.kill(process.pid, signal.SIGSTOP)
            elif process.pid != first:
                os.kill(process.pid, signal.SIGKILL)
                killed += 1
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            error = SandboxError(
                "the harness may not signal the container's processes (it must run as root "
                f"beside a local Docker daemon): {exc}"
            )
            error.host_failure = True  # the harness's set-up: nothing the agent did
            raise error from exc
    return killed


def agent_count(processes: list[HostProcess], first: int, main: int | None) -> int:
    """How many processes the agent left: all but pid 1, the main process and its own
    children (the harness's session shell)."""
    return sum(1 for p in processes if p.pid not in (first, main) and p.ppid != main)


async def remote_agent_count(container: Any) -> int:
    """`agent_count` from the (frozen) container's process list as a remote daemon gives it
    (its host's pids, parents and ages: nothing of this host's /proc to read)."""
    from aiodocker.exceptions import DockerError

    try:
        info = await container.show()
        top = await container.top(ps_args="-o pid,ppid,etimes")
    except DockerError as exc:
        raise SandboxError(f"cannot list the container's processes: {exc}") from exc
    first = int((info.get("State") or {}).get("Pid") or 0)
    rows = [r for r in top.get("Processes") or [] if len(r) >= 3 and r[2].isdigit()]
    processes = [  # the oldest has the largest age: a negative start orders the same way
        HostProcess(pid=int(r[0]), ppid=int(r[1]), start=-int(r[2]))
        for r in rows
        if r[0].isdigit() and r[1].isdigit()
    ]
    return agent_count(processes, first, main_process(processes, first, init=True))
