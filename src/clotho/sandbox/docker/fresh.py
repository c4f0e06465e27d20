"""Fresh processes in a container, started by the Engine API, not by the agent's shell.

Verification must not run through anything the agent could have shaped: its shell carries
functions, aliases, traps, `BASH_ENV` and exports. A Docker exec is a new process that runc
starts in the container's namespaces with an environment we give in full, so `fresh_exec`
runs `bash --noprofile --norc -c CMD` that way. Its stdin (a tar of the tests, say) goes
over the hijacked API socket, closed for writing at its end so the process sees EOF; each
output stream is kept up to a cap as it arrives (the rest is counted, never held), so the
harness's memory stays bounded whatever the command prints. A timeout kills the process
tree from the host. When the command has exited, a background child it left holding the
output pipes cannot keep the call waiting: the stream is cut after a short grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecResult
from clotho.sandbox.docker.attach import attach_exec
from clotho.sandbox.host import proctree

_STDIN_CHUNK = 1 << 20
# After the process exited: how long its output may still trickle in (a child it left
# holding the pipe would otherwise keep the stream open until the timeout).
_DRAIN_S = 0.5


class CappedSink:
    """Keeps the first `cap` bytes of a stream and counts the rest; a reader-like target
    for `AttachProtocol` (feed_data / feed_eof)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0
        self.eof = asyncio.get_running_loop().create_future()

    def feed_data(self, data: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += data[:room]
        self.dropped += max(0, len(data) - max(room, 0))

    def feed_eof(self) -> None:
        if not self.eof.done():
            self.eof.set_result(None)

    def text(self) -> str:
        text = self.data.decode(errors="replace")
        if self.dropped:
            text += f"\n[clotho: {self.dropped} more bytes of output were dropped]\n"
        return text


def socket_path(container: Any) -> str:
    path = getattr(getattr(container.docker, "connector", None), "path", None)
    if not path:
        raise SandboxError("fresh processes need the Docker daemon's unix socket")
    return str(path)


async def run_exec(container: Any, argv: list[str], timeout: float = 60.0) -> tuple[int, str]:
    """Run a command as root in the container to its end: (exit code, stdout + stderr)."""
    execution = await container.exec(argv, stdout=True, stderr=True, user="0:0")
    output = bytearray()
    async with asyncio.timeout(timeout):
        async with execution.start(detach=False) as stream:
            while (message := await stream.read_out()) is not None:
                output += message.data
        info = await execution.inspect()
        while info.get("Running"):  # the exit code can lag the end of the stream a moment
            await asyncio.sleep(0.01)
            info = await execution.inspect()
    return int(info.get("ExitCode") or 0), output.decode(errors="replace")


def in_container(pid: int, container_id: str) -> bool:
    """Whether host pid `pid` is a process of that container (its cgroup names the id): a
    pid the daemon reports is only ours to signal or read when the daemon is local."""
    try:
        with open(f"/proc/{pid}/cgroup") as file:
            return container_id in file.read()
    except OSError:
        return False


def _kill_tree(pid: int, container_id: str) -> None:
    if not in_container(pid, container_id):
        return
    proctree.kill_descendants(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# The runtime could not start the process at all (runc's own set-up failed: nothing of ours
# ran, and nothing of the agent's made it fail): tried again a few times.
_NOT_STARTED = ("OCI runtime exec failed", "error starting setns process")
_START_TRIES = 5


def _not_started(result: ExecResult) -> bool:
    text = result.stdout[:2000] + result.stderr[:2000]
    return result.exit_code in (126, 127) and all(mark in text for mark in _NOT_STARTED)


async def fresh_exec(
    container: Any,
    argv: list[str],
    *,
    env: dict[str, str],
    timeout: float,
    cwd: str | None = None,
    user: str = "0:0",
    stdin: bytes | None = None,
    max_output_bytes: int = 1 << 20,
) -> ExecResult:
    """Run `argv` as a new process of the container (see the module docstring). An exec the
    runtime failed to start (`_NOT_STARTED`) is tried again; still failing, a SandboxError
    (the harness's trouble, never read as the process's exit)."""
    for attempt in range(_START_TRIES):
        result = await _fresh_exec_once(
            container, argv, env=env, timeout=timeout, cwd=cwd, user=user, stdin=stdin,
            max_output_bytes=max_output_bytes,
        )  # fmt: skip
        if not _not_started(result):
            return result
        await asyncio.sleep(0.1 * 2**attempt)
    error = SandboxError(
        "the container runtime cannot start a process in the container: "
        + (result.stdout + result.stderr).strip()[:300]
    )
    error.host_failure = True  # runc's own set-up: nothing the agent did (infra, retried)
    raise error


async def _fresh_exec_once(
    container: Any,
    argv: list[str],
    *,
    env: dict[str, str],
    timeout: float,
    cwd: str | None,
    user: str,
    stdin: bytes | None,
    max_output_bytes: int,
) -> ExecResult:
    from aiodocker.exceptions import DockerError

    start = time.monotonic()
    out, err = CappedSink(max_output_bytes), CappedSink(max_output_bytes)
    try:
        execution = await container.exec(
            argv,
            stdin=stdin is not None,
            stdout=True,
            stderr=True,
            user=user,
            environment=env,
            workdir=cwd,
        )
    except DockerError as exc:
        raise SandboxError(f"cannot start a process in the container: {exc}") from exc
    transport, _ = await attach_exec(socket_path(container), execution.id, out, err)  # type: ignore[arg-type]
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            if stdin is not None:
                for offset in range(0, len(stdin), _STDIN_CHUNK):
                    transport.write(stdin[offset : offset + _STDIN_CHUNK])
                    await asyncio.sleep(0)  # let the transport drain its buffer
                if transport.can_write_eof():
                    transport.write_eof()
            info = await _wait_exit(execution, out, err)
    except TimeoutError:
        timed_out = True
        info = await _stop(execution, str(container.id))
    except asyncio.CancelledError:  # the caller gave up: the process must not run on
        await asyncio.shield(_stop(execution, str(container.id)))
        raise
    finally:
        transport.close()
    code = int(info.get("ExitCode") if info.get("ExitCode") is not None else -1)
    return ExecResult(
        exit_code=-9 if timed_out else code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
    )


async def _stop(execution: Any, container_id: str) -> dict[str, Any]:
    """Kill a fresh process's tree from the host and wait (2 s at most) for Docker to see it."""
    info = await execution.inspect()
    pid = int(info.get("Pid") or 0)
    if pid > 0 and info.get("Running"):
        await asyncio.to_thread(_kill_tree, pid, container_id)
    for _ in range(100):
        if not info.get("Running"):
            break
        await asyncio.sleep(0.02)
        info = await execution.inspect()
    return info


async def _wait_exit(execution: Any, out: CappedSink, err: CappedSink) -> dict[str, Any]:
    """Wait for the process to exit and its streams to end (or the short drain after)."""
    ends = {out.eof, err.eof}
    delay = 0.02
    while True:
        await asyncio.wait(ends, timeout=delay)
        info = await execution.inspect()
        if not info.get("Running") and info.get("ExitCode") is not None:
            if not all(f.done() for f in ends):
                await asyncio.wait(ends, timeout=_DRAIN_S)
            return info
        delay = min(delay * 2, 0.5)


# Shell (bash or sh builtins only, no forks): `self` is the caller's pid and `main` the
# container's main process, pid 1's oldest child when pid 1 is docker-init (or tini): if it
# exited, docker-init would end the container. Empty without an init.
FIND_MAIN = r"""
self=$$; main=
read -r c1 < /proc/1/comm
if [ "$c1" = docker-init ] || [ "$c1" = tini ]; then
  best=
  for d in /proc/[0-9]*; do
    read -r line < "$d/stat" 2>/dev/null || continue
    set -- ${line##*) }
    [ "$2" = 1 ] || continue
    if [ -z "$best" ] || [ "${20}" -lt "$best" ]; then best=${20}; main=${d#/proc/}; fi
  done
fi"""

# A remote daemon's way (a local one stops from the host: `freeze.py`).
# Stop every process of a whole container for good, run as root by a fresh exec (bash
# or sh builtins only, no forks). `kill -STOP -1` freezes every process but pid 1 and the caller,
# atomically as far as fork is concerned; then everything is killed except docker-init
# (pid 1) and the container's main process (`FIND_MAIN`), which stays stopped: nothing is
# left to continue it. Rounds repeat while something was still killed. Prints the main
# process's pid.
STOP_CONTAINER = (
    FIND_MAIN
    + r"""
round=0
while [ $round -lt 50 ]; do
  kill -s STOP -- -1 2>/dev/null
  killed=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $p in 1|"$self"|"$main") continue ;; esac
    read -r line < "$d/stat" 2>/dev/null || continue
    set -- ${line##*) }
    [ "$1" = Z ] && continue
    kill -s KILL -- "$p" 2>/dev/null && killed=$((killed + 1))
  done
  [ $killed -eq 0 ] && break
  round=$((round + 1))
done
echo "main=$main"
"""
)

# Run as a slot's own uid: signals reach exactly the processes of that uid (its shell, its
# daemons, in or out of its bubblewrap), none of the neighbours'. Rounds while any is left.
STOP_UID = r"""
round=0
while [ $round -lt 100 ] && kill -s KILL -- -1 2>/dev/null; do round=$((round + 1)); done
"""
