"""`clotho view` reads outcomes as eval and training do, on real runs (`clotho eval` with the
oracle on the local bubblewrap backend):

- the mean reward and the pass rate are over the same scored attempts (a tamper or verifier
  failure is a 0 in the mean as it is a failure in the pass rate; a broken task is in neither),
  and the card says what it averages;
- a run stopped with Ctrl-C says so ("stopped: M of N attempts"), and `--resume` finishing it
  makes it finished;
- a tool's JSON output (the oracle's `{"output": ...}`) shows as its text, real newlines,
  escaped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests import support
from tests.conftest import requires_bwrap
from tests.support import port_open, wait_until_sync
from tests.test_view_browser import css, on_screen, shot, wait

from clotho.errors import ErrorInfo
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import TrialRecord
from clotho.view.browser import chromium, find_chromium
from clotho.view.sample import append_trials, write_run
from clotho.view.sources import RunSource, tool_text

pytestmark = requires_bwrap

needs_chromium = pytest.mark.skipif(
    find_chromium() is None and os.environ.get("CI") != "true",
    reason="chromium and chromium-driver are not installed (make test installs them)",
)

# The oracle prints two lines and some markup: the page must show both lines and the markup
# as text.
PASS_SOLVE = "printf 'line one\\nline two <b>bold</b>\\n'\necho ok > /app/done.txt\n"
HANG_SOLVE = "sleep 600\n"


def write_task(root: Path, name: str, **kwargs: Any) -> Path:
    """A small task whose agent may run 900 s: a hanging solution is cut by the test, not by
    its timeout."""
    return support.write_task(root, name, agent_timeout_s=900.0, **kwargs)


def clotho(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clotho", *args], capture_output=True, text=True, timeout=300
    )


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    text = path.read_text()  # a line still being written has no newline yet
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def stop_after_first_result(tasks: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """`clotho eval` on tasks where one hangs, sent SIGINT once a result line is written."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "eval", str(tasks), "--agent", "oracle",
         "--concurrency", "2", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert wait_until_sync(lambda: len(lines(out / "results.jsonl")) >= 1, timeout=120)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real runs: one whose outcomes are of every reading, one stopped with Ctrl-C."""
    base = tmp_path_factory.mktemp("outcomes")
    root = base / "runs"
    tasks = base / "tasks"
    write_task(tasks, "a-pass", solve_sh=PASS_SOLVE)
    write_task(tasks, "b-fail", solve_sh="true\n")
    # The reward file holds no number: a verifier error, the agent's failure (scored).
    write_task(
        tasks,
        "c-verifier",
        test_sh="mkdir -p /logs/verifier\necho not-a-number > /logs/verifier/reward.txt\n",
    )
    broken = write_task(tasks, "d-broken")  # a task error: in neither figure
    (broken / "task.toml").write_text("version = \n")
    proc = clotho("eval", str(tasks), "--agent", "oracle", "--out", str(root / "outcomes"))
    assert proc.returncode in (0, 1), proc.stderr

    hanging = base / "hanging"
    write_task(hanging, "a-quick")
    write_task(hanging, "b-hangs", solve_sh=HANG_SOLVE)
    stopped = stop_after_first_result(hanging, root / "stopped")
    assert stopped.returncode == 130, stopped.stderr
    return root


@pytest.fixture(scope="module")
def server(runs: Path) -> Iterator[str]:
    """`clotho view` over the runs, as a user starts it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho.cli.main", "view", str(runs)],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, f"no address printed: {line!r}"
        assert wait_until_sync(lambda: port_open(int(match.group(1)))), "never listened"
        yield match.group(0)
    finally:
        proc.terminate()
        proc.wait(10)


def get(server: str, path: str) -> Any:
    with urllib.request.urlopen(server + path.lstrip("/"), timeout=30) as response:
        return json.loads(response.read())


def run_id(server: str, name: str) -> str:
    return next(r["id"] for r in get(server, "/api/runs") if r["name"] == name)


def trial_index(server: str, rid: str, task: str) -> int:
    page = get(server, f"/api/run/{rid}/trials")
    columns = page["columns"]
    return next(
        row[columns.index("i")] for row in page["rows"] if row[columns.index("task")] == task
    )


