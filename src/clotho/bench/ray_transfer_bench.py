"""How long a big file through the ray backend holds the driver's event loop.

`python -m clotho.bench.ray_transfer_bench [MiB] [--runs N] [--json] [--address A]` starts a
one-node local Ray cluster (`LocalRayCluster`; with `--address` it uses that running one),
then measures, for a file of MiB (default 256), the worst event-loop lag (a 1 ms timer's
lateness) and the duration of:

- putting it into the object store in a thread as plain `bytes` (how uploads went before)
  and out of band (`payload.out_of_band`, what `RayBackend.as_value` does now);
- receiving it (awaiting its reference) in band and out of band (downloads now);
- `write_file`, `upload` and `download` of a `RaySandbox` end to end.

Each figure is the best of 5 runs (`--runs`): on a shared machine, other processes only add lag. The
end-to-end rows include the node's own work on the same cores, so they say less than the
first four, which are the driver's alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.sandbox.ray.local_cluster import LocalRayCluster
from clotho.sandbox.ray.payload import out_of_band
from clotho.sandbox.remote_config import RaySandboxConfig


async def lag_during(work: Callable[[], Awaitable[Any]], runs: int = 5) -> tuple[float, float]:
    """(worst loop lag, duration), in ms, of the best of `runs` runs of `work`."""
    best: tuple[float, float] | None = None
    for _ in range(runs):
        lags: list[float] = []
        stop = asyncio.Event()

        async def monitor(stop: asyncio.Event = stop, lags: list[float] = lags) -> None:
            while not stop.is_set():
                started = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - started - 0.001)

        watcher = asyncio.create_task(monitor())
        await asyncio.sleep(0.02)
        started = time.perf_counter()
        await work()
        took = time.perf_counter() - started
        stop.set()
        await watcher
        result = (max(lags) * 1000, took * 1000)
        best = result if best is None or result < best else best
    assert best is not None
    return best


async def measure(address: str, mib: int, runs: int = 5) -> list[tuple[str, float, float]]:
    import ray

    async def timed(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
        return await lag_during(work, runs)

    data = os.urandom(mib << 20)
    rows: list[tuple[str, float, float]] = []
    config = RaySandboxConfig(address=address, inner=LocalSandboxConfig())
    with tempfile.TemporaryDirectory(prefix="clotho-ray-bench-") as folder:
        local = Path(folder) / "big.bin"
        await asyncio.to_thread(local.write_bytes, data)
        async with SlotPool(PoolConfig(max_size=2), labels={"clotho.run": "ray-bench"}) as pool:
            box = await pool.acquire(config)  # connects this process to the cluster
            put_in_band = await timed(lambda: asyncio.to_thread(ray.put, ("file", data)))
            rows.append(("ray.put in a thread, bytes in band (before)", *put_in_band))
            put_out = await timed(lambda: asyncio.to_thread(ray.put, ("file", out_of_band(data))))
            rows.append(("ray.put in a thread, out of band (now)", *put_out))
            in_band = await asyncio.to_thread(ray.put, ("file", data))
            out = await asyncio.to_thread(ray.put, ("file", out_of_band(data)))

            async def receive(ref: Any) -> None:
                value = await ref
                assert memoryview(value[1]).nbytes == len(data)

            rows.append(("await a ref, in band (before)", *await timed(lambda: receive(in_band))))
            rows.append(("await a ref, out of band (now)", *await timed(lambda: receive(out))))
            rows.append(
                ("RaySandbox.write_file", *await timed(lambda: box.write_file("big", data)))
            )
            rows.append(("RaySandbox.upload", *await timed(lambda: box.upload(local, "/app/up"))))

            async def download() -> None:
                target = Path(folder) / "down.bin"
                target.unlink(missing_ok=True)
                await box.download("/app/big", target)

            rows.append(("RaySandbox.download", *await timed(download)))
            await pool.release(box)
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m clotho.bench.ray_transfer_bench",
        description="Event-loop lag of big transfers through the ray backend.",
    )
    parser.add_argument("mib", nargs="?", type=int, default=256, help="file size in MiB")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (the best is kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--address", help="a running Ray cluster to use instead of starting a one-node one"
    )
    args = parser.parse_args(argv)
    if args.mib < 1 or args.runs < 1:
        parser.error("MiB and --runs must be at least 1")
    if args.address:
        rows = asyncio.run(measure(args.address, args.mib, args.runs))
    else:
        cluster = LocalRayCluster(nodes=1).start()
        try:
            rows = asyncio.run(measure(cluster.address, args.mib, args.runs))
        finally:
            cluster.stop()
    if args.json:
        figures = [{"name": name, "lag_ms": lag, "duration_ms": took} for name, lag, took in rows]
        print(json.dumps({"mib": args.mib, "runs": args.runs, "rows": figures}))
        return
    print(f"| {args.mib} MiB | worst loop lag (ms) | duration (ms) |")
    print("|---|---:|---:|")
    for name, lag, took in rows:
        print(f"| {name} | {lag:.1f} | {took:.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
