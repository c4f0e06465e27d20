"""The reference agents in a real bubblewrap sandbox: oracle runs solve.sh, nop does nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clotho.agent import AgentContext, NopAgent, OracleAgent
from clotho.errors import TaskError
from clotho.sandbox import Sandbox

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
pytest_plugins = ("tests.sandbox_fixtures",)  # sandbox


def solution(tmp_path: Path, solve_sh: str | None, **files: str) -> Path:
    folder = tmp_path / "solution"
    folder.mkdir()
    if solve_sh is not None:
        (folder / "solve.sh").write_text(solve_sh)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


async def test_oracle_uploads_the_solution_and_runs_solve_sh(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    solve = (
        "set -e\n"
        "cp /solution/answer.txt /app/answer.txt\n"
        'echo "solved in $(pwd)" > /app/done.txt\n'
        "echo progress-on-stdout\n"
        "echo progress-on-stderr >&2\n"
    )
    ctx = AgentContext(
        instruction="Put the answer in /app.",
        sandbox=sandbox,
        solution_dir=solution(tmp_path, solve, **{"answer.txt": "42\n"}),
    )
    result = await OracleAgent().run(ctx)

    assert await sandbox.read_file("/app/answer.txt") == b"42\n"
    assert await sandbox.read_file("/app/done.txt") == b"solved in /app\n"
    assert await sandbox.read_file("/solution/solve.sh") == solve.encode()

    assert result.stop_reason == "finished"
    assert result.turns == 1
    assert result.tool_calls == 1
    assert result.duration_s > 0
    user, call_message, tool_message = result.messages
    assert user == {"role": "user", "content": "Put the answer in /app."}
    [call] = call_message["tool_calls"]
    assert call["function"]["name"] == "terminal"
    assert json.loads(call["function"]["arguments"]) == {"command": "bash /solution/solve.sh"}
    assert tool_message["tool_call_id"] == call["id"]
    output = json.loads(tool_message["content"])
    assert output["exit_code"] == 0
    assert output["timed_out"] is False
    # stderr is folded into the output the trajectory records.
    assert "progress-on-stdout" in output["output"]
    assert "progress-on-stderr" in output["output"]


async def test_oracle_uses_the_context_solution_mount(sandbox: Sandbox, tmp_path: Path) -> None:
    ctx = AgentContext(
        instruction="x",
        sandbox=sandbox,
        solution_dir=solution(tmp_path, "echo -n $0 > /app/script-path\n"),
        solution_mount="/app/.oracle",
    )
    await OracleAgent().run(ctx)
    assert await sandbox.read_file("/app/script-path") == b"/app/.oracle/solve.sh"


async def test_oracle_records_a_failing_solution(sandbox: Sandbox, tmp_path: Path) -> None:
    ctx = AgentContext(
        instruction="x",
        sandbox=sandbox,
        solution_dir=solution(tmp_path, "echo about to fail\nexit 3\n"),
    )
    result = await OracleAgent().run(ctx)
    output = json.loads(result.messages[-1]["content"])
    assert output["exit_code"] == 3
    assert "about to fail" in output["output"]
    # A failing solution is still a finished run; the verifier decides the reward.
    assert result.stop_reason == "finished"


async def test_oracle_time_limit(sandbox: Sandbox, tmp_path: Path) -> None:
    ctx = AgentContext(
        instruction="x",
        sandbox=sandbox,
        time_limit_s=0.5,
        solution_dir=solution(tmp_path, "sleep 3600\n"),
    )
    result = await OracleAgent().run(ctx)
    # The hour-long solution was stopped (a run that waited for it meets pytest's timeout).
    assert result.stop_reason == "time_limit"
    assert json.loads(result.messages[-1]["content"])["timed_out"] is True


async def test_nop_agent_does_nothing(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/existing.txt", b"untouched")
    before = (await sandbox.exec("ls -lA --time-style=full-iso /app")).stdout
    result = await NopAgent().run(AgentContext(instruction="Do a lot.", sandbox=sandbox))
    after = (await sandbox.exec("ls -lA --time-style=full-iso /app")).stdout
    assert after == before
    assert await sandbox.read_file("/app/existing.txt") == b"untouched"
    assert result.messages == [{"role": "user", "content": "Do a lot."}]
    assert result.turns == 0
    assert result.tool_calls == 0
    assert result.stop_reason == "finished"


async def test_oracle_without_a_solution_dir_is_a_task_error(sandbox: Sandbox) -> None:
    with pytest.raises(TaskError, match=r"solve\.sh"):
        await OracleAgent().run(AgentContext(instruction="x", sandbox=sandbox))


async def test_oracle_without_solve_sh_is_a_task_error(sandbox: Sandbox, tmp_path: Path) -> None:
    folder = solution(tmp_path, None, **{"notes.txt": "no script here"})
    ctx = AgentContext(instruction="x", sandbox=sandbox, solution_dir=folder)
    with pytest.raises(TaskError, match=r"solve\.sh") as info:
        await OracleAgent().run(ctx)
    assert info.value.kind == "task"
    # Nothing was uploaded before giving up.
    assert (await sandbox.exec("test -e /solution/notes.txt")).exit_code == 1
