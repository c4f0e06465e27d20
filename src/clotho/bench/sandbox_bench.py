"""`clotho bench sandbox`: our sandbox mechanics beside the usual ones, measured in one run.

Baselines are measured the same way on the same machine in the same process: a new
`bash -c` (and a new bubblewrap) per command for the local backend; a `docker exec`
through the Engine API per command for the Docker backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.bench.stats import latency_ms, percentile, pss_mb, throughput
from clotho.errors import SandboxError
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from clotho.sandbox.base import Sandbox
from clotho.sandbox.factory import open_sandbox
from clotho.sandbox.host.proctree import descendants
from clotho.sandbox.local.bwrap import ro_root_args
from clotho.sandbox.pool import PoolConfig, SlotPool

TARGETS = {
    "warm_exec_p50_ms": ("<=", 0.5),
    "throughput_32_per_s": (">=", 3000.0),
    "acquire_p50_ms": ("<=", 1.0),
    "reset_ms": ("<=", 60.0),
    "cold_start_ms": ("<=", {"local": 15.0, "docker": 300.0}),
}

CALLERS = 32  # concurrent callers of the throughput figures
# `--quick` (smoke tests): fewer sandboxes and slots share the 32 callers, and the reset
# workspace has 200 files; its figures only show that every one is measured.
QUICK_SANDBOXES = 8
REPO_DIRS, QUICK_REPO_DIRS = 25, 5  # of 40 files each

MAKE_REPO = r"""
import os, random, subprocess, sys
random.seed(7)
os.makedirs("ws", exist_ok=True); os.chdir("ws")
for d in range(int(sys.argv[1])):
    os.makedirs(f"d{d:02d}", exist_ok=True)
    for f in range(40):
        with open(f"d{d:02d}/f{f:02d}.txt", "w") as fh:
            fh.write("x" * random.randint(300, 2000))
open(".gitignore", "w").write("*.log\n")
run = lambda *a: subprocess.run(a, check=True, capture_output=True)
run("git", "init", "-q"); run("git", "add", "-A")
run("git", "-c", "user.name=b", "-c", "user.email=b@x", "commit", "-qm", "ws"); run("git", "gc", "-q")
"""

DIRTY = r"""
import os, random
random.seed()
files = sorted(os.path.join(d, f) for d in sorted(os.listdir(".")) if d.startswith("d") for f in os.listdir(d))
for p in random.sample(files, 50): open(p, "a").write("dirty")
for p in random.sample(files, 20):
    if os.path.exists(p): os.remove(p)
