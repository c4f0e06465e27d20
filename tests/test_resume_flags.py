"""`clotho eval --resume` continues a run with its saved configuration (config.json): a flag
that would change what the run measures is refused, naming the setting, and the run is left
as it was; only how fast it goes may change (concurrency, retries, retry budget, prewarm,
force-build), and a flag that repeats the saved value is no conflict.

The refusals run the real command in this process (they end before any sandbox starts); the
run and its allowed resume are real `clotho eval` processes on the local backend.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.support import run_clotho, write_task
from typer.testing import CliRunner

from clotho.cli.main import app

pytestmark = requires_bwrap


def clotho(*args: str) -> subprocess.CompletedProcess[str]:
    return run_clotho(*args, env={"COLUMNS": "10000"})


def snapshot(run: Path) -> dict[str, tuple[bytes, int]]:
    """Every file of the run directory: content and modification time."""
    return {
        str(f.relative_to(run)): (f.read_bytes(), f.stat().st_mtime_ns)
        for f in sorted(run.rglob("*"))
        if f.is_file()
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(tasks folder, run directory): the oracle on one task, two attempts, finished."""
    root = tmp_path_factory.mktemp("resume")
    tasks = root / "tasks"
    write_task(tasks, "a")
    out = root / "run"
    done = clotho("eval", str(tasks), "--agent", "oracle", "--attempts", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return tasks, out


def resume(out: Path, *flags: str) -> tuple[int, str]:
    """`clotho eval --out OUT --resume FLAGS` in this process: (exit code, its words)."""
    result = CliRunner().invoke(
        app, ["eval", "--out", str(out), "--resume", *flags], env={"COLUMNS": "10000"}
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, " ".join(result.output.split())


# (flags, the settings the refusal must name, what it says was saved and given)
REFUSED: dict[str, tuple[list[str], list[str]]] = {
    "agent": (["--agent", "nop"], ["agent: saved 'oracle', given 'nop'"]),
    "model": (["--model", "some/model"], ["model.model: saved None, given 'some/model'"]),
    "api": (["--api", "chat"], ["model.api: saved None, given 'chat'"]),
    "tokenizer": (["--tokenizer", "tok.json"], ["model.tokenizer: saved None"]),
    "tool parser": (["--tool-parser", "hermes"], ["model.tool_parser: saved None"]),
    "base url": (["--base-url", "http://127.0.0.1:9/v1"], ["model.base_url: saved None"]),
    "api key env": (["--api-key-env", "OTHER_KEY"], ["model.api_key_env: saved None"]),
    "temperature": (["--temperature", "0.3"], ["model.sampling.temperature: saved None"]),
    "max tokens": (["--max-tokens", "7"], ["model.sampling.max_tokens: saved None"]),
    "max turns": (["--max-turns", "3"], ["max_turns: saved 30, given 3"]),
    "sandbox": (["--sandbox", "docker"], ["sandbox.backend: saved 'local', given 'docker'"]),
    "network": (["--network"], ["sandbox.network: saved False, given True"]),
    "attempts": (["--attempts", "3"], ["attempts: saved 2, given 3"]),
    "task timeout": (["--task-timeout", "5"], ["task_timeout_s: saved None, given 5.0"]),
    "filter": (["--filter", "a,b"], ["filter: saved [], given ['a', 'b']"]),
    "skip": (["--skip", "a"], ["skip: saved [], given ['a']"]),
    "set: threshold": (["--set", "pass_threshold=0.5"], ["pass_threshold: saved 1.0, given 0.5"]),
    "set: toolsets": (["--set", "toolsets=[terminal]"], ["toolsets: saved ['terminal', 'file']"]),
    "set: sandbox": (["--set", "sandbox.cpus=3"], ["sandbox.cpus: saved None, given 3"]),
    "set: swe": (["--set", "swe.reward=shaped"], ["swe.reward: saved 'binary', given 'shaped'"]),
    # Several at once: each is named; the allowed one among them is not.
    "several": (
        ["--agent", "nop", "--attempts", "3", "--retries", "9"],
        ["agent: saved 'oracle', given 'nop'", "attempts: saved 2, given 3"],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_flag_that_changes_what_is_measured_is_refused(run: tuple[Path, Path], case: str):
    _, out = run
    flags, named = REFUSED[case]
    before = snapshot(out)
    code, said = resume(out, *flags)
    assert code == 2, said
    assert "--resume continues a run with its saved configuration" in said
    for conflict in named:
        assert conflict in said, said
    assert "retries" not in said.split("settings differ:")[1]
    assert snapshot(out) == before  # nothing ran, nothing was rewritten


def test_other_paths_a_config_file_and_a_repos_dir_are_refused(
    run: tuple[Path, Path], tmp_path: Path
) -> None:
    tasks, out = run
    before = snapshot(out)
    other = tmp_path / "other"
    write_task(other, "b")
    code, said = resume(out, str(other))
    assert code == 2 and f"paths: saved ['{tasks}'], given ['{other}']" in said, said
    config = tmp_path / "config.yaml"
    config.write_text("attempts: 4\nconcurrency: 1\n")  # concurrency alone would be allowed
    code, said = resume(out, "--config", str(config))
    assert code == 2 and "attempts: saved 2, given 4" in said, said
    assert "concurrency" not in said.split("settings differ:")[1]
    code, said = resume(out, "--repos-dir", str(tmp_path))
    assert code == 2 and f"swe.repos_dir: saved None, given '{tmp_path}'" in said, said
    assert snapshot(out) == before


def test_resume_needs_a_run_to_continue(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", "--resume"], env={"COLUMNS": "10000"})
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "--resume needs the run directory: --out DIR" in said
    code, said = resume(tmp_path)
    assert code == 2 and f"{tmp_path} holds no run to resume (no config.json)" in said, said
    assert list(tmp_path.iterdir()) == []


def test_allowed_flags_and_repeated_values_resume_the_run(run: tuple[Path, Path]) -> None:
    """How fast may change (and is saved); flags equal to the saved values are no conflict;
    the attempt a crash lost is run, the finished one kept as it was."""
    tasks, out = run
    saved = json.loads((out / "config.json").read_text())
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    (out / "results.jsonl").write_text(lines[0] + "\n")  # as if killed before the last one
    resumed = clotho(
        "eval", str(tasks), "--out", str(out), "--resume",
        # allowed: how fast
        "--retries", "5", "--retry-budget", "7", "--concurrency", "3", "--force-build",
        "--set", "prewarm=false",
        # the saved values again
        "--agent", "oracle", "--attempts", "2", "--sandbox", "local", "--no-network",
        "--max-turns", "30",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    rows = (out / "results.jsonl").read_text().splitlines()
    assert rows[0] == lines[0]
    assert [(json.loads(r)["attempt"], json.loads(r)["passed"]) for r in rows] == [
        (json.loads(lines[0])["attempt"], True),
        (json.loads(lines[1])["attempt"], True),
    ]
    now = json.loads((out / "config.json").read_text())
    changed = {"retries": 5, "retry_budget": 7, "concurrency": 3, "force_build": True,
               "prewarm": False}  # fmt: skip
    assert {k: now[k] for k in changed} == changed
    assert {k: v for k, v in now.items() if k not in changed} == {
        k: v for k, v in saved.items() if k not in changed
    }
