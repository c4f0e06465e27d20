"""How `clotho api` copes with one very large group: time, server memory, and whether other
clients are still served meanwhile.

Starts `clotho api` in its own process (so its memory is measured alone), registers a
trainer, posts a group of about `--mb` MB of JSON to `/scored_data` `--posts` times (the
first one also starts the server's parser process) while a second client polls `/status`
every 20 ms, then pulls one back with `/batch`. Prints one JSON object:

- `post_s`: time until each POST was answered; `status`: their HTTP statuses
- `status_max_ms`, `status_p50_ms`: latency of the concurrent `/status` polls during each POST
- `rss_peak_mb`: the server's peak resident memory (VmHWM) over the whole run, and
  `child_rss_peak_mb` its children's (the parser process), `rss_after_mb` once queued
- `batch_s`: time to pull one group back with `/batch` (gzipped, as httpx asks by default)

Usage: `.venv/bin/python benchmarks/api_body.py --mb 100 [--server-arg=--max-request-mb=512]`
(the smoke test runs `--mb 2 --posts 1`: above 1 MiB, so the parser process is used)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def big_group(megabytes: float, sequences: int = 8) -> bytes:
    """One group of `sequences` long sequences, about `megabytes` MB of JSON."""
    per_position = 20  # "12345," in tokens and masks, "-0.1234," in logprobs, roughly
    length = int(megabytes * 1_000_000 / per_position / sequences)
    tokens = [[10_000 + (i * 7 + k) % 40_000 for k in range(length)] for i in range(sequences)]
    masks = [[-100] * 64 + row[64:] for row in tokens]
    logprobs = [[1.0] * 64 + [-0.1234] * (length - 64) for _ in range(sequences)]
    group: dict[str, Any] = {
        "tokens": tokens,
        "masks": masks,
        "scores": [float(i % 2) for i in range(sequences)],
        "inference_logprobs": logprobs,
        "messages": [[{"role": "user", "content": "long"}]] * sequences,
    }
    return json.dumps(group, separators=(",", ":")).encode()


def children_of(pid: int) -> list[str]:
    return [
        child
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def rss_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--posts", type=int, default=2)
    parser.add_argument("--server-arg", action="append", default=[])
    args = parser.parse_args()

    body = big_group(args.mb)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {TOKEN}"}
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clotho", "api", "--port", str(port), *args.server_arg,
        env={**os.environ, "CLOTHO_API_TOKEN": TOKEN},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
            async with asyncio.timeout(30):
                while True:
                    try:
                        await http.get("/info")
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
            await http.post(
                "/register",
                json={
                    "wandb_group": "", "wandb_project": "", "batch_size": 8,
                    "max_token_len": -1, "checkpoint_dir": "", "save_checkpoint_interval": 0,
                    "starting_step": 0, "num_steps": 1,
                },
            )  # fmt: skip
            await http.get("/batch")
            rss_before = rss_mb(server.pid, "VmRSS")
            statuses: list[int] = []
            post_s: list[float] = []
            p50: list[float] = []
            worst: list[float] = []
            for _ in range(args.posts):
                latencies: list[float] = []
                done = asyncio.Event()
                polling = asyncio.Event()

                async def poll(
                    latencies: list[float], done: asyncio.Event, polling: asyncio.Event
                ) -> None:
                    async with httpx.AsyncClient(base_url=url, headers=headers) as other:
                        while not done.is_set():
                            start = time.perf_counter()
                            await other.get("/status")
                            latencies.append((time.perf_counter() - start) * 1000)
                            polling.set()
                            await asyncio.sleep(0.02)

                poller = asyncio.create_task(poll(latencies, done, polling))
                # the post starts once the poller has been answered: every post has its polls
                first = asyncio.ensure_future(polling.wait())
                await asyncio.wait({first, poller}, return_when=asyncio.FIRST_COMPLETED)
                if poller.done():
                    first.cancel()
                    poller.result()  # the poll failed: its error, not a hang
                start = time.perf_counter()
                response = await http.post(
                    "/scored_data", content=body, headers={"Content-Type": "application/json"}
                )
                post_s.append(round(time.perf_counter() - start, 2))
                done.set()
                await poller
                statuses.append(response.status_code)
                p50.append(round(statistics.median(latencies), 1))
                worst.append(round(max(latencies), 1))
            rss_after = rss_mb(server.pid, "VmRSS")
            start = time.perf_counter()
            batch = await http.get("/batch")
            batch_s = time.perf_counter() - start
            served = batch.json().get("batch") if batch.status_code == 200 else None
            children = [int(pid) for pid in children_of(server.pid)]
            report = {
                "body_mb": round(len(body) / 1e6, 1),
                "status": statuses,
                "post_s": post_s,
                "status_p50_ms": p50,
                "status_max_ms": worst,
                "rss_before_mb": round(rss_before),
                "rss_after_mb": round(rss_after),
                "rss_peak_mb": round(rss_mb(server.pid, "VmHWM")),
                "child_rss_peak_mb": round(sum(rss_mb(pid, "VmHWM") for pid in children)),
                "batch_s": round(batch_s, 2),
                "batch_groups": len(served) if served else 0,
            }
            print(json.dumps(report))
    finally:
        server.terminate()
        await server.wait()


if __name__ == "__main__":
    asyncio.run(main())
