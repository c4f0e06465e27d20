"""Several sandboxes (slots) per container: `SlotHost` hands them out, a container per N.

Starting a container costs 200-400 ms and a few MB; a slot in a running one costs one exec
(its shell). `SlotHost.open(config)` gives a slot of a container started from the same
configuration that has one free, or starts a container for `slots_per_container` of them.
Each slot has its own folder (`slot_layout.py`), its own persistent shell (over its own FIFOs
or attach socket) and, with `slot_isolation` bwrap, its own uid, mount, network, IPC and UTS
namespaces. Where the harness may write the host's cgroup v1 tree (root, a local daemon),
each slot also gets its own memory and pids cgroups under its container's (`SlotCgroup`):
a share of the container's pids limit (a fork bomb starves only its own slot), exact OOM
and refused-fork counters (its failure is `limit` whatever its exit code hid), and a kill
that no change of uid, session or environment escapes. Elsewhere (a remote daemon, cgroup
v2, no right to write there) an isolated slot's processes get that share as RLIMIT_NPROC
(per uid, so each container's slots use a random block of uids; bubblewrap's user
namespace makes it final), and a slot whose uid runs about that many tasks ends as
`limit`; memory and OOM counters stay the container's, counted against a slot only when
its own command died of SIGKILL (or its shell died), and slots without isolation share
everything. Closing a slot kills all
its processes (its cgroup's, by its uid when isolated, and by the token in every process's
environment) and wipes its folder; a freed slot number is used
again for a fresh slot; the container goes when its last slot closes. A container takes new
slots only during the first half of its lease, so no slot outlives the lease on it.

Isolation: user namespaces are blocked by Docker's default seccomp profile, so a container
meant for isolated slots runs with `seccomp=unconfined` (capabilities stay Docker's reduced
set, /proc stays masked). `auto` and `bwrap` probe that once per image; where bubblewrap is
missing or does not work, opening a slot is a `ConfigError` naming the image and the fixes:
slots share a container unisolated only with `slot_isolation = none`, asked by name, never
as a silent fallback. The choice is written in the container's `clotho.slot-isolation`
label. What an image was found to be is remembered by image ID (`ImageFactsCache`), so a
rebuilt tag is probed afresh.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clotho.errors import ConfigError, SandboxError
from clotho.sandbox.config import (
    DockerSandboxConfig,
    base_env,
)
from clotho.sandbox.docker.channel import DockerExecChannel
from clotho.sandbox.docker.containers import (
    client_url,
    container_body,
    container_limits,
    delete_container,
    start_container,
)
from clotho.sandbox.docker.fifo import MOUNT as FIFO_MOUNT
from clotho.sandbox.docker.fifo import DockerFifoChannel, make_fifos
from clotho.sandbox.docker.fresh import run_exec
from clotho.sandbox.docker.images import ImageFacts, ImageFactsCache
from clotho.sandbox.docker.limits import LimitWatch, SlotCgroup, container_pids, slot_pids
from clotho.sandbox.docker.slot_layout import (
    REAP_SCRIPT,
    SLOT_ROOT,
    SLOT_UID_BASE,
    SlotLayout,
    probe_script,
)
from clotho.sandbox.docker.slot_sandbox import IsolatedSlotSandbox, SlotSandbox
from clotho.sandbox.host import exit_cleanup, proctree
from clotho.sandbox.host.leases import DOCKER_IO, SLOT_ISOLATION, SLOTS
from clotho.sandbox.host.state import make_state_dir, remove_state_dir
from clotho.sandbox.shell import PersistentShell, ShellChannel

log = logging.getLogger(__name__)

RELAXED = ["seccomp=unconfined"]


class NestedShellChannel(ShellChannel):
    """A channel whose exec'd process launches the shell (setpriv, then bubblewrap's monitor):
    timeouts must kill what the shell started, so its pid is found among the descendants."""

    def __init__(self, inner: ShellChannel, shell: str) -> None:
        self._inner = inner
        self._comm = shell
        self._shell_pid: int | None = None
        self.stdout = inner.stdout
        self.stderr = inner.stderr

    @property
    def pid(self) -> int | None:
        return self._inner.pid

    @property
    def shell_pid(self) -> int | None:
        outer = self._inner.shell_pid
        if self._shell_pid is None and outer is not None:
            for pid in proctree.descendants(outer):
                if proctree.comm(pid) == self._comm:
                    self._shell_pid = pid
                    break
        return self._shell_pid

    async def open(self) -> None:
        await self._inner.open()

    async def ready(self) -> None:
        await self._inner.ready()

    async def write(self, data: bytes) -> None:
        await self._inner.write(data)

    def kill_running(self) -> None:
        if (pid := self.shell_pid) is not None:
            proctree.kill_descendants(pid)

    async def close(self) -> None:
        await self._inner.close()


def _no_bwrap(config: DockerSandboxConfig, problem: str) -> ConfigError:
    """Slots that cannot be isolated are refused, `auto` included: sharing a container
    unisolated (neighbours writing each other's /app) happens only when asked by name."""
    return ConfigError(
        f"slots_per_container={config.slots_per_container} with "
        f"slot_isolation='{config.slot_isolation}' needs bubblewrap to keep slots apart, and "
        f"it cannot in the image {config.image}: {problem}. Install bubblewrap and "
        "util-linux (setpriv, prlimit) in the image, or set sandbox.slots_per_container=1 "
        "(a container per sandbox), or sandbox.slot_isolation=none to share containers "
        "without isolation (slots then see and change each other's files)"
    )


@dataclass
class _SharedContainer:
    """One container hosting slots: which numbers are free, how its slots are isolated."""

    key: str
    config: DockerSandboxConfig
    labels: dict[str, str]
    lease_s: float
    free: list[int]
    used: int = 0
    created: float = field(default_factory=time.monotonic)
    task: asyncio.Future[None] | None = None
    container: Any = None
    io_dir: Path | None = None
    isolation: str = "none"
    bash: bool = True
    gone: bool = False  # removed from its group: takes no new slots
    limits: LimitWatch | None = None  # the container's cgroup counters and disk watch
    cgroups: bool = False  # its slots get cgroups of their own (`SlotCgroup`)
    # Slot k runs as uid_base + k: a block of uids no other container is likely to use, as
    # RLIMIT_NPROC (the limit of slots without cgroups) counts per uid, host-wide.
    uid_base: int = field(default_factory=lambda: SLOT_UID_BASE + secrets.randbelow(1 << 20) * 256)

    def accepts(self) -> bool:
        young = time.monotonic() - self.created < self.lease_s / 2
        return not self.gone and bool(self.free) and young

    def take(self) -> int:
        self.used += 1
        return self.free.pop(0)

    @property
    def hide(self) -> list[str]:
        """Container paths an isolated slot must not see besides /slots (everyone's FIFOs)."""
        return [FIFO_MOUNT] if self.io_dir is not None else []


class SlotHost:
    """Hands out slots of shared containers, grouped by configuration and lease length.

    One per Docker backend (`DockerBackend`), owning nothing global: close() removes every
    container. `facts` looks up what an image is like by its ID (the backend shares its
    cache); with `owns_client`, close() closes the client too.
    """

    def __init__(
        self,
        docker: Any,
        *,
        facts: Callable[[str], Awaitable[ImageFacts]] | None = None,
        owns_client: bool = False,
        slot_cgroups: bool = True,
    ) -> None:
        """`slot_cgroups=False`: never make slots cgroups of their own, as on a host that
        does not allow them (a remote daemon, cgroup v2): isolated slots then get a
        RLIMIT_NPROC share instead."""
        self.docker = docker
        self._slot_cgroups = slot_cgroups
        self._owns_client = owns_client
        self._facts = facts or ImageFactsCache(docker).get
        self._boxes: dict[str, list[_SharedContainer]] = defaultdict(list)
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Task[Any]] = set()
        self._closed = False

    # -- slots -------------------------------------------------------------------------

    async def open(
        self,
        config: DockerSandboxConfig,
        labels: dict[str, str] | None = None,
        *,
        lease_s: float = 6 * 3600,
    ) -> SlotSandbox:
        labels = dict(labels or {})
        key = f"{lease_s}:{config.model_dump_json()}"
        async with self._lock:
            if self._closed:
                raise SandboxError("the slot host is closed")
            box = next((b for b in self._boxes[key] if b.accepts()), None)
            if box is None:
                box = _SharedContainer(
                    key, config, labels, lease_s, list(range(config.slots_per_container))
                )
                self._boxes[key].append(box)
                box.task = asyncio.ensure_future(self._start(box))
            index = box.take()
        layout: SlotLayout | None = None
        try:
            assert box.task is not None
            await asyncio.shield(box.task)
            isolated = box.isolation == "bwrap"
            share = slot_pids(config.pids_limit, config.slots_per_container)
            layout = SlotLayout(
                name=str(index),
                uid=box.uid_base + index,
                workdir=config.workdir,
                isolated=isolated,
                token=f"{box.container.id[:12]}-{index}-{secrets.token_hex(6)}",
                nproc=share if isolated and not box.cgroups else None,
            )
            return await self._open_slot(box, index, layout, labels)
        except BaseException:
            # Not awaited here: a cancelled caller must not cut the clean-up short.
            self._spawn(self._give_back(box, index, layout))
            raise

    async def _open_slot(
        self, box: _SharedContainer, index: int, layout: SlotLayout, labels: dict[str, str]
    ) -> SlotSandbox:
        config = box.config
        shell_name = "bash" if box.bash else "sh"
        env = layout.env(base_env(layout.home, config.env))
        command = layout.shell_command(shell_name, network=config.network, hide=box.hide)
        channel: ShellChannel
        if box.io_dir is not None:
            folder = box.io_dir / layout.name
            await asyncio.to_thread(_fresh_fifos, folder)
            channel = DockerFifoChannel(
                box.container, folder, env=env, workdir="/", shell=command,
                mount=f"{FIFO_MOUNT}/{layout.name}", prelude=layout.prelude(),
            )  # fmt: skip
        else:
            argv = ["sh", "-c", f"{layout.prelude()}exec {command}"]
            channel = DockerExecChannel(box.container, env=env, workdir="/", argv=argv)
        if layout.isolated:
            channel = NestedShellChannel(channel, shell_name)
        shell = PersistentShell(
            channel=channel,
            max_output_bytes=config.max_output_bytes,
            session=config.shell == "session" and box.bash,
        )
        await shell.start()  # closes the channel itself when it fails
        root = channel._inner.shell_pid if isinstance(channel, NestedShellChannel) else None
        cgroup = None
        try:
            cgroup = await self._slot_cgroup(box, layout, root or channel.shell_pid)
        except BaseException:
            await shell.close()
            raise
        cls = IsolatedSlotSandbox if layout.isolated else SlotSandbox
        return cls(
            config, self.docker, box.container, shell, labels,
            layout=layout, slot=index,
            retire=lambda sb: self._give_back(box, index, layout, sb.cgroup),
            hide=box.hide, limits=box.limits, cgroup=cgroup,
        )  # fmt: skip

    async def _slot_cgroup(
        self, box: _SharedContainer, layout: SlotLayout, root: int | None
    ) -> SlotCgroup | None:
        """The slot's own cgroups with its idle shell moved in (see `SlotCgroup`), or None
        where they cannot be made (a remote daemon, cgroup v2, no right to write them)."""
        if box.limits is None or root is None or not box.cgroups:
            return None
        share = slot_pids(box.config.pids_limit, box.config.slots_per_container)
        name = f"clotho-slot-{layout.token}"
        cgroup = await asyncio.to_thread(box.limits.slot_cgroup, name, share)
        if cgroup is None:
            return None
        try:
            await asyncio.to_thread(lambda: cgroup.adopt([root, *proctree.descendants(root)]))
        except BaseException:
            await asyncio.to_thread(cgroup.kill_all)
            await asyncio.to_thread(cgroup.remove)
            raise
        return cgroup

    async def _give_back(
        self,
        box: _SharedContainer,
        index: int,
        layout: SlotLayout | None,
        cgroup: SlotCgroup | None = None,
    ) -> None:
        """Kill a slot's processes (its cgroup's, whatever they did to their uid or
        environment, then by uid and token) and wipe its folder; then its number is free."""
        reusable = True
        container = box.container
        if cgroup is not None:
            if await asyncio.to_thread(cgroup.kill_all):
                reusable = False  # whatever is left dies with the container
            await asyncio.to_thread(cgroup.remove)
        if layout is not None and container is not None:
            try:
                code, output = await run_exec(
                    container,
                    ["sh", "-c", REAP_SCRIPT, "reap", layout.token,
                     str(layout.uid) if layout.isolated else "", layout.dir],
                )  # fmt: skip
                if code != 0:
                    raise SandboxError(f"exit {code}: {output.strip()}")
            except Exception as exc:
                reusable = False  # whatever is left dies with the container
                log.warning("cleaning slot %s of %s failed: %s", index, container.id, exc)
            if box.io_dir is not None:
                await asyncio.to_thread(remove_state_dir, box.io_dir / layout.name)
        async with self._lock:
            box.used -= 1
            if reusable:
                box.free.append(index)
                box.free.sort()
            empty = box.used == 0
            if empty:
                self._forget(box)
        if empty:
            await self._remove(box)

    def _forget(self, box: _SharedContainer) -> None:
        box.gone = True
        group = self._boxes.get(box.key, [])
        if box in group:
            group.remove(box)
        if not group:
            self._boxes.pop(box.key, None)

    # -- containers --------------------------------------------------------------------

    async def _start(self, box: _SharedContainer) -> None:
        """Start the box's container and settle its isolation (probing once per image)."""
        try:
            await self._start_container(box)
        except BaseException:
            async with self._lock:
                self._forget(box)
            raise

    async def _start_container(self, box: _SharedContainer) -> None:
        config = box.config
        facts = await self._facts(config.image)
        want = "none" if config.slot_isolation == "none" else "bwrap"  # auto: bwrap or error
        if want == "bwrap" and facts.bwrap is False:
            raise _no_bwrap(config, facts.problem)
        await self._create(box, isolation=want)
        probe_bwrap = box.isolation == "bwrap" and facts.bwrap is None
        if facts.bash is not None and not probe_bwrap:
            box.bash = facts.bash
            return
        layout = None
        if probe_bwrap:
            token = f"probe-{secrets.token_hex(6)}"
            layout = SlotLayout("probe", SLOT_UID_BASE - 1, config.workdir, True, token)
        script = probe_script(layout, network=config.network, hide=box.hide)
        code, output = await run_exec(box.container, ["sh", "-c", script])
        box.bash = facts.bash = output.splitlines()[:1] == ["bash"]
        if layout is None:
            return
        facts.bwrap = code == 0
        if facts.bwrap:
            log.info(
                "containers of %s host %d slots each, isolated with bubblewrap",
                config.image, config.slots_per_container,
            )  # fmt: skip
            return
        problem = "\n".join(line for line in output.splitlines() if line != "bash").strip()
        facts.problem = problem or f"exit {code}"
        await self._delete(box)
        raise _no_bwrap(config, facts.problem)

    async def _create(self, box: _SharedContainer, *, isolation: str) -> None:
        config = box.config
        exit_cleanup.register("docker", docker_url=client_url(self.docker))
        labels = {
            **box.labels,
            SLOTS: str(config.slots_per_container),
            SLOT_ISOLATION: isolation,
        }
        body = container_body(config, labels, box.lease_s)
        if config.pids_limit:  # room for every slot's share and the harness's own processes
            body["HostConfig"]["PidsLimit"] = container_pids(
                config.pids_limit, config.slots_per_container
            )
        if isolation == "bwrap":
            body["HostConfig"]["SecurityOpt"] = RELAXED
        if config.stdio == "fifo" and getattr(self.docker.connector, "path", None):
            box.io_dir = await asyncio.to_thread(
                make_state_dir, config.state_dir, {**box.labels, DOCKER_IO: "1"}, box.lease_s
            )
            body["HostConfig"]["Binds"] = [f"{box.io_dir}:{FIFO_MOUNT}:ro"]  # FIFOs only
        try:
            # The writable layer, every slot's folder in it, a file system of the limit's
            # size (quota.py); the slots share it, and a full one is the limit.
            box.container = await start_container(self.docker, body, config)
        except BaseException:
            await self._delete(box)  # the FIFO folder (start_container removed the container)
            raise
        box.isolation = isolation
        box.created = time.monotonic()
        container = box.container
        box.limits = container_limits(box.container, config)
        box.limits.culprit = lambda: _biggest_slot(container)
        await box.limits.start()
        box.cgroups = self._slot_cgroups and box.limits.slot_cgroups_possible()
        if not box.cgroups:
            log.info(
                "slots of container %s share its cgroup: %s", container.id[:12],
                "isolated slots get a process limit (RLIMIT_NPROC) each"
                if isolation == "bwrap" else "no per-slot limits without isolation",
            )  # fmt: skip

    async def _delete(self, box: _SharedContainer) -> None:
        if box.limits is not None:
            box.limits.close()
        container, box.container = box.container, None
        io_dir, box.io_dir = box.io_dir, None
        if container is not None:
            await delete_container(container)
        if io_dir is not None:
            await asyncio.to_thread(remove_state_dir, io_dir)

    async def _remove(self, box: _SharedContainer) -> None:
        if box.task is not None:  # let a start in flight finish (its error went to open())
            await asyncio.wait([box.task])
        await self._delete(box)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def stats(self) -> dict[str, int]:
        boxes = [b for group in self._boxes.values() for b in group]
        return {"containers": len(boxes), "slots_in_use": sum(b.used for b in boxes)}

    async def close(self) -> None:
        """Remove every container, slots in use or not (their shells die with them)."""
        if self._closed:
            return
        self._closed = True
        while pending := [t for t in self._background if t is not asyncio.current_task()]:
            await asyncio.gather(*pending, return_exceptions=True)
        async with self._lock:
            boxes = [b for group in self._boxes.values() for b in group]
            for box in boxes:
                self._forget(box)
        await asyncio.gather(*(self._remove(b) for b in boxes), return_exceptions=True)
        if self._owns_client:
            await self.docker.close()


async def _biggest_slot(container: Any) -> str | None:
    """The slot whose folder holds the most bytes (an isolated slot writes only there)."""
    _, output = await run_exec(
        container, ["sh", "-c", f"cd {SLOT_ROOT} && du -sxk -- */ 2>/dev/null"], timeout=30.0
    )
    sizes = []
    for line in output.splitlines():
        size, _, name = line.partition("\t")
        if size.isdigit():
            sizes.append((int(size), name.strip().rstrip("/")))
    return max(sizes)[1] if sizes else None


def _fresh_fifos(folder: Path) -> None:
    folder.mkdir(exist_ok=True)
    make_fifos(folder, replace=True)
