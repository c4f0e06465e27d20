"""What a `clotho generate` run produced, per run: tool calls and tool errors per tool,
reasoning (how many turns carried it, how long it was), turns, stop reasons, errors by kind,
and the mean reward of the prompts that had a verify command. Computed from the run
directory (one `TrialDetail` per prompt), with `trajectories.jsonl` written in the same pass.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from clotho.runs import files
from clotho.runs.records import TrialDetail, TrialRecord

TRAJECTORIES = "trajectories.jsonl"
STATS = "generate_stats.json"


class ToolStats(BaseModel):
    calls: int = 0
    errors: int = 0


class GenerateStats(BaseModel):
    """`generate_stats.json`."""

    schema_version: int = 1
    complete: bool = Field(description="every prompt of the file has a result")
    prompts: int = Field(description="prompts in the file")
    finished: int = Field(description="of them, with a result in the run directory")
    errors: dict[str, int] = Field(default_factory=dict, description="error kind -> prompts")
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    turns: int = 0
    turns_mean: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    tools: dict[str, ToolStats] = Field(default_factory=dict, description="per tool name")
    reasoning_turns: int = Field(0, description="model turns that carried reasoning")
    reasoning_chars: int = Field(0, description="characters of reasoning, all turns")
    reasoning_chars_mean: float | None = Field(None, description="per turn that carried reasoning")
    prompts_with_reasoning: int = 0
    verified: int = Field(0, description="prompts with a verify command and a result")
    verified_scored: int = Field(
        0, description="of them, scored: a reward, or a failure of the agent's (counts as 0)"
    )
    passed: int = 0
    mean_reward: float | None = Field(
        None, description="over the verified, scored prompts (a failure of the agent's is 0)"
    )


def _detail(out_dir: Path, record: TrialRecord) -> TrialDetail:
    """The prompt's trial file, read as the viewer and the export read one (no link
    followed, nothing outside trials/); the record alone when it cannot be read."""
    if (
        record.detail is not None
        and record.detail.startswith("trials/")
        and ".." not in record.detail
    ):
        try:
            detail = TrialDetail.model_validate_json(files.read_file(out_dir, record.detail))
            detail.record = record
            return detail
        except (OSError, ValidationError):
            pass
    return TrialDetail(record=record)


def _tool_names(messages: Iterable[dict[str, Any]]) -> Counter[str]:
    names: Counter[str] = Counter()
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            names[str(name) if name else "?"] += 1
    return names


def compute_stats(details: list[TrialDetail], prompts: int, *, complete: bool) -> GenerateStats:
    finished = sum(
        1 for d in details if d.record.error is None or not d.record.error.retried
    )  # an infra error's prompt runs again on --resume
    stats = GenerateStats(complete=complete, prompts=prompts, finished=finished)
    errors: Counter[str] = Counter()
    stops: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    rewards: list[float] = []
    for detail in details:
        record, result = detail.record, detail.agent_result
        if record.error is not None:
            errors[record.error.kind] += 1
        if record.stop_reason:
            stops[record.stop_reason] += 1
        stats.turns += record.turns
        if result is not None:
            calls += _tool_names(result.messages)
            failures.update(e.tool or "?" for e in result.tool_errors)
            shown = [r for r in result.reasoning if r]
            stats.reasoning_turns += len(shown)
            stats.reasoning_chars += sum(len(r) for r in shown)
            stats.prompts_with_reasoning += bool(shown)
        if record.category == "verified":
            stats.verified += 1
            if record.score is not None:
                stats.verified_scored += 1
                stats.passed += record.passed
                rewards.append(record.score)
    stats.errors = dict(sorted(errors.items()))
    stats.stop_reasons = dict(sorted(stops.items()))
    stats.tool_calls = sum(calls.values())
    stats.tool_errors = sum(failures.values())
    stats.tools = {
        name: ToolStats(calls=calls[name], errors=failures[name])
        for name in sorted(set(calls) | set(failures))
    }
    if details:
        stats.turns_mean = stats.turns / len(details)
    if stats.reasoning_turns:
        stats.reasoning_chars_mean = stats.reasoning_chars / stats.reasoning_turns
    if rewards:
        stats.mean_reward = sum(rewards) / len(rewards)
    return stats


def _write_atomic(out_dir: Path, name: str, lines: Iterable[str]) -> None:
    """Replace `name` whole (a reader never sees half a file; no link followed)."""
    files.write_file(out_dir, name, "".join(lines).encode())


def write_outputs(
    out_dir: Path, records: list[TrialRecord], ids: list[str], *, complete: bool
) -> GenerateStats:
    """trajectories.jsonl (one `TrialDetail` a line, in the prompts file's order) and
    generate_stats.json. Blocking: call it in a thread."""
    order = {name: n for n, name in enumerate(ids)}
    records = sorted(records, key=lambda r: order.get(r.task, len(order)))
    details = [_detail(out_dir, r) for r in records]
    _write_atomic(out_dir, TRAJECTORIES, (d.model_dump_json() + "\n" for d in details))
    stats = compute_stats(details, len(ids), complete=complete)
    _write_atomic(out_dir, STATS, [stats.model_dump_json(indent=2) + "\n"])
    return stats


def load_stats(out_dir: Path) -> GenerateStats:
    return GenerateStats.model_validate(json.loads(files.read_file(out_dir, STATS)))
