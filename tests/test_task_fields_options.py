"""`clotho eval`'s Terminal-Bench run options through the real CLI: --skip-tasks and the
backend's default skip list, --verifier-timeout, --system-prompt and --command-timeout.
Real bubblewrap sandboxes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.test_eval_cli import clotho, results

from clotho.errors import ConfigError
from clotho.runs.plan import DEFAULT_SKIPS_FILE, backend_names, default_skips
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig
from clotho.sandbox.remote_config import RaySandboxConfig

pytestmark = requires_bwrap


def ran(out: Path) -> set[str]:
    return {r["task"] for r in results(out)}


def saved(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


# -- skips ------------------------------------------------------------------------------------


def test_skip_tasks_takes_globs_and_repeats(make_task, tmp_path: Path) -> None:
    for name in ("alpha-1", "alpha-2", "beta", "gamma"):
        make_task(name)
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out),
        "--skip-tasks", "alpha-*", "--skip-tasks", "gamma",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ran(out) == {"beta"}
    assert saved(out)["skip"] == ["alpha-*", "gamma"]


def test_the_backends_default_skip_list(make_task, tmp_path: Path) -> None:
    for name in ("alpha-1", "alpha-2", "beta"):
        make_task(name)
    skips = tmp_path / "skips.toml"
    skips.write_text('local = ["beta"]\ndocker = ["alpha-*"]\n')
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out),
        "--set", f"default_skips={skips}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert ran(out) == {"alpha-1", "alpha-2"}  # the local list only; docker's is not this run's
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert "skipped 1 task(s) known not to run on this backend: beta" in said, proc.stderr
    # Turned off, every task runs; the bundled list (empty) skips none.
    for setting in (["--set", "default_skips=false"], []):
        again = tmp_path / f"run{len(setting)}"
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(again), *setting
        )
        assert proc.returncode == 0, proc.stderr
        assert ran(again) == {"alpha-1", "alpha-2", "beta"}


def test_a_skip_list_that_cannot_be_read_stops_the_run(make_task, tmp_path: Path) -> None:
    make_task("alpha")
    bad = tmp_path / "skips.toml"
    bad.write_text("local = 'alpha'\n")
    for source, problem in ((bad, "must be a list"), (tmp_path / "absent.toml", "cannot read")):
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(tmp_path / "r"),
            "--set", f"default_skips={source}",
        )  # fmt: skip
        said = " ".join(proc.stderr.split())  # the console wraps long lines
        assert proc.returncode == 2 and problem in said, proc.stderr
        assert "Traceback" not in said


def test_default_skip_lists_by_backend() -> None:
    assert backend_names(LocalSandboxConfig()) == ["local"]
    assert backend_names(RaySandboxConfig(inner=DockerSandboxConfig())) == ["ray", "docker"]
    # The bundled file names every backend, and no task is known not to run on one yet.
    for backend in ("local", "unsafe-local", "docker", "ray", "modal", "nomad"):
        assert default_skips([backend]) == []
    assert default_skips(["local"], False) == []
    with pytest.raises(ConfigError):
        default_skips(["local"], str(DEFAULT_SKIPS_FILE.with_suffix(".missing")))


# -- verifier timeout -------------------------------------------------------------------------


def test_verifier_timeout_overrides_the_tasks_own(make_task, tmp_path: Path) -> None:
    # The tests wait for something that never comes; the task allows them 600 s.
    make_task(
        "slow-tests",
        test_sh="sleep 3600\n",
        toml_extra="",
    )
    toml = tmp_path / "tasks" / "slow-tests" / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 30.0", "timeout_sec = 600.0"))
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out),
        "--verifier-timeout", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["error"]["kind"] == "verifier"
    assert "timed out after 2 s" in row["error"]["message"], row["error"]
    assert saved(out)["verifier_timeout_s"] == 2.0


# -- system prompt and command timeout: recorded, and refused when unusable --------------------


def test_system_prompt_from_text_or_file(make_task, tmp_path: Path) -> None:
    make_task("a")
    prompt = tmp_path / "prompt.md"
    prompt.write_text('You work in {workdir}.\nA JSON example: {{"ok": true}}\n')
    for value, expected in (
        ("Be brief. Work in {workdir}.", "Be brief. Work in {workdir}."),
        (f"@{prompt}", prompt.read_text()),
    ):
        out = tmp_path / f"run-{len(value)}"
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out),
            "--system-prompt", value, "--command-timeout", "7",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert saved(out)["system_prompt"] == expected
        assert saved(out)["command_timeout_s"] == 7.0


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('A JSON example: {"ok": true}', "write a literal brace as {{ or }}"),
        ("@/nonexistent/prompt.md", "cannot read /nonexistent/prompt.md"),
        ("   ", "--system-prompt is empty"),
    ],
)
def test_an_unusable_system_prompt_is_refused_in_one_line(
    make_task, tmp_path: Path, value: str, problem: str
) -> None:
    make_task("a")
    out = tmp_path / "run"
    proc = clotho(
        "eval", str(tmp_path / "tasks"), "--agent", "oracle", "--out", str(out),
        "--system-prompt", value,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    said = " ".join(proc.stderr.split())  # the console wraps long lines
    assert problem in said and "Traceback" not in said
    assert not (out / "results.jsonl").exists()


# -- system prompt and command timeout: what the model's agent gets (scripted model server,
# a named test double for a hosted model) ------------------------------------------------------


def test_the_agent_gets_the_system_prompt_and_the_command_timeout(
    make_task, tmp_path: Path
) -> None:
    from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

    make_task("a")
    script = [
        # The model asks for 900 s; the run allows each command 2 s at most.
        assistant(
            "", [tool_call("terminal", {"command": "sleep 600; echo never", "timeout": 900})]
        ),
        assistant("", [tool_call("terminal", {"command": "sleep 600; echo never"})]),
        assistant("Giving up."),
    ]
    out = tmp_path / "run"
    with ScriptedOpenAIServer(script) as server:
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "llm", "--model", "m",
            "--base-url", server.base_url, "--out", str(out),
            "--system-prompt", "Work in {workdir}; be brief.", "--command-timeout", "2",
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["error"] is None and row["tool_calls"] == 2
    system = server.messages(0)[0]
    assert system == {"role": "system", "content": "Work in /app; be brief."}
    for index in (1, 2):  # the asked-for timeout capped, the default replaced
        answer = json.loads(server.messages(index)[-1]["content"])
        assert answer["timed_out"] is True
        assert answer["error"] == "command timed out after 2 s and was killed"
