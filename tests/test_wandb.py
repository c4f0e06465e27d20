"""`--wandb PROJECT`: runs and groups logged to Weights & Biases, offline (WANDB_MODE=offline).

What W&B wrote is read back from its own files: the run's `.wandb` log (LevelDB-style
blocks of protobuf records, parsed with wandb's own `Record` message) and its table files.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support import run_clotho, wait_until_sync

pytest.importorskip("wandb")

from clotho.runs.metrics import compute_metrics
from clotho.runs.store import RunStore
from clotho.runs.tracking import GroupTracker, track_groups, track_run
from clotho.view.sample import write_groups, write_run

BLOCK = 32768


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.delenv("WANDB_DIR", raising=False)


def read_offline_run(folder: Path) -> dict[str, Any]:
    """The one offline run under `folder`: its config, history steps, summary and tables.

    W&B's service process writes the log behind the client: `finish()` can return before
    the history is on disk, so this waits for the run's exit record."""
    wait_until_sync(lambda: _has_exited(folder), 60)
    return _read_offline_run(folder)


def _has_exited(folder: Path) -> bool:
    """Whether the run's exit record is on disk; a log the service is still creating or
    writing into (a record cut mid-write) is simply not there yet."""
    from google.protobuf.message import DecodeError

    try:
        return _read_offline_run(folder)["exited"]
    except (ValueError, StopIteration, DecodeError):
        return False


