"""Per-sandbox cgroups (v1) for the local backends: a freezer that stops every process of a
sandbox at once, whatever it forked, renamed or detached.

Layout: `/sys/fs/cgroup/<controller>/clotho/<name>/agent` holds the sandbox's own processes
(bubblewrap and everything under it); each `exec_fresh` gets `fresh-<n>` beside it, so the
verifier's processes can be stopped apart from the frozen agent. A process enters its cgroup
before it starts anything (`enter_argv`: a tiny `sh` writes its own pid, then `exec`s), so no
child is born outside. `<name>` is the sandbox's state folder name: whoever removes a
leftover folder can remove its cgroups too (`destroy`).

Resource limits (memory, pids) reuse this: `SandboxCgroups.create(name, ("freezer",
"memory", "pids"))` makes the same layout in each controller, and `enter_argv` puts the
process into all of them; limits set on `clotho/<name>` hold for `agent` and `fresh-*`
together.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "clotho"
AGENT = "agent"

# `sh -c ENTER sh <procs files> -- argv...`: writes its pid into each file, then execs argv.
_ENTER = (
    'p=$$; while [ "$1" != -- ]; do echo "$p" > "$1" || exit 125; shift; done; shift; exec "$@"'
)


def available(controller: str = "freezer") -> bool:
    """A v1 hierarchy for `controller` that we may write (root on a cgroup v1 host)."""
    base = CGROUP_ROOT / controller
    return (base / "cgroup.procs").exists() and os.access(base, os.W_OK)


class SandboxCgroups:
    """The cgroups of one sandbox, in each of `controllers`."""

    def __init__(self, name: str, controllers: Sequence[str] = ("freezer",)) -> None:
        self.name = name
        self.controllers = tuple(controllers)
        self._fresh = itertools.count()

    @classmethod
    def create(cls, name: str, controllers: Sequence[str] = ("freezer",)) -> SandboxCgroups | None:
        """Make the sandbox's `agent` cgroup in each controller; None where cgroups v1 are not
        ours to write (not root, a v2-only host): the caller falls back to what it can do."""
        if not all(available(c) for c in controllers):
            return None
        groups = cls(name, controllers)
        for controller in controllers:
            (groups.path(controller) / AGENT).mkdir(parents=True, exist_ok=True)
        return groups

    def path(self, controller: str = "freezer", sub: str = "") -> Path:
        base = CGROUP_ROOT / controller / PARENT / self.name
        return base / sub if sub else base

    def enter_argv(self, sub: str = AGENT) -> list[str]:
        """argv prefix that moves the process into `sub` in every controller, then execs."""
        procs = [str(self.path(c, sub) / "cgroup.procs") for c in self.controllers]
        return ["/bin/sh", "-c", _ENTER, "sh", *procs, "--"]

    def new_fresh(self) -> str:
        """A new cgroup for one fresh process tree (its name under the sandbox's)."""
        sub = f"fresh-{next(self._fresh)}"
        for controller in self.controllers:
            self.path(controller, sub).mkdir(exist_ok=True)
        return sub

    def remove_sub(self, sub: str) -> None:
        """Remove one subgroup if it is empty now (else `destroy` removes it later)."""
        for controller in self.controllers:
            with contextlib.suppress(OSError):
                self.path(controller, sub).rmdir()

    def pids(self, sub: str = AGENT) -> list[int]:
        try:
            text = (self.path("freezer", sub) / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split()]

    def subgroups(self) -> list[str]:
        try:
            return sorted(p.name for p in self.path("freezer").iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    # -- freezing: every step is a write of a few bytes, cheap enough for the event loop ---

    def start_freeze(self, sub: str) -> None:
        (self.path("freezer", sub) / "freezer.state").write_text("FROZEN")

    def frozen(self, sub: str) -> bool:
        return (self.path("freezer", sub) / "freezer.state").read_text().strip() == "FROZEN"

    def thaw(self, sub: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.path("freezer", sub) / "freezer.state").write_text("THAWED")

    def freeze_and_kill(self, sub: str, keep: Iterable[int] = (), timeout: float = 10.0) -> bool:
        """Freeze `sub` and SIGKILL everything in it but `keep`, killing again until the
        kernel says every task is frozen. Killing while freezing matters: a parent waiting in
        `vfork` for a child the freezer already caught never counts as frozen (seen on 6.x
        with cgroup v1), but SIGKILL ends that wait; newborns of a freezing cgroup are born
        freezing, so each pass catches what the last one missed. Frozen tasks die on thaw."""
        try:
            self.start_freeze(sub)
        except FileNotFoundError:
            return True
        deadline = time.monotonic() + timeout
        while True:
            self.kill(sub, keep)
            try:
                if self.frozen(sub):
                    self.kill(sub, keep)  # whatever was forked between the last pass and FROZEN
                    return True
            except FileNotFoundError:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)

    def kill(self, sub: str, keep: Iterable[int] = ()) -> int:
        """SIGKILL every process in `sub` but `keep`. Frozen ones die when thawed."""
        spared = set(keep)
        killed = 0
        for pid in self.pids(sub):
            if pid in spared:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        return killed

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill everything in every subgroup and remove the cgroups (blocking; a thread)."""
        for sub in self.subgroups():
            self.freeze_and_kill(sub, timeout=1.0)
            self.thaw(sub)
        deadline = time.monotonic() + timeout
        for controller in self.controllers:
            base = self.path(controller)
            if not base.exists():
                continue
            for sub in [*sorted(p for p in base.iterdir() if p.is_dir()), base]:
                while True:
                    try:
                        sub.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError as exc:  # EBUSY: killed tasks not reaped yet
                        if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                            break
                        time.sleep(0.005)


def destroy_named(name: str) -> None:
    """Remove the cgroups of the sandbox whose state folder is called `name`, if any (every
    controller that has one), killing what is left in them."""
    controllers = [
        c.name for c in CGROUP_ROOT.glob("*") if (c / PARENT / name).is_dir()
    ] if CGROUP_ROOT.is_dir() else []  # fmt: skip
    if controllers:
        SandboxCgroups(name, controllers).destroy()


def _thaw(name: str) -> None:
    base = SandboxCgroups(name).path("freezer")
    with contextlib.suppress(OSError):
        for group in [base, *(p for p in base.iterdir() if p.is_dir())]:
            state = group / "freezer.state"
            if state.exists() and state.read_text().strip() != "THAWED":
                state.write_text("THAWED")


def procs(group: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    return []


def kill_named(name: str, timeout: float = 5.0) -> bool:
    """SIGKILL every process in the pids cgroup of the sandbox whose state folder is `name`
    (and its subgroups) until none is left; False if some still are after `timeout`.

    `pids.max` 0 first, so a fork bomb cannot refill what is being emptied (without freezing:
    this works whether or not the sandbox has a freezer cgroup)."""
    base = SandboxCgroups(name, ("pids",)).path("pids")
    if not base.is_dir():
        return True
    with contextlib.suppress(OSError):
        (base / "pids.max").write_text("0")
    deadline = time.monotonic() + timeout
    while True:
        try:
            groups = [base, *(p for p in base.iterdir() if p.is_dir())]
        except FileNotFoundError:
            return True
        pids = [pid for group in groups for pid in procs(group)]
        if not pids:
            return True
        if time.monotonic() > deadline:
            return False
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _thaw(name)  # a frozen process (after `stop_agent`) dies only once thawed
        time.sleep(0.002)


def remove_named(name: str) -> None:
    """Kill what is left of the sandbox whose state folder is `name` and remove its cgroups
    (the reaper's part for a folder whose owner died; blocking)."""
    kill_named(name)
    destroy_named(name)
