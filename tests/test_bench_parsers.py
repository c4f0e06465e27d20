"""`clotho bench parsers`: every format measured, as one JSON object."""

from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from clotho.chat.parsers import list_parsers
from clotho.cli.main import app


def test_bench_parsers_json_has_every_format_with_positive_numbers() -> None:
    result = CliRunner().invoke(app, ["bench", "parsers", "--json", "--seconds", "0.05"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert sorted(report["formats"]) == list_parsers()
    for name, row in report["formats"].items():
        assert row["format"] == name
        for key in ("turns", "turns_per_s", "mb_per_s", "calls_per_s", "mean_turn_bytes"):
            value = row[key]  # turns/s is what the README quotes
            assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (
                name,
                key,
            )
        assert row["calls_per_s"] >= row["turns_per_s"]  # every turn has at least one call


def test_bench_parsers_selected_formats_and_table() -> None:
    runner = CliRunner()
    picked = runner.invoke(
        app,
        [
            "bench",
            "parsers",
            "--json",
            "--seconds",
            "0.01",
            "--format",
            "glm47",
            "--format",
            "hermes",
        ],
    )
    assert picked.exit_code == 0, picked.output
    assert sorted(json.loads(picked.stdout)["formats"]) == ["glm47", "hermes"]
    unknown = runner.invoke(app, ["bench", "parsers", "--format", "nope"])
    assert unknown.exit_code != 0 and "nope" in unknown.output
    table = runner.invoke(app, ["bench", "parsers", "--seconds", "0.01", "--format", "kimi_k2"])
    assert table.exit_code == 0 and "kimi_k2" in table.output
