"""Small measuring helpers shared by the benchmarks."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


async def latency_ms(
    call: Callable[[], Awaitable[object]], n: int, warmup: int = 20
) -> tuple[float, float]:
    """(p50, p95) in ms of `n` sequential awaited calls after `warmup` untimed ones."""
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return percentile(samples, 50), percentile(samples, 95)


async def throughput(calls: list[Callable[[], Awaitable[object]]], total: int) -> float:
    """Completed calls per second with one concurrent caller per entry of `calls`."""
    issued = 0

    async def worker(call: Callable[[], Awaitable[object]]) -> None:
        nonlocal issued
        await call()  # untimed warm-up
        while issued < total:
            issued += 1
            await call()

    # Warm-ups happen inside the timed window but are few (one per caller). A task group, so
    # that a failing caller stops the others here: left running, they would be cancelled by
    # the loop's shutdown, which can hang forever on a process being started (see the test).
    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(worker(call))
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return (total + len(calls)) / (time.perf_counter() - started)


def pss_mb(pids: list[int]) -> float:
    """Proportional set size of processes (shared pages split among their users), in MB."""
    total_kb = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024