os.rename(files[0], files[0] + ".moved") if os.path.exists(files[0]) else None
for i in range(100): open(f"d00/new{i}.txt", "w").write("n")
for i in range(100): open(f"d01/junk{i}.log", "w").write("j")
"""


class BaselineFigures(BaseModel):
    warm_exec_p50_ms: float
    warm_exec_p95_ms: float
    throughput_32_per_s: float
    cold_start_ms: float | None = None


class SlotFigures(BaseModel):
    """Docker with several slots per container (`--slots N`)."""

    slots_per_container: int
    isolation: str = Field(description="bwrap or none, as the container chose")
    slot_start_p50_ms: float = Field(description="a slot in a running container, to first answer")
    container_start_p50_ms: float = Field(description="a slot that needed a new container")
    warm_exec_p50_ms: float
    throughput_32_per_s: float = Field(description="32 callers over 32 slots")
    idle_memory_mb: float = Field(
        description="PSS of the containers' processes and their shims / 32 slots"
    )


class SandboxBench(BaseModel):
    backend: Literal["local", "docker"]
    warm_exec_p50_ms: float
    warm_exec_p95_ms: float
    throughput_32_per_s: float
    acquire_p50_ms: float
    cold_start_ms: float
    reset_ms: float = Field(
        description="git reset --hard && git clean -fdx of a 1000-file repo, p50"
    )
    replace_ms: float = Field(description="destroy a used sandbox and have a fresh one answer, p50")
    idle_memory_mb: float = Field(
        description="PSS of a sandbox's processes (docker: with its containerd shim), of 32"
    )
    baseline: dict[str, BaselineFigures]
    slots: SlotFigures | None = None
    targets_met: dict[str, bool] = Field(default_factory=dict)

    def check_targets(self) -> None:
        for key, (op, target) in TARGETS.items():
            limit = target[self.backend] if isinstance(target, dict) else target
            value = getattr(self, key)
            self.targets_met[key] = value <= limit if op == "<=" else value >= limit


def _expect_hi(result: Any) -> None:
    if result.exit_code != 0 or result.stdout != "hi\n":
        raise SandboxError(f"benchmark command misbehaved: {result!r}")


async def _ours(sandbox: Sandbox) -> None:
    _expect_hi(await sandbox.exec("echo hi"))


async def _cold_start(config: SandboxConfig, n: int) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        async with await open_sandbox(config) as sandbox:
            _expect_hi(await sandbox.exec("echo hi"))
            samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 50)


async def _acquire(config: SandboxConfig, n: int) -> float:
    async with SlotPool(PoolConfig(max_size=n + 2)) as pool:
        pool.prewarm(config, n)
        await pool.wait_idle(config, n, timeout=120)
        samples = []
        leased = []
        for _ in range(n):
            started = time.perf_counter()
            leased.append(await pool.acquire(config))
            samples.append((time.perf_counter() - started) * 1000)
        for sandbox in leased:
            await pool.release(sandbox)
    return percentile(samples, 50)


def _callers(sandboxes: list[Sandbox]) -> list[Callable[[], Awaitable[None]]]:
    """`CALLERS` callers spread over the sandboxes (one each in a full run)."""
    return [(lambda s=sandboxes[i % len(sandboxes)]: _ours(s)) for i in range(CALLERS)]


async def _reset(sandbox: Sandbox, n: int, dirs: int = REPO_DIRS) -> float:
    made = await sandbox.exec(
        f"python3 - {dirs} <<'EOF'\n{MAKE_REPO}\nEOF", cwd="/tmp", timeout=300
    )
    if made.exit_code != 0:
        raise SandboxError(f"cannot build the reset workspace: {made.stderr}")
    pristine = (await sandbox.exec("git ls-files -s | sha1sum", cwd="/tmp/ws")).stdout
    samples = []
    for _ in range(n):
        dirty = await sandbox.exec(f"python3 - <<'EOF'\n{DIRTY}\nEOF\nsync", cwd="/tmp/ws")
        if dirty.exit_code != 0:
            raise SandboxError(f"cannot dirty the workspace: {dirty.stderr}")
        started = time.perf_counter()
        reset = await sandbox.exec("git reset -q --hard && git clean -qfdx", cwd="/tmp/ws")
        samples.append((time.perf_counter() - started) * 1000)
        check = await sandbox.exec(
            "git status --porcelain --ignored | wc -l; git ls-files -s | sha1sum", cwd="/tmp/ws"
        )
        if reset.exit_code != 0 or check.stdout != "0\n" + pristine:
            raise SandboxError(f"reset left the workspace dirty: {check.stdout!r}")
    return percentile(samples, 50)


async def _replace(config: SandboxConfig, n: int) -> float:
    samples = []
    retired: list[asyncio.Task[None]] = []  # closed off the critical path
    sandbox = await open_sandbox(config)
    try:
        for _ in range(n):
            await sandbox.exec("echo dirty > /tmp/marker")
            started = time.perf_counter()
            old, sandbox = sandbox, await open_sandbox(config)
            clean = await sandbox.exec("[ ! -e /tmp/marker ]")
            samples.append((time.perf_counter() - started) * 1000)
            retired.append(asyncio.create_task(old.close()))
            if clean.exit_code != 0:
                raise SandboxError("a replacement sandbox was not clean")
    finally:
        # Awaited here, even on failure: a close left pending would be cut short by the
        # loop's shutdown.
        retired.append(asyncio.create_task(sandbox.close()))
        closed = await asyncio.gather(*retired, return_exceptions=True)
    _raise_first(closed)
    return percentile(samples, 50)


def _raise_first(results: list[Any]) -> None:
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _close_all(sandboxes: list[Sandbox]) -> None:
    """Close them all, concurrently, before raising the first failure."""
    _raise_first(await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True))


async def _open_many(config: SandboxConfig, count: int) -> list[Sandbox]:
    """A few at a time (32 containers at once swamp 2 cores); when one fails to open, the
    others are waited for and closed (nothing is left running for the loop's shutdown)."""
    sandboxes: list[Sandbox] = []
    for chunk in range(0, count, 8):
        opened = await asyncio.gather(
            *(open_sandbox(config) for _ in range(min(8, count - chunk))), return_exceptions=True
        )
        sandboxes += [s for s in opened if isinstance(s, Sandbox)]
        if len(sandboxes) < chunk + len(opened):
            with contextlib.suppress(Exception):
                await _close_all(sandboxes)
            _raise_first(opened)
    return sandboxes


async def _slot_figures(slots: int, quick: bool) -> SlotFigures:
    """32 slots (quick: two containers' worth) from one `SlotHost`: which started in a running
    container, which needed one."""
    from clotho.sandbox.docker.containers import docker_client
    from clotho.sandbox.docker.slots import SlotHost

    config = DockerSandboxConfig(slots_per_container=slots)
    host = SlotHost(docker_client(config.docker_url), owns_client=True)
    opened: list[Sandbox] = []
    in_running: list[float] = []
    new_container: list[float] = []
    seen: set[str] = set()
    count = 2 * slots if quick else 32
    try:
        for _ in range(count):
            started = time.perf_counter()
            slot = await host.open(config)
            _expect_hi(await slot.exec("echo hi"))
            elapsed = (time.perf_counter() - started) * 1000
            opened.append(slot)
            container = slot.container.id  # type: ignore[attr-defined]
            (in_running if container in seen else new_container).append(elapsed)
            seen.add(container)
        await asyncio.sleep(1.0)
        memory = pss_mb(await _container_pids(host.docker, seen)) / count
        p50, _ = await latency_ms(lambda: _ours(opened[-1]), 100 if quick else 300)
        rate = await throughput(_callers(opened), 500 if quick else 10000)
        isolation = str(getattr(opened[0], "isolation", "none"))
    finally:
        try:
            await _close_all(opened)
        finally:
            await host.close()
    return SlotFigures(
        slots_per_container=slots,
        isolation=isolation,
        slot_start_p50_ms=round(percentile(in_running, 50), 2) if in_running else 0.0,
        container_start_p50_ms=round(percentile(new_container, 50), 2),
        warm_exec_p50_ms=round(p50, 4),
        throughput_32_per_s=round(rate, 1),
        idle_memory_mb=round(memory, 2),
    )


async def _container_pids(docker: Any, containers: set[str]) -> list[int]:
    """Every process of the containers, with each one's containerd shim (its parent)."""
    pids: list[int] = []
    for container in containers:
        init = int(((await docker.containers.container(container).show())["State"]).get("Pid", 0))
        if init <= 0:
            continue
        pids += [init, *descendants(init)]
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = Path(f"/proc/{init}/stat").read_text()
            pids.append(int(stat.rsplit(")", 1)[1].split()[1]))  # the parent: the shim
    return pids


async def _run_baseline(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if out != b"hi\n":
        raise SandboxError(
            f"baseline command {argv[0]} misbehaved: exit {proc.returncode}, "
            f"stdout {out[:200]!r}, stderr {err[:500]!r}"
        )


async def _bash_c() -> None:
    await _run_baseline("bash", "-c", "echo hi")


# What bash needs, not the whole root: a recursive bind of `/` fails now and then while
# containers start or stop on this host (their mounts come and go under /var/lib/docker).
_BASELINE_ROOT = ro_root_args({"usr", "etc", "bin", "sbin", "lib", "lib64"})


async def _bwrap_per_call() -> None:
    await _run_baseline(
        "bwrap", *_BASELINE_ROOT, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
        "--unshare-all", "--die-with-parent", "--new-session", "bash", "-c", "echo hi",
    )  # fmt: skip


def _docker_exec(container: Any) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        execution = await container.exec(["bash", "-c", "echo hi"], stdout=True, stderr=True)
        output = b""
        async with execution.start(detach=False) as stream:
            while (message := await stream.read_out()) is not None:
                output += message.data
        info = await execution.inspect()
        if output != b"hi\n" or info.get("ExitCode") != 0:
            raise SandboxError("baseline docker exec misbehaved")

    return call


async def run_sandbox_bench(
    backend: Literal["local", "docker"],
    *,
    quick: bool = False,
    slots: int = 1,
    progress: Callable[[str], None] = print,
) -> SandboxBench:
    """The figures of one backend; `slots` > 1 (docker) adds those of shared containers."""
    if slots > 1 and backend != "docker":
        raise SandboxError("slots per container are a docker feature: use --backend docker")
    config: SandboxConfig = LocalSandboxConfig() if backend == "local" else DockerSandboxConfig()
    n_latency = 100 if quick else 300
    n_total = 500 if quick else 10000
    progress("cold start")
    cold = await _cold_start(config, 3 if quick else 15)
    progress("warm exec latency")
    sandbox = await open_sandbox(config)
    try:
        p50, p95 = await latency_ms(lambda: _ours(sandbox), n_latency)
        progress("reset of a 1000-file git workspace")
        reset = await _reset(sandbox, 3 if quick else 20, QUICK_REPO_DIRS if quick else REPO_DIRS)
    finally:
        await sandbox.close()
    progress(f"memory per idle sandbox and throughput with {CALLERS} callers")
    count = QUICK_SANDBOXES if quick else 32
    many = await _open_many(config, count)
    baseline: dict[str, BaselineFigures] = {}
    try:
        await asyncio.sleep(1.0)
        # System-wide "used" memory is noise at this size: what one more sandbox costs is
        # the PSS of its own processes (bwrap, its init and shells; a container's processes
        # and its containerd shim).
        if backend == "local":
            pids = [p for s in many if (root := s._shell.pid) for p in [root, *descendants(root)]]  # type: ignore[attr-defined]
        else:
            docker = many[0]._docker  # type: ignore[attr-defined]
            pids = await _container_pids(docker, {s.id for s in many})
        memory = pss_mb(pids) / count
        rate = await throughput(_callers(many), n_total)
        if backend == "docker":
            progress("baseline: docker exec through the Engine API")
            containers = [s.container for s in many]  # type: ignore[attr-defined]
            b50, b95 = await latency_ms(
                _docker_exec(containers[0]), 10 if quick else 100, warmup=2 if quick else 5
            )
            brate = await throughput([_docker_exec(c) for c in containers], 32 if quick else 320)
            baseline["docker exec (Engine API)"] = BaselineFigures(
                warm_exec_p50_ms=b50, warm_exec_p95_ms=b95, throughput_32_per_s=brate
            )
    finally:
        await _close_all(many)
    if backend == "local":
        progress("baselines: new bash -c per command, new bubblewrap per command")
        b50, b95 = await latency_ms(_bash_c, n_latency)
        brate = await throughput([_bash_c] * 32, n_total // 5)
        baseline["bash -c per command"] = BaselineFigures(
            warm_exec_p50_ms=b50, warm_exec_p95_ms=b95, throughput_32_per_s=brate, cold_start_ms=b50
        )
        w50, w95 = await latency_ms(_bwrap_per_call, n_latency // 3)
        wrate = await throughput([_bwrap_per_call] * 32, n_total // 10)
        baseline["bubblewrap per command"] = BaselineFigures(
            warm_exec_p50_ms=w50, warm_exec_p95_ms=w95, throughput_32_per_s=wrate, cold_start_ms=w50
        )
    progress("replacement, pool acquire")
    replace = await _replace(config, 3 if quick else 10)
    acquire = await _acquire(config, 4 if quick else 20)
    slot_figures = None
    if slots > 1:
        progress(f"{slots} slots per container")
        slot_figures = await _slot_figures(slots, quick)
    result = SandboxBench(
        backend=backend,
        warm_exec_p50_ms=round(p50, 4),
        warm_exec_p95_ms=round(p95, 4),
        throughput_32_per_s=round(rate, 1),
        acquire_p50_ms=round(acquire, 4),
        cold_start_ms=round(cold, 2),
        reset_ms=round(reset, 2),
        replace_ms=round(replace, 2),
        idle_memory_mb=round(memory, 2),
        baseline=baseline,
        slots=slot_figures,
    )
    result.check_targets()
    return result
