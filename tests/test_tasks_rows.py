"""Terminal-Bench 2.0 dataset rows (base64 tarballs) and compose-built environments."""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

import pytest
from tests.test_eval_cli import clotho, results

from clotho.tasks.harbor import discover_tasks


def b64_tar(files: dict[str, str]) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()


CHECK = 'mkdir -p /logs/verifier; [ "$(cat /app/data.txt)" = seeded ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'


def row(name: str, **extra: object) -> dict[str, object]:
    data: dict[str, object] = {
        "task_name": name,
        "category": "rows",
        "instruction": "Leave /app/data.txt alone.",
        "environment_tar": b64_tar({"data.txt": "seeded"}),
        "tests_tar": b64_tar({"helper.txt": "x"}),
        "test_sh": CHECK,
    }
    data.update(extra)
    return data


def test_rows_become_task_directories(tmp_path: Path) -> None:
    rows = tmp_path / "tb2.jsonl"
    rows.write_text(
        json.dumps(row("alpha", docker_image="img:1", difficulty="hard")) + "\n"
        + json.dumps(row("beta")) + "\n"
        + json.dumps({"task_name": "gamma"}) + "\n"
        + json.dumps(row("delta", environment_tar="%%%not base64")) + "\n"
        + "{broken\n"
    )  # fmt: skip
    tasks, errors = discover_tasks([rows], rows_cache=tmp_path / "cache")
    by_name = {t.name: t for t in tasks}
    assert sorted(by_name) == ["alpha", "beta"]
    alpha = by_name["alpha"]
    assert alpha.category == "rows" and alpha.config.metadata.difficulty == "hard"
    assert alpha.config.environment.docker_image == "img:1"
    assert (alpha.environment_dir / "data.txt").read_text() == "seeded"
    assert (alpha.tests_dir / "helper.txt").is_file() and (alpha.tests_dir / "test.sh").is_file()
    messages = sorted(str(e) for _, e in errors)
    assert len(messages) == 3
    assert any("tb2.jsonl:3" in m and "instruction" in m for m in messages)
    assert any("tb2.jsonl:4" in m and "environment_tar" in m for m in messages)
    assert any("tb2.jsonl:5" in m and "not valid JSON" in m for m in messages)
    # A second load reuses the unpacked folders.
    again, _ = discover_tasks([rows], rows_cache=tmp_path / "cache")
    assert {t.path for t in again} == {t.path for t in tasks}


@pytest.mark.bwrap
def test_eval_runs_rows_on_the_local_backend(tmp_path: Path) -> None:
    rows = tmp_path / "tb2.json"
    rows.write_text(json.dumps([row("one"), row("two")]))
    out = tmp_path / "run"
    proc = clotho(
        "eval",
        str(rows),
        "--agent",
        "nop",
        "--out",
        str(out),
        env={"XDG_CACHE_HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["task"]: r["reward"] for r in results(out)} == {"one": 1.0, "two": 1.0}
