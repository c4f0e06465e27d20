"""Experiment tracking with Weights & Biases (`--wandb PROJECT`, extra `wandb`).

What is logged, in the shape Atropos environments log it:

- the run's configuration (`config.json`, or the environment's config);
- per step (an attempt of `eval`/`evaluate`, a group of `process`/`serve`): pass rate and
  reward statistics so far, error counts by kind, the step's per-phase timings or scores;
- a table of rollouts: prompt, final answer, reward, tool calls (and task, errors, tokens);
- the summary: the run's final metrics, or the environment's group statistics.

`eval`, `evaluate` and `process` log from what they wrote (the run directory, the groups
file) once they end, so tracking never slows a run; `serve` writes no file and logs each
group as it is sent. `WANDB_MODE=offline` keeps everything on disk (`wandb sync` later).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

from clotho.errors import ConfigError
from clotho.runs import files
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import TrialRecord
from clotho.runs.store import RunStore

TABLE_TEXT_CUT = 2000
"""Characters of a prompt or answer kept in a table cell."""
SERVE_TABLE_EVERY = 10
"""`serve` logs its rollouts table every this many groups (the last ROLLOUTS_KEPT rows)."""
ROLLOUTS_KEPT = 256

ROLLOUT_COLUMNS = [
    "task",
    "attempt",
    "prompt",
    "final_answer",
    "reward",
    "passed",
    "error",
    "tool_calls",
    "turns",
]
GROUP_COLUMNS = [
    "group",
    "rollout",
    "prompt",
    "final_answer",
    "score",
    "tool_calls",
    "tokens",
    "trained_tokens",
]


def _wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ConfigError("--wandb needs Weights & Biases: pip install 'clotho-rl[wandb]'") from exc
    return wandb


def require_wandb() -> None:
    """Fail before a run starts, not after it ended, when the extra is missing."""
    _wandb()


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p if isinstance(p, str) else str(p.get("text", "")) for p in content)
    return json.dumps(content)


def _cut(text: str) -> str:
    return text if len(text) <= TABLE_TEXT_CUT else text[:TABLE_TEXT_CUT] + " …"


def conversation_cells(messages: list[dict[str, Any]]) -> tuple[str, str, int]:
    """(prompt: the first user message, final answer: the last assistant text, tool calls)."""
    prompt = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
    answers = [_text(m.get("content")) for m in messages if m.get("role") == "assistant"]
    final = next((a for a in reversed(answers) if a.strip()), "")
    calls = sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
    return _cut(prompt), _cut(final), calls


def _stats(values: list[float], prefix: str) -> dict[str, float]:
    if not values:
        return {}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return {
        f"{prefix}/mean": mean,
        f"{prefix}/std": std,
        f"{prefix}/min": min(values),
        f"{prefix}/max": max(values),
    }


class RunOptions(TypedDict):
    """The keyword options of a W&B run (`Tracker`, `GroupTracker`)."""

    name: str | None
    config: dict[str, Any]
    job_type: str
    directory: NotRequired[Path | None]


class Tracker:
    """One W&B run."""

    def __init__(self, project: str, **options: Unpack[RunOptions]) -> None:
        wandb = _wandb()
        self._wandb = wandb
        kwargs: dict[str, Any] = {}
        directory = options.get("directory")
        if directory is not None and not os.environ.get("WANDB_DIR"):
            directory.mkdir(parents=True, exist_ok=True)
            kwargs["dir"] = str(directory)
        self.run = wandb.init(
            project=project,
            name=options["name"],
            config=options["config"],
            job_type=options["job_type"],
            reinit="create_new",
            **kwargs,
        )

    def log(self, values: dict[str, Any], step: int) -> None:
        self.run.log(values, step=step)

    def table(self, key: str, columns: list[str], rows: Iterable[list[Any]], step: int) -> None:
        self.run.log({key: self._wandb.Table(columns=columns, data=list(rows))}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            self.run.summary[key] = value

    def finish(self) -> None:
        self.run.finish()


def _run_json(run_dir: Path, rel: str) -> dict[str, Any] | None:
    """A JSON object of the run folder, reached without links (`files.py`); None else."""
    try:
        value = json.loads(files.read_file(run_dir, rel))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def track_run(run_dir: Path, project: str, *, job_type: str = "eval") -> None:
    """Log a run directory (`clotho eval`, `clotho evaluate`): a step per attempt, in the
    order they finished, with the pass rate, reward statistics and error counts so far."""
    store = RunStore(run_dir)
    records = sorted(store.load_records(), key=lambda r: r.finished_at)
    config = _run_json(run_dir, "config.json") or {}
    tracker = Tracker(
        project, name=run_dir.name, config=config, job_type=job_type, directory=run_dir
    )
    try:
        _log_records(tracker, run_dir, records, attempts=int(config.get("attempts") or 1))
    finally:
        tracker.finish()


def _log_records(
    tracker: Tracker, run_dir: Path, records: list[TrialRecord], attempts: int
) -> None:
    latest: dict[tuple[str, int], TrialRecord] = {}
    errors: Counter[str] = Counter()
    rows = []
    for step, record in enumerate(records):
        old = latest.get(record.key)
        if old is not None and old.error is not None:
            errors[old.error.kind] -= 1
        latest[record.key] = record
        if record.error is not None:
            errors[record.error.kind] += 1
        scored = [r for r in latest.values() if r.scored]
        rewards = [r.reward for r in scored if r.reward is not None]
        values: dict[str, Any] = {
            "eval/pass_rate": sum(r.passed for r in scored) / len(scored) if scored else None,
            "eval/attempts": len(latest),
            "eval/scored": len(scored),
            **_stats(rewards, "eval/reward"),
            **{f"errors/{kind}": n for kind, n in errors.items()},
            "trial/reward": record.reward,
            "trial/passed": int(record.passed),
            "trial/turns": record.turns,
            "trial/tool_calls": record.tool_calls,
            **{f"timings/{k}": v for k, v in record.timings.model_dump().items()},
        }
        tracker.log({k: v for k, v in values.items() if v is not None}, step=step)
        prompt, answer, calls = "", "", record.tool_calls
        detail = _run_json(run_dir, record.detail) if record.detail else None
        if detail is not None:  # read as the viewer does: no link followed, no `..`
            messages = (detail.get("agent_result") or {}).get("messages") or []
            prompt, answer, calls = conversation_cells(messages)
        rows.append(
            [
                record.task,
                record.attempt,
                prompt,
                answer,
                record.reward,
                record.passed,
                record.error.kind if record.error else None,
                calls,
                record.turns,
            ]
        )
    step = max(len(records) - 1, 0)
    tracker.table("eval/rollouts", ROLLOUT_COLUMNS, rows, step=step)
    metrics = compute_metrics(records, attempts=attempts)
    summary: dict[str, Any] = {
        "pass_rate": metrics.pass_rate,
        "pass_rate_ci95_low": metrics.pass_rate_ci95[0] if metrics.pass_rate_ci95 else None,
        "pass_rate_ci95_high": metrics.pass_rate_ci95[1] if metrics.pass_rate_ci95 else None,
        "mean_reward": metrics.mean_reward,
        "n_tasks": metrics.n_tasks,
        "n_attempts": metrics.n_attempts,
        "n_passed": metrics.n_passed,
        **{f"errors/{k}": v for k, v in metrics.errors.items()},
        **{f"category/{k}/pass_rate": c.pass_rate for k, c in metrics.by_category.items()},
        **{f"pass@{k}": v for k, v in (metrics.pass_at_k or {}).items()},
        **{f"timings/{k}/p50_s": t.p50_s for k, t in metrics.timings.items()},
        **{f"timings/{k}/p95_s": t.p95_s for k, t in metrics.timings.items()},
    }
    tracker.summary({k: v for k, v in summary.items() if v is not None})


class GroupTracker:
    """Logs scored groups as they come (`serve`), or from a groups file (`process`)."""

    def __init__(self, project: str, **options: Unpack[RunOptions]) -> None:
        self.tracker = Tracker(project, **options)
        self.step = 0
        self.rows: list[list[Any]] = []
        self.scores: list[float] = []

    def log_group(self, group: Any) -> None:
        """One step: this group's scores and lengths, and the mean score so far."""
        data = group.model_dump() if hasattr(group, "model_dump") else dict(group)
        scores = [float(s) for s in data["scores"]]
        self.scores.extend(scores)
        masks = data.get("masks") or []
        tokens = [len(t) for t in data.get("tokens") or []]
        trained = [sum(1 for m in row if m != -100) for row in masks]
        values = {
            **_stats(scores, "train/group_score"),
            "train/percent_correct": sum(s > 0 for s in scores) / len(scores) if scores else 0.0,
            "train/mean_score_so_far": sum(self.scores) / len(self.scores),
            "train/group_size": len(scores),
            **_stats([float(t) for t in tokens], "train/tokens"),
            **_stats([float(t) for t in trained], "train/trained_tokens"),
        }
        self.tracker.log(values, step=self.step)
        conversations = data.get("messages") or [[] for _ in scores]
        for i, score in enumerate(scores):
            prompt, answer, calls = conversation_cells(
                conversations[i] if i < len(conversations) else []
            )
            self.rows.append(
                [
                    self.step,
                    i,
                    prompt,
                    answer,
                    score,
                    calls,
                    tokens[i] if i < len(tokens) else None,
                    trained[i] if i < len(trained) else None,
                ]
            )
        self.rows = self.rows[-ROLLOUTS_KEPT:]
        self.step += 1
        if self.step % SERVE_TABLE_EVERY == 0:
            self.tracker.table("train/rollouts", GROUP_COLUMNS, self.rows, step=self.step - 1)

    def finish(self, stats: Any = None) -> None:
        try:
            if self.rows and self.step % SERVE_TABLE_EVERY:
                self.tracker.table("train/rollouts", GROUP_COLUMNS, self.rows, step=self.step - 1)
            if stats is not None:
                dump = stats.model_dump() if hasattr(stats, "model_dump") else dict(stats)
                self.tracker.summary({f"groups/{k}": v for k, v in dump.items()})
        finally:
            self.tracker.finish()


def track_groups(
    groups_file: Path, project: str, *, stats: Any = None, name: str | None = None
) -> None:
    """Log a `clotho process` JSONL of scored groups: a step per group, then the stats
    (how many groups were dropped and why)."""
    tracker = GroupTracker(
        project,
        name=name or groups_file.stem,
        config={"groups_file": str(groups_file)},
        job_type="process",
        directory=groups_file.parent,
    )
    try:
        if groups_file.exists():
            for line in groups_file.read_text().splitlines():
                if line.strip():
                    tracker.log_group(json.loads(line))
    finally:
        tracker.finish(stats)
