"""`clotho eval --agent llm` end to end against the scripted model server (a named test double)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import HTTPError, ScriptedOpenAIServer, assistant, tool_call
from tests.test_eval_cli import clotho, results

pytestmark = requires_bwrap


def test_llm_agent_solves_a_task_through_tools(make_task, tmp_path: Path) -> None:
    make_task("write-ok")
    script = [
        assistant(
            "<think>I should look first.</think>Let me check.",
            [tool_call("terminal", {"command": "ls -la /app; pwd"})],
        ),
        assistant("", [tool_call("write_file", {"path": "done.txt", "content": "ok\n"})]),
        assistant("Done: /app/done.txt contains ok."),
    ]
    out = tmp_path / "run"
    with ScriptedOpenAIServer(script) as server:
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "llm", "--model", "m", "--base-url", server.base_url,
            "--api-key-env", "SCRIPTED_KEY", "--temperature", "0.3", "--out", str(out),
            env={"SCRIPTED_KEY": "sekrit"},
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["passed"] is True and row["reward"] == 1.0
    assert row["turns"] == 3 and row["stop_reason"] == "finished" and row["tool_calls"] == 2
    first = server.requests[0]
    assert first["model"] == "m" and first["temperature"] == 0.3
    assert {t["function"]["name"] for t in first["tools"]} == {
        "terminal", "read_file", "write_file", "edit_file", "search_files",
    }  # fmt: skip
    assert server.headers[0]["authorization"] == "Bearer sekrit"
    # The second request carries the real output of `pwd` run in the sandbox.
    tool_message = server.messages(1)[-1]
    assert tool_message["role"] == "tool" and json.loads(tool_message["content"])[
        "output"
    ].endswith("/app\n")
    detail = json.loads((out / row["detail"]).read_text())
    assert detail["agent_result"]["reasoning"][0] == "I should look first."
    assert detail["agent_result"]["messages"][2]["content"] == "Let me check."


@pytest.mark.parametrize("retries", [None, 0])
def test_model_outage_is_an_infra_error_not_a_failure(
    make_task, tmp_path: Path, retries: int | None
) -> None:
    make_task("a")
    make_task("b")
    out = tmp_path / "run"
    with ScriptedOpenAIServer(default=HTTPError(503)) as server:
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "llm", "--model", "m", "--base-url", server.base_url,
            "--set", "model.max_retries=1", "--set", "model.backoff_initial_s=0.01", "--out", str(out),
            *(["--retries", str(retries)] if retries is not None else []),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = results(out)
    assert len(rows) == 2
    assert all(r["error"]["kind"] == "infra" and "503" in r["error"]["message"] for r in rows)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (
        metrics["pass_rate"] is None
        and metrics["n_scored"] == 0
        and metrics["errors"] == {"infra": 2}
    )
    # Two requests per try (model.max_retries=1); per task, the first try and the in-run
    # retries of an infra error (default 2). No more, no less.
    tries = 1 + (2 if retries is None else retries)
    assert len(server.requests) == 2 * tries * 2
    assert all(len(r["lost_tries"]) == tries - 1 for r in rows)