def _read_offline_run(folder: Path) -> dict[str, Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    (run_dir,) = folder.glob("wandb/offline-run-*")
    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    pos, pending, raws = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # the service is still writing this record
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            raws.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            raws.append(pending + chunk)
    out: dict[str, Any] = {
        "config": {},
        "history": [],
        "summary": {},
        "project": None,
        "exited": False,
    }
    for raw in raws:
        record = pb.Record()
        record.ParseFromString(raw)
        which = record.WhichOneof("record_type")
        if which == "run":
            out["project"] = record.run.project
            out["name"] = record.run.display_name
            for item in record.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif which == "history":
            out["history"].append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
        elif which == "exit":
            out["exited"] = True
        elif which == "summary":
            for item in record.summary.update:
                out["summary"][item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    out["tables"] = {
        path.name.split("_")[0] + "/" + path.name.split("_")[1]: json.loads(path.read_text())
        for path in run_dir.glob("files/media/table/**/*.table.json")
    }
    return out


def test_a_run_directory_is_logged_step_by_step(tmp_path: Path) -> None:
    run = write_run(tmp_path / "qwen", 12, attempts=2, seed=5)
    track_run(run, "clotho-test")
    logged = read_offline_run(run)
    assert logged["project"] == "clotho-test" and logged["name"] == "qwen"
    assert logged["config"]["attempts"] == 2 and logged["config"]["agent"] == "llm"
    steps = logged["history"]
    assert [s["_step"] for s in steps] == list(range(12))
    records = sorted(RunStore(run).load_records(), key=lambda r: r.finished_at)
    metrics = compute_metrics(records, attempts=2)
    last = steps[-1]
    assert last["eval/pass_rate"] == pytest.approx(metrics.pass_rate)
    assert last["eval/attempts"] == 12
    for kind, n in metrics.errors.items():
        assert last[f"errors/{kind}"] == n
    assert steps[0]["eval/pass_rate"] in (0, 1)  # the first attempt alone
    assert "timings/agent_s" in last and "eval/reward/std" in last
    (table,) = logged["tables"].values()
    assert table["columns"][:4] == ["task", "attempt", "prompt", "final_answer"]
    assert len(table["data"]) == 12
    first = dict(zip(table["columns"], table["data"][0], strict=True))
    assert first["prompt"].startswith("Task task-00000:")
    assert first["final_answer"] in ("Done: the file is fixed.", "I give up.")
    assert first["tool_calls"] == 2
    assert logged["summary"]["pass_rate"] == pytest.approx(metrics.pass_rate)
    assert logged["summary"]["pass@2"] == pytest.approx(metrics.pass_at_k["2"])  # type: ignore[index]


def test_groups_are_logged_with_why_groups_were_dropped(tmp_path: Path) -> None:
    groups = write_groups(tmp_path / "groups.jsonl", 3, group_size=4)
    from clotho.env.scored import GroupStats

    track_groups(groups, "clotho-test", stats=GroupStats(groups=5, dropped_same_scores=2))
    logged = read_offline_run(tmp_path)
    steps = logged["history"]
    assert [s["_step"] for s in steps] == [0, 1, 2]
    assert steps[0]["train/percent_correct"] == 0.5
    assert steps[0]["train/group_score/mean"] == 0.5
    assert logged["summary"]["groups/dropped_same_scores"] == 2
    (table,) = logged["tables"].values()
    assert len(table["data"]) == 12 and table["columns"][4] == "score"


def test_serve_logs_a_rolling_table(tmp_path: Path) -> None:
    groups = write_groups(tmp_path / "groups.jsonl", 12, group_size=2)
    tracker = GroupTracker(
        "clotho-test", name="serve", config={}, job_type="serve", directory=tmp_path
    )
    for line in groups.read_text().splitlines():
        tracker.log_group(json.loads(line))
    tracker.finish()
    logged = read_offline_run(tmp_path)
    assert len(logged["history"]) == 12
    assert len(logged["tables"]) == 2  # after 10 groups, and the rest at the end


def test_without_the_extra_the_message_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from clotho.errors import ConfigError
    from clotho.runs.tracking import require_wandb

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"pip install 'clotho-rl\[wandb\]'"):
        require_wandb()


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_clotho_eval_wandb_offline(make_task: Any, tmp_path: Path) -> None:
    make_task("one")
    make_task("two", category="text")
    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "clotho.cli.main",
            "eval",
            str(tmp_path / "tasks"),
            "--agent",
            "oracle",
            "--out",
            str(out),
            "--wandb",
            "clotho-eval-test",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    logged = read_offline_run(out)
    assert logged["project"] == "clotho-eval-test" and logged["config"]["agent"] == "oracle"
    assert len(logged["history"]) == 2 and logged["history"][-1]["eval/pass_rate"] == 1.0
    assert logged["summary"]["pass_rate"] == 1.0
    (table,) = logged["tables"].values()
    assert sorted(row[0] for row in table["data"]) == ["one", "two"]


def _outcome(messages: list[dict[str, Any]], errors: list[tuple[int, str, str]]) -> Any:
    from clotho.agent.result import AgentResult, ToolErrorRecord
    from clotho.rollout import RolloutOutcome

    result = AgentResult(
        messages=messages,
        tool_errors=[
            ToolErrorRecord(turn=turn, tool=tool, arguments="{}", error=error)
            for turn, tool, error in errors
        ],
    )
    return RolloutOutcome(reward=1.0, agent=result)


def _conversation(n: int, reasoning: str) -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{}"}}
    return [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": f"item {n}"},
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": reasoning},
        {"role": "tool", "tool_call_id": "c1", "content": "Error: unknown tool 'nope'"},
        {"role": "assistant", "content": f"answer {n}"},
    ]


async def test_groups_log_tool_errors_reasoning_and_the_rollouts_kept(tmp_path: Path) -> None:
    """Each group's step carries its rollouts' tool errors (found again by conversation),
    the table its reasoning and conversation, one rollout per group and the last three rows
    (the environment's num_rollouts_per_group_for_logging / num_rollouts_to_keep)."""
    from clotho.env.config import EnvConfig
    from clotho.env.scored import ScoredGroup
    from clotho.runs.tracking import ToolErrorLog

    config = EnvConfig(num_rollouts_per_group_for_logging=1, num_rollouts_to_keep=3)
    errors = ToolErrorLog()
    tracker = GroupTracker(
        "clotho-test",
        name="serve",
        config=config.model_dump(mode="json"),
        job_type="serve",
        directory=tmp_path,
        tool_errors=errors,
    )
    for g in range(4):
        conversations = [_conversation(10 * g + r, f"think {g}.{r}") for r in range(2)]
        for r, conversation in enumerate(conversations):  # as the environment's rollouts end
            failures = [(1, "nope", "Error: unknown tool 'nope'")] * (r + g % 2)
            await errors.observe(None, None, _outcome(conversation, failures))
        tracker.log_group(
            ScoredGroup(
                tokens=[[1], [2]], masks=[[1], [2]], scores=[1.0, 0.0], messages=conversations
            )
        )
    tracker.finish()
    logged = read_offline_run(tmp_path)
    steps = logged["history"]
    assert [s["train/tool_errors_count"] for s in steps] == [1, 3, 1, 3]
    assert steps[1]["train/tool_error_details"].splitlines() == [
        "rollout 0, turn 1, nope: Error: unknown tool 'nope'",
        "rollout 1, turn 1, nope: Error: unknown tool 'nope'",
        "rollout 1, turn 1, nope: Error: unknown tool 'nope'",
    ]
    assert logged["config"]["num_rollouts_to_keep"] == 3
    (table,) = logged["tables"].values()
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert [(r["group"], r["rollout"]) for r in rows] == [(1, 0), (2, 0), (3, 0)]
    assert [r["tool_errors"] for r in rows] == [1, 0, 1]
    assert rows[0]["reasoning"] == "think 1.0"
    conversation = rows[0]["conversation"]
    for block in (
        "[SYSTEM]\nbe brief",
        "[USER]\nitem 10",
        "[ASSISTANT thinking]\nthink 1.0",
        "[TOOL CALL] nope({})",
        "[TOOL RESULT]\nError: unknown tool 'nope'",
        "[ASSISTANT]\nanswer 10",
    ):
        assert block in conversation
    assert conversation.index("[ASSISTANT thinking]") < conversation.index("[TOOL CALL]")


def test_rollouts_kept_settings_are_checked() -> None:
    from clotho.errors import ConfigError

    with pytest.raises(ConfigError, match="num_rollouts_per_group_for_logging"):
        GroupTracker(
            "clotho-test",
            name="x",
            config={"num_rollouts_per_group_for_logging": -2},
            job_type="serve",
        )


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_generate_wandb_logs_tool_errors_and_reasoning(tmp_path: Path) -> None:
    """A real run (clotho generate, a sandbox, a scripted model: TEST DOUBLE for a hosted
    model) logged from its run directory: each step's tool errors and the reasoning."""
    from tests.scripted_openai import ScriptedOpenAIServer
    from tests.test_generate import REASONING, agent_model, write_prompts

    prompts = write_prompts(
        tmp_path / "prompts.jsonl",
        [
            {"id": "a", "prompt": "RUN: echo hi", "verify": "true"},
            {"id": "b", "prompt": "RUN: true"},
        ],
    )
    out = tmp_path / "run"
    with ScriptedOpenAIServer(default=agent_model()) as server:
        result = run_clotho(
            "generate", str(prompts), "--out", str(out),
            "--base-url", server.base_url, "--model", "m", "-n", "1",
            "--wandb", "clotho-generate-test",
            env={"HOME": str(tmp_path)},
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    logged = read_offline_run(out)
    steps = logged["history"]
    assert [s["trial/tool_errors_count"] for s in steps] == [1, 1]
    assert all("no_such_tool: Error: unknown tool" in s["trial/tool_error_details"] for s in steps)
    assert steps[-1]["eval/tool_errors"] == 2
    (table,) = logged["tables"].values()
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    assert sorted(r["task"] for r in rows) == ["a", "b"]
    assert all(r["reasoning"] == REASONING and r["tool_errors"] == 1 for r in rows)
    assert all(f"[ASSISTANT thinking]\n{REASONING}" in r["conversation"] for r in rows)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_process_wandb_logs_each_groups_tool_errors(tmp_path: Path) -> None:
    """`clotho process --wandb` end to end (an environment's real rollouts in sandboxes, a
    scripted model: TEST DOUBLE for a hosted model): the group's step carries the tool errors
    its rollouts made, the table one rollout of it (num_rollouts_per_group_for_logging=1)."""
    from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
    from tests.test_env import QWEN_DIR

    def model(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] != "tool":
            calls = [
                tool_call("no_such_tool", {}, id="c1"),
                tool_call("terminal", {"command": "true"}, id="c2"),
            ]
            return assistant("", calls, reasoning_content="first, a tool that is not there")
        return assistant("done")

    out = tmp_path / "groups.jsonl"
    with ScriptedOpenAIServer(default=model) as server:
        result = run_clotho(
            "process", "terminal_test", "--out", str(out),
            "--n-groups", "1", "--group-size", "2", "--model", "m",
            "--base-url", server.base_url, "--tokenizer", str(QWEN_DIR),
            "--set", "num_rollouts_per_group_for_logging=1", "--wandb", "clotho-process-test",
            env={"HOME": str(tmp_path)},
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    logged = read_offline_run(tmp_path)
    (step,) = logged["history"]
    assert step["train/tool_errors_count"] == 2
    assert step["train/tool_error_details"].splitlines() == [
        f"rollout {i}, turn 1, no_such_tool: Error: unknown tool 'no_such_tool'. "
        "Available tools: edit_file, read_file, search_files, terminal, write_file"
        for i in (0, 1)
    ]
    assert logged["config"]["num_rollouts_per_group_for_logging"] == 1
    (table,) = logged["tables"].values()
    (row,) = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert row["tool_errors"] == 1 and row["reasoning"] == "first, a tool that is not there"
    assert "[TOOL CALL] no_such_tool({})" in row["conversation"]


async def test_a_rollout_split_into_rows_counts_its_tool_errors_once(tmp_path: Path) -> None:
    """Rows with the same messages and other tokens are one rollout its chat template split
    (`Environment.score_group`); rows alike in both are two rollouts."""
    from clotho.env.scored import ScoredGroup
    from clotho.runs.tracking import ToolErrorLog

    errors = ToolErrorLog()
    conversation = _conversation(1, "hm")
    await errors.observe(None, None, _outcome(conversation, [(1, "nope", "Error: no")]))
    tracker = GroupTracker(
        "clotho-test", name="t", config={}, job_type="serve", directory=tmp_path, tool_errors=errors
    )
    for tokens in ([[1], [2]], [[1], [1]]):  # split, then two rollouts alike
        tracker.log_group(
            ScoredGroup(tokens=tokens, masks=tokens, scores=[1.0, 1.0], messages=[conversation] * 2)
        )
    tracker.finish()
    steps = read_offline_run(tmp_path)["history"]
    assert [s["train/tool_errors_count"] for s in steps] == [1, 2]
