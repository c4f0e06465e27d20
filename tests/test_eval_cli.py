"""End to end: the `clotho eval` and `clotho check` commands as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.support import run_clotho as clotho
from tests.support import wait_until_sync

pytestmark = requires_bwrap

RESULT_FIELDS = {
    "task",
    "category",
    "attempt",
    "reward",
    "passed",
    "error",
    "stop_reason",
    "turns",
    "duration_s",
}


def results(out: Path) -> list[dict]:
    """The finished rows; a line `clotho eval` is still writing has no newline yet."""
    text = (out / "results.jsonl").read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.parametrize("root", ["overlay", "ro"])
def test_oracle_passes_every_bundled_task(examples_dir: Path, tmp_path: Path, root: str) -> None:
    out = tmp_path / "run"
    proc = clotho(
        "eval",
        str(examples_dir),
        "--agent",
        "oracle",
        "--out",
        str(out),
        "--set",
        f"sandbox.root={root}",
    )
    assert proc.returncode == 0, proc.stderr
    rows = results(out)
    assert len(rows) >= 10
    for row in rows:
        assert row.keys() >= RESULT_FIELDS
        assert row["passed"] is True, row
        assert row["error"] is None
        assert row["reward"] == 1.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_rate"] == 1.0
    assert metrics["n_tasks"] == len(rows) == metrics["n_passed"]
    assert len(metrics["by_category"]) >= 4
    assert all(c["pass_rate"] == 1.0 for c in metrics["by_category"].values())
    config = json.loads((out / "config.json").read_text())
    assert config["agent"] == "oracle" and config["sandbox"]["backend"] == "local"
    detail = json.loads((out / rows[0]["detail"]).read_text())
    assert detail["verifier"]["reward"] == 1.0
    assert detail["agent_result"]["messages"][1]["tool_calls"][0]["function"]["name"] == "terminal"


def test_nop_passes_no_bundled_task(examples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = clotho("eval", str(examples_dir), "--agent", "nop", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    rows = results(out)
    assert len(rows) >= 10
    assert not any(r["passed"] for r in rows)
    assert all(r["error"] is None and r["reward"] == 0.0 for r in rows), rows
    assert json.loads((out / "metrics.json").read_text())["pass_rate"] == 0.0


def test_check_reports_sound_and_unsound_tasks(make_task, tmp_path: Path) -> None:
    make_task("sound")
    make_task("lenient", test_sh="mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n")
    make_task("broken-solution", solve_sh="exit 1\n")
    proc = clotho("check", str(tmp_path / "tasks"))
    assert proc.returncode == 1
    assert "doing nothing passes" in proc.stderr
    assert "oracle does not pass" in proc.stderr
    assert "1 of 3 tasks are sound" in proc.stderr


def test_resume_runs_only_missing_attempts(make_task, tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        make_task(name)
    out = tmp_path / "run"
    tasks = str(tmp_path / "tasks")
    assert (
        clotho("eval", tasks, "--agent", "oracle", "--attempts", "2", "--out", str(out)).returncode
        == 0
    )
    rows = results(out)
    assert len(rows) == 6
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_at_k"] == {"1": 1.0, "2": 1.0}
    # Lose the last attempt, as if the run had been killed before it finished.
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    again = clotho("eval", tasks, "--agent", "oracle", "--attempts", "2", "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = clotho(
        "eval", tasks, "--agent", "oracle", "--attempts", "2", "--out", str(out), "--resume"
    )
    assert resumed.returncode == 0, resumed.stderr
    new_rows = results(out)
    assert len(new_rows) == 6
    assert {(r["task"], r["attempt"]) for r in new_rows} == {(t, a) for t in "abc" for a in (0, 1)}
    assert new_rows[:5] == rows[:5]


def test_malformed_task_is_reported_and_others_run(make_task, tmp_path: Path) -> None:
    make_task("good")
    bad = make_task("bad")
    (bad / "task.toml").write_text("[agent]\ntimeout_sec = 'never'\n")
    out = tmp_path / "run"
    proc = clotho("eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    by_task = {r["task"]: r for r in results(out)}
    assert by_task["good"]["passed"] is True
    assert by_task["bad"]["error"]["kind"] == "task"
    assert "[agent].timeout_sec" in by_task["bad"]["error"]["message"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_rate"] == 1.0 and metrics["errors"] == {"task": 1}


def test_filter_and_skip(make_task, tmp_path: Path) -> None:
    for name in ("git-a", "git-b", "files-a"):
        make_task(name)
    out = tmp_path / "run"
    proc = clotho(
        "eval",
        str(tmp_path / "tasks"),
        "--agent",
        "nop",
        "--filter",
        "git-*",
        "--skip",
        "git-b",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["task"] for r in results(out)] == ["git-a"]


def test_task_timeout_stops_a_slow_agent(make_task, tmp_path: Path) -> None:
    """The agent would sleep 600 s; `clotho` returns within the 300 s `run_clotho` allows
    only if the 1 s task timeout stopped it, and the row says so."""
    make_task("slow", solve_sh="sleep 600\n")
    out = tmp_path / "run"
    proc = clotho(
        "eval",
        str(tmp_path / "tasks"),
        "--agent",
        "oracle",
        "--task-timeout",
        "1",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["passed"] is False
    assert row["error"]["kind"] == "agent" and "wall-clock" in row["error"]["message"]


def test_ctrl_c_keeps_finished_results_and_leaves_nothing_behind(make_task, tmp_path: Path) -> None:
    make_task("quick-1")
    make_task("quick-2")
    make_task("slow-1", solve_sh="sleep 120\n")
    make_task("slow-2", solve_sh="sleep 120\n")
    state = tmp_path / "state"
    state.mkdir()
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "eval", str(tmp_path / "tasks"), "--agent", "oracle",
         "--concurrency", "4", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(state)},
    )  # fmt: skip
    try:

        def quick_done_slow_running() -> bool:
            rows = results(out) if (out / "results.jsonl").exists() else []
            return len(rows) == 2 and len(processes_mentioning(str(state))) >= 2

        wait_until_sync(quick_done_slow_running, 120)
        rows = results(out) if (out / "results.jsonl").exists() else []
        assert len(rows) == 2, "the quick tasks did not finish"
        assert processes_mentioning(str(state)), "the slow sandboxes should be running"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    assert sorted(r["task"] for r in results(out)) == ["quick-1", "quick-2"]
    assert json.loads((out / "metrics.json").read_text())["n_passed"] == 2
    assert processes_mentioning(str(state)) == []
    assert [p.name for p in state.iterdir()] == []


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        (["--agent", "llm", "--concurrency", "0"], "concurrency"),
        (["--agent", "llm", "--api", "vllm", "--base-url", "http://127.0.0.1:9"], "tokenizer"),
        (["--agent", "llm", "--api", "grpc"], "api"),
    ],
)
def test_bad_flags_get_a_clear_message(examples_dir: Path, flag: list[str], says: str) -> None:
    proc = clotho("eval", str(examples_dir), *flag)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr


def test_messages_with_brackets_print_as_written(tmp_path: Path) -> None:
    """Rich must not read a path or a hint like `clotho-rl[api]` as markup and drop it."""
    from typer.testing import CliRunner

    from clotho.cli.main import app

    missing = tmp_path / "tasks[api]"
    result = CliRunner().invoke(app, ["check", str(missing)])
    assert "tasks[api]" in result.output
    bad = CliRunner().invoke(app, ["eval", str(tmp_path), "--set", "agent='a[x]'"])
    assert bad.exit_code == 2 and "a[x]" in bad.output
