"""`clotho bench sandbox --json --quick`: the report's shape, measured on real sandboxes.

The figures are whatever this machine gives; only their shape and sanity are checked here
(performance targets are judged by the benchmark itself, never by a test).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any

from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from typer.testing import CliRunner

from clotho.cli.bench_cmd import app as bench_app

# every row of the README's "How fast" table
FIGURES = (
    "warm_exec_p50_ms",
    "warm_exec_p95_ms",
    "throughput_32_per_s",
    "acquire_p50_ms",
    "cold_start_ms",
    "reset_ms",
    "replace_ms",
    "idle_memory_mb",
)
LATENCY_KEYS = ("warm_exec_p50_ms", "warm_exec_p95_ms", "throughput_32_per_s")
# the README's paragraph on slots per container
SLOT_FIGURES = (
    "slot_start_p50_ms",
    "container_start_p50_ms",
    "warm_exec_p50_ms",
    "throughput_32_per_s",
    "idle_memory_mb",
)


def positive(value: Any) -> bool:
    """A finite number above 0 (a figure the README quotes)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def bench(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "clotho", "bench", "sandbox", "--json", "--quick", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def check(report: dict[str, Any], backend: str, baselines: set[str]) -> None:
    assert report["backend"] == backend
    for key in FIGURES:
        assert positive(report.get(key)), (key, report.get(key))
    assert report["warm_exec_p95_ms"] >= report["warm_exec_p50_ms"]
    assert set(report["baseline"]) == baselines
    for name, figures in report["baseline"].items():
        for key in LATENCY_KEYS:
            assert positive(figures.get(key)), (name, key, figures.get(key))
        assert figures["warm_exec_p95_ms"] >= figures["warm_exec_p50_ms"]
    assert set(report["targets_met"]) == {
        "warm_exec_p50_ms",
        "throughput_32_per_s",
        "acquire_p50_ms",
        "cold_start_ms",
        "reset_ms",
    }
    assert all(isinstance(met, bool) for met in report["targets_met"].values())


@requires_bwrap
def test_local_report() -> None:
    report = bench("--backend", "local")
    check(report, "local", {"bash -c per command", "bubblewrap per command"})
    assert report["slots"] is None


@requires_docker
def test_docker_report_with_slots() -> None:
    report = bench("--backend", "docker", "--slots", "4")
    check(report, "docker", {"docker exec (Engine API)"})
    slots = report["slots"]
    assert slots["slots_per_container"] == 4 and slots["isolation"] in ("bwrap", "none")
    for key in SLOT_FIGURES:
        assert positive(slots.get(key)), (key, slots.get(key))


def test_slots_need_the_docker_backend() -> None:
    result = CliRunner().invoke(bench_app, ["sandbox", "--slots", "4"])
    assert result.exit_code == 2 and "--backend docker" in result.output, result.output
    assert isinstance(result.exception, SystemExit)  # a usage error, not a crash


# 31 callers start processes without a pause; a 32nd fails once they have started 64, so
# others are being started when it does.
FAILING_CALLER = r"""
import asyncio
from clotho.bench.stats import throughput

spawned = 0
busy = asyncio.Event()

async def spawn() -> None:
    global spawned
    proc = await asyncio.create_subprocess_exec(
        "true", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    spawned += 1
    if spawned >= 64:
        busy.set()
    await proc.communicate()

async def failing() -> None:
    await busy.wait()
    raise RuntimeError("boom")

asyncio.run(throughput([spawn] * 31 + [failing], 10**9))
"""


def test_a_failing_caller_ends_the_run_instead_of_hanging_it() -> None:
    """The bench once hung for good after a failed baseline command: the other callers were
    left running and cancelled by asyncio.run's shutdown together with asyncio's own
    pipe-connecting tasks, and on Python 3.11 a process cancelled while starting then waits
    forever for a pipe never connected (2 runs in 5 hung). Now the error ends the run."""
    for _ in range(5):
        proc = subprocess.run(
            [sys.executable, "-c", FAILING_CALLER], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 1 and "RuntimeError: boom" in proc.stderr, proc.stderr
