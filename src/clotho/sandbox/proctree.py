"""Find and kill process trees through /proc (the kernel here has no /proc/PID/task/*/children)."""

from __future__ import annotations

import os
import signal
from collections import defaultdict


def _parent_map() -> dict[int, list[int]]:
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
        children[int(fields[1])].append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid`, parents before children."""
    children = _parent_map()
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def kill_descendants(pid: int, rounds: int = 5) -> int:
    """SIGKILL every descendant of `pid` (not `pid` itself); repeat while new ones appear."""
    killed = 0
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            break
        for child in found:
            try:
                os.kill(child, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed
