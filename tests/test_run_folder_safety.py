"""A run folder is data: its links are not followed, its FIFOs not waited on, and it is
private to whoever made it.

A hostile (or careless) run folder whose `trials/` links to a folder of the host must not
pour that folder's files into a shareable report, the live viewer or an SFT file; a FIFO
where a file should be is refused at once instead of hanging the export. Run folders are
made 0700 and their files 0600.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from clotho.errors import ConfigError
from clotho.runs.records import EvalConfig, TrialDetail, TrialRecord
from clotho.runs.store import RunStore
from clotho.view.app import create_app
from clotho.view.export import export_html
from clotho.view.sample import write_run
from clotho.view.sources import RunSource, discover

SECRET = "host-secret-8f3a"


def clotho(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process: a hang is a failed test, bounded by the timeout."""
    return subprocess.run(
        [sys.executable, "-m", "clotho", *args], capture_output=True, text=True, timeout=120
    )


def linked_trials(tmp_path: Path) -> tuple[Path, Path]:
    """(a run whose trials/ is a link to a host folder holding files named as the run's
    trial files, 0600, the first with a secret in it; that first file)."""
    run = write_run(tmp_path / "run", 3)
    host = tmp_path / "host-folder"
    (run / "trials").rename(host)
    (run / "trials").symlink_to(host)
    first = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    secret = host / first["detail"].removeprefix("trials/")
    detail = json.loads(secret.read_text())
    detail["agent_result"]["messages"] = [{"role": "user", "content": SECRET}]
    secret.write_text(json.dumps(detail))
    for path in host.iterdir():
        path.chmod(0o600)
    return run, secret


def test_a_linked_trials_folder_stays_out_of_the_report(tmp_path: Path) -> None:
    run, _ = linked_trials(tmp_path)
    source = RunSource("0", run)
    detail = source.detail(0)
    assert detail is not None and detail["record"]["task"]
    assert SECRET not in json.dumps(detail)
    out = tmp_path / "report.html"
    assert export_html([run], out) == 1
    assert SECRET not in out.read_text()
    exported = clotho("view", str(run), "--export", str(tmp_path / "cli.html"))
    assert exported.returncode == 0, exported.stderr
    assert SECRET not in (tmp_path / "cli.html").read_text()


def test_a_linked_trials_folder_stays_out_of_the_live_viewer(tmp_path: Path) -> None:
    run, _ = linked_trials(tmp_path)
    client = TestClient(create_app(discover([run])), base_url="http://127.0.0.1")
    body = client.get("/api/run/0/trial/0").text
    assert client.get("/api/run/0/trials").json()["total"] == 3
    assert SECRET not in body


def test_a_linked_trials_folder_is_refused_by_the_sft_export(tmp_path: Path) -> None:
    run, _ = linked_trials(tmp_path)
    from clotho.export.sources import trajectories_from_run

    with pytest.raises(ConfigError, match="cannot read trial file"):
        list(trajectories_from_run(run))
    out = tmp_path / "sft.jsonl"
    result = clotho("export", "sft", str(run), "--out", str(out), "--all")
    assert result.returncode != 0
    assert not out.exists() or SECRET not in out.read_text()


def test_linked_run_files_are_not_read(tmp_path: Path) -> None:
    """results.jsonl and config.json as links to host files: the run shows as empty."""
    run = write_run(tmp_path / "run", 2)
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"task": SECRET, "category": SECRET, "agent": SECRET}) + "\n")
    for name in ("results.jsonl", "config.json", "metrics.json"):
        (run / name).unlink()
        (run / name).symlink_to(host)
    source = discover([run])[0]
    assert SECRET not in json.dumps(source.summary())
    assert source.trials()["total"] == 0


@pytest.mark.parametrize("where", ["results.jsonl", "trial", "config.json"])
def test_a_fifo_in_a_run_folder_is_refused_not_waited_on(tmp_path: Path, where: str) -> None:
    run = write_run(tmp_path / "run", 2)
    first = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    target = run / (first["detail"] if where == "trial" else where)
    target.unlink()
    os.mkfifo(target)
    report = tmp_path / "report.html"
    viewed = clotho("view", str(run), "--export", str(report))
    assert viewed.returncode == 0, viewed.stderr
    assert report.read_text().startswith("<!")
    sft = clotho("export", "sft", str(run), "--out", str(tmp_path / "sft.jsonl"), "--all")
    if where == "results.jsonl":  # the run has no readable results at all
        assert sft.returncode != 0 and "results.jsonl" in sft.stderr, sft.stderr
    else:
        assert sft.returncode != 0, sft.stdout
        assert "Traceback" not in sft.stderr


async def test_run_folders_are_private(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask gives nobody else a look
    try:
        out = tmp_path / "runs" / "r"
        store = RunStore(out)
        store.prepare(resume=False)
        store.write_config(EvalConfig(paths=["x"], agent="nop"))
        record = TrialRecord(task="t", category="c", attempt=0, reward=1.0, passed=True,
                             agent="nop")  # fmt: skip
        await store.append(record, TrialDetail(record=record))
        store.supersede({record.key})
        await store.append(record, TrialDetail(record=record))  # results.jsonl rewritten
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE((out / "trials").stat().st_mode) == 0o700
    written = [out / "config.json", out / "results.jsonl", *(out / "trials").iterdir()]
    assert len(written) == 3
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert len(store.load_records()) == 1


def test_a_linked_results_file_is_never_written_through(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    (run / "results.jsonl").symlink_to(victim)
    (run / "config.json").write_text(EvalConfig(paths=["x"]).model_dump_json())
    with pytest.raises(ConfigError, match="not links"):
        RunStore(run).prepare(resume=True)
    assert victim.read_text() == "keep\n"
