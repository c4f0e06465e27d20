"""`clotho bench agents`: the gateway against the model server alone (a scripted server on
127.0.0.1, the benchmark's own stand-in for a hosted model), and a real bubblewrap sandbox
prepared for mini-swe-agent (its real install, cached, bound read-only). Figures are checked
for being measured and consistent, never against a wall-clock window."""

from __future__ import annotations

import json
import math

import pytest
from tests.sandbox_fixtures import requires_bwrap
from typer.testing import CliRunner

from clotho.cli.main import app

pytestmark = [pytest.mark.bwrap, requires_bwrap]


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_bench_agents_json_measures_gateway_and_preparation() -> None:
    argv = ["bench", "agents", "--json", "--agent", "mini-swe-agent", "--calls", "20",
            "--no-upload"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["backend"] == "local" and report["calls"] == 20
    assert _positive(report["model_alone_p50_ms"])
    [row] = report["agents"]
    assert row["error"] is None, row["error"]
    assert (row["agent"], row["api"]) == ("mini-swe-agent", "openai-chat")
    for key in ("gateway_p50_ms", "python_probe_ms", "install_ms", "install_once_s",
                "install_mb", "bind_ms", "prepare_s"):  # fmt: skip
        assert _positive(row[key]), (key, row[key])
    # The overhead is the difference of the two figures of the same run.
    added = row["gateway_p50_ms"] - report["model_alone_p50_ms"]
    assert row["gateway_overhead_ms"] == pytest.approx(added, abs=0.01)
    # Preparation is its parts (probe, cached install, bind), nothing more.
    parts = (row["python_probe_ms"] + row["install_ms"] + row["bind_ms"]) / 1000
    assert row["prepare_s"] == pytest.approx(parts, abs=0.01)
    assert row["upload_s"] is None  # not asked for


def test_bench_agents_table_and_unknown_agent() -> None:
    runner = CliRunner()
    unknown = runner.invoke(app, ["bench", "agents", "--agent", "nope"])
    assert unknown.exit_code == 2 and "unknown installed agent(s) nope" in unknown.output
    table = runner.invoke(
        app, ["bench", "agents", "--agent", "mini-swe-agent", "--calls", "5", "--no-upload"]
    )
    assert table.exit_code == 0, table.output
    assert "installed agents (local sandboxes)" in table.output and "mini-swe-agent" in table.output