def test_mean_reward_and_pass_rate_are_over_the_same_scored_attempts(
    runs: Path, server: str
) -> None:
    rows = lines(runs / "outcomes" / "results.jsonl")
    kinds = {r["task"]: (r["error"] or {}).get("kind") for r in rows}
    assert kinds == {"a-pass": None, "b-fail": None, "c-verifier": "verifier", "d-broken": "task"}
    verifier = next(r for r in rows if r["task"] == "c-verifier")
    assert verifier["reward"] is None  # left out of the mean before: the pass rate counted it

    saved = json.loads((runs / "outcomes" / "metrics.json").read_text())
    assert saved["n_scored"] == 3 and saved["n_passed"] == 1
    assert saved["mean_reward"] == pytest.approx(1 / 3) and saved["mean_reward_n"] == 3
    assert saved["complete"] is True and saved["n_planned"] == saved["n_finished"] == 3

    summary = get(server, f"/api/run/{run_id(server, 'outcomes')}")["summary"]
    assert summary["pass_rate"] == pytest.approx(1 / 3)
    assert summary["mean_reward"] == pytest.approx(1 / 3)
    assert summary["mean_reward_n"] == summary["n_scored"] == 3
    assert summary["status"] == "finished" and summary["finished"]


def test_a_stopped_run_says_how_far_it_got_and_resume_finishes_it(
    runs: Path, server: str, tmp_path: Path
) -> None:
    run = runs / "stopped"
    assert [r["task"] for r in lines(run / "results.jsonl")] == ["a-quick"]
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["complete"] is False
    assert (saved["n_planned"], saved["n_finished"]) == (2, 1)

    summary = get(server, f"/api/run/{run_id(server, 'stopped')}")["summary"]
    assert summary["status"] == "stopped" and not summary["finished"]
    assert (summary["n_planned"], summary["n_finished"]) == (2, 1)

    # `--resume` on a copy (the server's stays stopped), the hanging task now quick.
    copy = tmp_path / "stopped"
    shutil.copytree(run, copy)
    config = json.loads((copy / "config.json").read_text())
    hanging = Path(config["paths"][0])
    (hanging / "b-hangs" / "solution" / "solve.sh").write_text("echo ok > /app/done.txt\n")
    try:
        proc = clotho("eval", str(hanging), "--agent", "oracle", "--out", str(copy), "--resume")
    finally:
        (hanging / "b-hangs" / "solution" / "solve.sh").write_text(HANG_SOLVE)
    assert proc.returncode == 0, proc.stderr
    done = json.loads((copy / "metrics.json").read_text())
    assert done["complete"] is True and (done["n_planned"], done["n_finished"]) == (2, 2)
    resumed = RunSource("0", copy).summary()
    assert resumed["status"] == "finished" and resumed["finished"] and resumed["n_passed"] == 2


def test_a_tool_output_in_json_is_served_as_its_text(runs: Path, server: str) -> None:
    rid = run_id(server, "outcomes")
    detail = get(server, f"/api/run/{rid}/trial/{trial_index(server, rid, 'a-pass')}")
    tool = next(m for m in detail["agent_result"]["messages"] if m["role"] == "tool")
    assert json.loads(tool["content"])["output"].startswith("line one\n")  # kept as recorded
    assert tool["content_text"].startswith("line one\nline two <b>bold</b>\n")
    assert "exit_code: 0" in tool["content_text"] and "\\n" not in tool["content_text"]


def test_tool_text_decodes_json_and_leaves_anything_else() -> None:
    assert tool_text(json.dumps("a\nb")) == "a\nb"
    assert tool_text('{"output": "x\\ny\\n", "exit_code": 1}') == "x\ny\nexit_code: 1"
    assert tool_text("plain output\n") is None
    assert tool_text("{not json") is None
    assert tool_text("[1, 2]") is None


