"""Find and kill process trees through /proc (the kernel here has no /proc/PID/task/*/children)."""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict

_CLK_TCK = os.sysconf("SC_CLK_TCK")


def boot_seconds() -> float:
    """Now, in the clock /proc/PID/stat start times use (seconds since boot)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


_last_pid_fd: int | None = None


def last_pid() -> int | None:
    """The last pid the kernel handed out: later processes of the same tick have higher ones.

    Read on every command, so the file stays open (a cache of a descriptor, not state).
    """
    global _last_pid_fd
    try:
        if _last_pid_fd is None:
            _last_pid_fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)
        return int(os.pread(_last_pid_fd, 32, 0))
    except (OSError, ValueError):
        return None


def _is_old(pid: int, ticks: int, since_ticks: int, after_pid: int | None) -> bool:
    if ticks != since_ticks:
        return ticks < since_ticks
    return after_pid is not None and pid <= after_pid


def _parent_map(
    since_ticks: int | None = None, after_pid: int | None = None
) -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the fields after the last ')' are safe.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":  # dead already (its children went to a reaper): nothing to kill
            continue
        if since_ticks is not None and _is_old(int(entry), int(fields[19]), since_ticks, after_pid):
            children[-int(fields[1])].append(int(entry))  # old: kept out of the walk below
            continue
        children[int(fields[1])].append(int(entry))
    return children


def children(pid: int) -> list[int]:
    return list(_parent_map().get(pid, []))


def descendants(
    pid: int, started_after: float | None = None, after_pid: int | None = None
) -> list[int]:
    """Live descendants of `pid`, parents before children.

    With `started_after` (seconds since boot), only processes started at or after it, and
    their descendants started after it too; within the same clock tick, only pids above
    `after_pid`.
    """
    since = None if started_after is None else int(started_after * _CLK_TCK)
    children = _parent_map(since, after_pid)
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def running(pid: int) -> bool:
    """Whether `pid` exists and is neither a zombie nor dead (a child not yet reaped is a
    zombie: ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[:1] not in ([b"Z"], [b"X"], [])


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def kill_descendants(
    pid: int, rounds: int = 5, started_after: float | None = None, after_pid: int | None = None
) -> int:
    """SIGKILL every descendant of `pid` (not `pid` itself); repeat while new ones appear."""
    killed = 0
    for _ in range(rounds):
        found = descendants(pid, started_after, after_pid)
        if not found:
            break
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
            except PermissionError:
                # Not ours to kill (a container process seen by a non-root user): give up
                # here; the sandbox's own close still removes everything.
                return killed
    return killed
