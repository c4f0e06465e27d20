"""`clotho bench scale`: a scripted tool-heavy workload over 1, 2, 3 Ray nodes, beside the
single-process pool, in one run.

Each rollout (no model) acquires a bubblewrap sandbox, runs `COMMANDS` tool calls (shell
commands, a file written, a file read) and releases it. The same workload runs through the
single-process pool (the baseline) and through the `ray` backend on a local cluster grown
from 1 to `nodes` node processes (`LocalRayCluster`). On one machine more nodes add no
cores, so the figures that say how it scales are the overheads: what going through the
host actor adds per command and per sandbox start, and how much CPU the driver spends per
rollout (the one process every node's work passes through). The projection is
`min(N x one node's rate, the driver's limit)`: linear until the driver saturates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

from clotho.bench.stats import percentile
from clotho.sandbox import LocalSandboxConfig, PoolConfig, Sandbox, SandboxConfig, SlotPool

COMMANDS = 12  # tool calls per rollout
TARGET_COMMAND_OVERHEAD_MS = 1.0


class ScaleRow(BaseModel):
    setup: str
    nodes: int = Field(description="Ray nodes (0: the single-process pool)")
    rollouts_per_s: float
    commands_per_s: float
    utilisation: float = Field(
        description="share of each rollout's sandbox time (acquire to release) in tool calls"
    )
    exec_p50_ms: float = Field(description="one `true`, sequential")
    start_p50_ms: float = Field(description="acquire of a fresh sandbox to its first answer")
    driver_cpu_ms_per_rollout: float


class ScaleBench(BaseModel):
    rows: list[ScaleRow]
    command_overhead_ms: float = Field(description="ray exec p50 minus the pool's (1 node)")
    start_overhead_ms: float = Field(description="ray start p50 minus the pool's (1 node)")
    driver_limit_rollouts_per_s: float = Field(description="1 / driver CPU per rollout")
    linear_up_to_nodes: float = Field(description="nodes before the driver saturates")
    projected_rollouts_per_s: dict[int, float]
    target_met: bool = Field(description=f"under {TARGET_COMMAND_OVERHEAD_MS} ms per command")


async def _rollout(pool: SlotPool, config: SandboxConfig) -> tuple[float, float]:
    """One scripted rollout; (time in tool calls, sandbox lifetime) in seconds."""
    held = time.perf_counter()  # the sandbox's time starts when it is asked for
    sandbox = await pool.acquire(config)
    busy = 0.0
    try:
        for i in range(COMMANDS):
            started = time.perf_counter()
            if i % 4 == 1:
                await sandbox.write_file(f"notes/{i}.txt", b"x" * 1024)
            elif i % 4 == 2:
                await sandbox.read_file(f"notes/{i - 1}.txt")
            else:
                await _ok(sandbox, f"ls -la /app >/dev/null; echo step {i} | wc -c")
            busy += time.perf_counter() - started
    finally:
        lifetime = time.perf_counter() - held
        await pool.release(sandbox)
    return busy, lifetime


async def _ok(sandbox: Sandbox, cmd: str) -> None:
    result = await sandbox.exec(cmd, timeout=30)
    if not result.ok:
        raise RuntimeError(f"benchmark command failed: {result}")


async def _timed(call: Callable[[], Awaitable[object]], n: int) -> float:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 50)


def _alive_nodes(config: SandboxConfig) -> int:
    """Nodes of the connected cluster that the ray backend would use (as its `hosts` does)."""
    import ray

    wanted = getattr(config, "node_resource", None)
    return sum(
        1
        for node in ray.nodes()
        if node.get("Alive") and (not wanted or wanted in node.get("Resources", {}))
    )


async def _measure(
    setup: str,
    nodes: int | None,
    config: SandboxConfig,
    rollouts: int,
    concurrency: int,
    quick: bool,
) -> ScaleRow:
    """One row; `nodes` None: a cluster given by address, its nodes counted once connected."""
    async with SlotPool(PoolConfig(max_size=concurrency + 2)) as pool:
        # connect and start every node's host before anything is timed
        first = await pool.acquire(config)
        if nodes is None:
            nodes = await asyncio.to_thread(_alive_nodes, config)
            setup = setup.format(nodes=nodes)
        warm = [first] + [await pool.acquire(config) for _ in range(max(nodes, 1) - 1)]
        for sandbox in warm:
            await pool.release(sandbox)
        box = await pool.acquire(config)
        exec_p50 = await _timed(lambda: box.exec("true"), 50 if quick else 400)
        await pool.release(box)

        async def start() -> None:
            fresh = await pool.acquire(config)
            await fresh.exec("true")
            await pool.release(fresh)

        start_p50 = await _timed(start, 3 if quick else 15)
        await asyncio.sleep(0.5)  # let the releases' background closes finish

        left = rollouts
        results: list[tuple[float, float]] = []

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                results.append(await _rollout(pool, config))

        cpu = time.process_time()
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    busy = sum(b for b, _ in results)
    alive = sum(life for _, life in results)
    return ScaleRow(
        setup=setup,
        nodes=nodes,
        rollouts_per_s=len(results) / wall,
        commands_per_s=len(results) * COMMANDS / wall,
        utilisation=busy / alive if alive else 0.0,
        exec_p50_ms=exec_p50,
        start_p50_ms=start_p50,
        driver_cpu_ms_per_rollout=cpu * 1000 / len(results),
    )


async def run_scale_bench(
    nodes: int = 3, *, quick: bool = False, concurrency: int = 6, address: str | None = None
) -> ScaleBench:
    """The baseline, then the ray backend on 1..`nodes` local node processes; with `address`,
    on that running cluster as it is (one row; it is neither grown nor stopped)."""
    from clotho.sandbox.ray.local_cluster import LocalRayCluster
    from clotho.sandbox.remote_config import RaySandboxConfig

    rollouts = concurrency if quick else 48  # quick: one rollout per worker
    inner = LocalSandboxConfig()
    rows = [await _measure("single-process pool", 0, inner, rollouts, concurrency, quick)]
    if address is not None:
        given = RaySandboxConfig(address=address, inner=inner)
        rows.append(
            await _measure("ray, {nodes} node(s)", None, given, rollouts, concurrency, quick)
        )
        return _summary(rows)
    cluster = LocalRayCluster(nodes=1)
    await asyncio.to_thread(cluster.start)
    try:
        ray_config = RaySandboxConfig(address=cluster.address, inner=inner)
        for n in range(1, nodes + 1):
            if n > 1:
                await asyncio.to_thread(cluster.add_node)
            rows.append(
                await _measure(f"ray, {n} node(s)", n, ray_config, rollouts, concurrency, quick)
            )
    finally:
        await asyncio.to_thread(cluster.stop)
    return _summary(rows)


def _summary(rows: list[ScaleRow]) -> ScaleBench:
    """The overheads, from the baseline and the first ray row, and the projection."""
    base, one = rows[0], rows[1]
    limit = 1000 / one.driver_cpu_ms_per_rollout
    per_node = one.rollouts_per_s
    overhead = one.exec_p50_ms - base.exec_p50_ms
    return ScaleBench(
        rows=rows,
        command_overhead_ms=overhead,
        start_overhead_ms=one.start_p50_ms - base.start_p50_ms,
        driver_limit_rollouts_per_s=limit,
        linear_up_to_nodes=limit / per_node,
        projected_rollouts_per_s={n: min(n * per_node, limit) for n in (1, 2, 4, 8, 16, 32, 64)},
        target_met=overhead < TARGET_COMMAND_OVERHEAD_MS,
    )