def test_a_tamper_failure_is_a_zero_in_the_mean_and_a_failure_in_the_pass_rate() -> None:
    """Tamper is not produced by the real runs above (the verifier error is the same reading:
    scored, no reward); here it is read directly, beside an infra error left out of both."""
    base = {"category": "c", "attempt": 0, "agent": "oracle", "passed": False}
    records = [
        TrialRecord(task="ok", reward=1.0, **{**base, "passed": True}),
        TrialRecord(
            task="tamper", reward=None, error=ErrorInfo(kind="tamper", message="x"), **base
        ),
        TrialRecord(task="infra", reward=None, error=ErrorInfo(kind="infra", message="x"), **base),
    ]
    metrics = compute_metrics(records)
    assert (metrics.n_scored, metrics.pass_rate) == (2, 0.5)
    assert (metrics.mean_reward, metrics.mean_reward_n) == (0.5, 2)


def test_a_stopped_run_resumed_reads_as_running_until_it_writes_its_metrics(
    tmp_path: Path,
) -> None:
    run = write_run(tmp_path / "r", 4, seed=3)
    saved = json.loads((run / "metrics.json").read_text())
    saved.update(complete=False, n_planned=6, n_finished=4)
    (run / "metrics.json").write_text(json.dumps(saved))
    os.utime(run / "results.jsonl", (1, 1))
    source = RunSource("0", run)
    assert source.summary()["status"] == "stopped"
    append_trials(run, 4, 1)  # `--resume` appends after the stopped run's metrics.json
    assert source.summary()["status"] == "running"


def test_an_old_run_folder_reads_as_before_with_one_reading_of_the_mean(tmp_path: Path) -> None:
    """metrics.json written before `complete` and `mean_reward_n`: finished, as it was read
    then, and its mean reward read again from the records (scored failures as 0)."""
    run = write_run(tmp_path / "old", 40, seed=5)
    saved = json.loads((run / "metrics.json").read_text())
    for key in ("complete", "n_planned", "n_finished", "mean_reward_n"):
        saved.pop(key)
    saved["mean_reward"] = 0.987  # the old reading, not what the records say
    (run / "metrics.json").write_text(json.dumps(saved))
    os.utime(run / "results.jsonl", (1, 1))
    source = RunSource("0", run)
    summary = source.summary()
    assert summary["status"] == "finished" and summary["finished"]
    assert summary["n_planned"] is None
    scored = [r for r in source.records if r.scored]
    assert any(r.error is not None for r in scored), "the sample should hold scored failures"
    assert summary["mean_reward_n"] == len(scored) == summary["n_scored"]
    assert summary["mean_reward"] == pytest.approx(
        sum(r.reward if r.error is None and r.reward is not None else 0.0 for r in scored)
        / len(scored)
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium(1400, 900) as driver:
        yield driver


@needs_chromium
def test_the_page_shows_the_stopped_badge_the_mean_card_and_tool_text(
    browser: Any, server: str
) -> None:
    d = browser
    d.get(server)
    rows = wait(lambda: len(css(d, "#runs tr.run-row")) == 2 and css(d, "#runs tr.run-row"))
    by_name = {r.find_element("tag name", "a").text: r for r in rows}
    assert by_name["stopped"].find_element("css selector", ".chip.stopped").text == (
        "stopped: 1 of 2 attempts"
    )
    name_cells = {name: r.find_elements("tag name", "td")[1] for name, r in by_name.items()}
    assert not name_cells["stopped"].find_elements("css selector", ".chip.live")
    assert not name_cells["outcomes"].find_elements("css selector", ".chip")  # finished
    shot(d, "stopped")

    d.get(server + f"#/run/{run_id(server, 'stopped')}")
    badge = on_screen(d, "#run-status .chip.stopped")
    assert badge.text == "stopped: 1 of 2 attempts"
    assert d.find_element("id", "live").text == ""  # not "live: updating": nothing writes it

    rid = run_id(server, "outcomes")
    d.get(server + f"#/run/{rid}")
    card = on_screen(d, "#mean-reward")
    assert "0.333" in card.text and "mean reward over 3 scored trials" in card.text

    d.get(server + f"#/run/{rid}/trial/{trial_index(server, rid, 'a-pass')}")
    out = on_screen(d, ".msg.tool pre")
    shown = out.get_attribute("textContent")
    assert shown.startswith("line one\nline two <b>bold</b>\n"), shown
    assert "\\n" not in shown
    assert not out.find_elements("tag name", "b")  # the markup is text, never injected
    assert len(out.text.splitlines()) >= 3  # rendered on lines of their own
