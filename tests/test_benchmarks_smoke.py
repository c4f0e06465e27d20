"""Every benchmark the README and docs quote, run on its smallest setting, so none can rot.

Each test runs the command exactly as the docs name it (a subprocess: the real CLI, the real
script) and checks the shape of what it prints: every figure the docs report is there and is
a finite number, and what must hold whatever the machine's load does (a command passed, a
p95 is not below its p50). Never speed: the figures are whatever this machine gives now.
The two Ray benchmarks share one local Ray node (their `--address`), started once here.

`clotho bench sandbox` and `clotho bench parsers` have their smoke tests in
tests/test_bench_sandbox.py and tests/test_bench_parsers.py; `test_every_benchmark_has_a_smoke_test`
fails when a benchmark is added without one.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import IN_CI, REPO, requires_bwrap
from tests.docker_probe import requires_docker
from typer.testing import CliRunner

from clotho.cli.bench_cmd import app as bench_app

requires_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None,
    reason="the ray extra is not installed (make test installs it)",
)
CLOTHO = Path(sys.executable).with_name("clotho")
# A bound against a hung command, not a judgement of speed.
HANG = 900


def run(argv: list[str], *, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=HANG, cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc.stdout


def bench_json(*args: str) -> dict[str, Any]:
    return json.loads(run([sys.executable, "-m", "clotho", "bench", *args, "--json"]))


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def assert_figures(report: dict[str, Any], keys: list[str], *, positive: bool = True) -> None:
    """Each key is there and a finite number (above 0 where a time or size must be)."""
    for key in keys:
        assert key in report, f"{key} missing from {sorted(report)}"
        assert finite(report[key]), (key, report[key])
        if positive:
            assert report[key] > 0, (key, report[key])


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """One local Ray node for both Ray benchmarks (`--address`): starting a cluster was most
    of what each cost on its smallest setting."""
    from clotho.sandbox.ray.local_cluster import LocalRayCluster

    cluster = LocalRayCluster(nodes=1).start()
    try:
        yield cluster.address
    finally:
        cluster.stop()


# --- clotho bench scale (README: the scale table, the host overhead, the driver limit) ------

SCALE_ROW_KEYS = [
    "rollouts_per_s",
    "commands_per_s",
    "utilisation",
    "exec_p50_ms",
    "start_p50_ms",
    "driver_cpu_ms_per_rollout",
]


@requires_bwrap
@requires_ray
def test_bench_scale(ray_address: str) -> None:
    report = bench_json("scale", "--address", ray_address, "--quick")
    rows = report["rows"]
    assert [(r["setup"], r["nodes"]) for r in rows] == [
        ("single-process pool", 0),
        ("ray, 1 node(s)", 1),
    ]
    for row in rows:
        assert_figures(row, SCALE_ROW_KEYS)
        assert row["utilisation"] <= 1
    # overheads are differences of two p50s: finite, of either sign under load
    assert_figures(report, ["command_overhead_ms", "start_overhead_ms"], positive=False)
    assert_figures(report, ["driver_limit_rollouts_per_s", "linear_up_to_nodes"])
    projected = report["projected_rollouts_per_s"]
    assert projected and all(finite(v) and v > 0 for v in projected.values())
    assert isinstance(report["target_met"], bool)


def test_bench_scale_grows_only_its_own_cluster() -> None:
    result = CliRunner().invoke(bench_app, ["scale", "--address", "x:1", "--nodes", "2"])
    assert result.exit_code == 2 and "--address" in result.output, result.output


# --- python -m clotho.bench.ray_transfer_bench (architecture.md: event-loop lag) -------------

TRANSFER_ROWS = [
    "ray.put in a thread, bytes in band (before)",
    "ray.put in a thread, out of band (now)",
    "await a ref, in band (before)",
    "await a ref, out of band (now)",
    "RaySandbox.write_file",
    "RaySandbox.upload",
    "RaySandbox.download",
]


@requires_bwrap
@requires_ray
def test_ray_transfer_bench(ray_address: str) -> None:
    out = run(
        [sys.executable, "-m", "clotho.bench.ray_transfer_bench", "1", "--runs", "1", "--json",
         "--address", ray_address]
    )  # fmt: skip
    report = json.loads(out)
    assert report["mib"] == 1 and report["runs"] == 1
    assert [row["name"] for row in report["rows"]] == TRANSFER_ROWS
    for row in report["rows"]:
        assert_figures(row, ["duration_ms"])
        assert_figures(row, ["lag_ms"], positive=False)
        assert row["lag_ms"] >= 0


# --- clotho bench view (README and docs/view.md: the "How fast" table) ----------------------

VIEW_SERVER_KEYS = [
    "results_mb",
    "server_cold_ms",
    "server_append_100_ms",
    "export_ms",
    "export_mb",
]
VIEW_BROWSER_KEYS = [
    "browser_open_median_ms",
    "browser_rows_fetched_ms",
    "browser_open_cold_ms",
    "browser_trial_ms",
]


def test_bench_view() -> None:
    report = bench_json("view", "--trials", "20", "--repeats", "1")
    assert report["trials"] == 20
    assert_figures(report, VIEW_SERVER_KEYS)
    if report["browser_skipped"] is not None and not IN_CI:
        pytest.skip(f"no headless Chromium here: {report['browser_skipped']}")
    assert report["browser_skipped"] is None, report["browser_skipped"]
    assert_figures(report, VIEW_BROWSER_KEYS)
    assert len(report["browser_open_ms"]) == 1 and isinstance(report["target_met"], bool)


# --- clotho bench swe (README: the install cache and the "How fast" table) ------------------

SWE_KEYS = [
    "workspace_ready_p50_ms",
    "workspace_ready_p95_ms",
    "git_clone_p50_ms",
    "verify_p50_ms",
    "verify_p95_ms",
    "first_snapshot_ms",
    "install_first_ms",
    "install_cached_bytes",
    "workspace_no_install_cache_p50_ms",
    "repo_files",
    "tests_listed",
]


def check_swe(report: dict[str, Any], backend: str) -> None:
    assert report["backend"] == backend and report["rollouts"] == 2
    assert_figures(report, SWE_KEYS)
    assert_figures(report, ["install_saved_p50_ms"], positive=False)
    assert report["workspace_ready_p95_ms"] >= report["workspace_ready_p50_ms"]
    assert report["verify_p95_ms"] >= report["verify_p50_ms"]


@requires_bwrap
def test_bench_swe_local() -> None:
    check_swe(bench_json("swe", "--rollouts", "2"), "local")


@requires_docker
def test_bench_swe_docker() -> None:
    check_swe(bench_json("swe", "--sandbox", "docker", "--rollouts", "2"), "docker")


# --- benchmarks/api_body.py (README: clotho api with big bodies) ----------------------------


def test_api_body() -> None:
    # 2 MB: above the 1 MiB beyond which the server parses a body in its child process
    out = run([sys.executable, "benchmarks/api_body.py", "--mb", "2", "--posts", "1"])
    report = json.loads(out.strip().splitlines()[-1])
    assert report["status"] == [200] and report["batch_groups"] == 1
    assert_figures(report, ["body_mb", "rss_before_mb", "rss_after_mb", "rss_peak_mb", "batch_s"])
    assert_figures(report, ["child_rss_peak_mb"], positive=False)
    assert report["rss_peak_mb"] >= report["rss_after_mb"]
    for key in ("post_s", "status_p50_ms", "status_max_ms"):
        assert len(report[key]) == 1 and finite(report[key][0]) and report[key][0] > 0, key
    assert report["status_max_ms"][0] >= report["status_p50_ms"][0]


# --- benchmarks/eval_oracle_docker.sh (README: the oracle end to end on Docker) ------------

ORACLE_LINE = re.compile(
    r"^(?P<name>\S.*?)\s+(?P<s>\d+\.\d+) s\s+(?P<passed>\d+)/(?P<n>\d+) passed$"
)


@requires_docker
def test_eval_oracle_docker() -> None:
    out = run(["bash", "benchmarks/eval_oracle_docker.sh", "--tasks", "1", "--reused", "1"],
              env={"CLOTHO": str(CLOTHO)})  # fmt: skip
    lines = [ORACLE_LINE.match(line) for line in out.strip().splitlines()]
    assert all(lines), out
    assert [m["name"] for m in lines if m] == [
        "images rebuilt (--force-build)",
        "images reused (run 1)",
    ]
    for m in lines:
        assert m and m["passed"] == m["n"] == "1", out
        assert finite(float(m["s"])) and float(m["s"]) > 0


# --- nothing left out -----------------------------------------------------------------------

SMOKE_TESTS = {
    "clotho bench sandbox": "tests/test_bench_sandbox.py",
    "clotho bench parsers": "tests/test_bench_parsers.py",
    "clotho bench agents": "tests/test_bench_agents.py",
    "clotho bench scale": "test_bench_scale",
    "clotho bench view": "test_bench_view",
    "clotho bench swe": "test_bench_swe_local",
    "benchmarks/api_body.py": "test_api_body",
    "benchmarks/eval_oracle_docker.sh": "test_eval_oracle_docker",
    "python -m clotho.bench.ray_transfer_bench": "test_ray_transfer_bench",
}


def test_every_benchmark_has_a_smoke_test() -> None:
    """A bench subcommand, a script in benchmarks/ or a runnable bench module added without a
    smoke test fails here."""
    commands = {f"clotho bench {c.name}" for c in bench_app.registered_commands}
    scripts = {
        f"benchmarks/{p.name}"
        for p in (REPO / "benchmarks").iterdir()
        if p.suffix in {".py", ".sh"}
    }
    modules = {
        f"python -m clotho.bench.{p.stem}"
        for p in (REPO / "src/clotho/bench").glob("*.py")
        if '__name__ == "__main__"' in p.read_text()
    }
    assert commands | scripts | modules == set(SMOKE_TESTS)
    here = globals()
    for target in SMOKE_TESTS.values():
        assert callable(here.get(target)) or (REPO / target).is_file(), target
