"""Experiment tracking with Weights & Biases (`--wandb PROJECT`, extra `wandb`).

What is logged, in the shape Atropos environments log it:

- the run's configuration (`config.json`, or the environment's config);
- per step (an attempt of `eval`/`evaluate`, a group of `process`/`serve`): pass rate and
  reward statistics so far, error counts by kind, the step's per-phase timings or scores;
- per step, the tool errors: `train/tool_errors_count` and `train/tool_error_details` (the
  seed's names; `trial/...` for an eval attempt), each error's turn, tool and message;
- a table of rollouts: prompt, final answer, reward, tool calls, tool errors, the reasoning
  and the whole conversation as `[SYSTEM]`/`[USER]`/`[ASSISTANT thinking]`/`[ASSISTANT]`/
  `[TOOL CALL]`/`[TOOL RESULT]` blocks (and task, errors, tokens); for groups, how many
  rollouts of each group it keeps (`num_rollouts_per_group_for_logging`, -1: all) and how
  many in all (`num_rollouts_to_keep`), Atropos' settings of the same names;
- the summary: the run's final metrics, or the environment's group statistics.

`eval`, `evaluate` and `process` log from what they wrote (the run directory, the groups
file) once they end, so tracking never slows a run; `serve` writes no file and logs each
group as it is sent. `WANDB_MODE=offline` keeps everything on disk (`wandb sync` later).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter, OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NotRequired, TypedDict, Unpack

from clotho.errors import ConfigError
from clotho.runs import files
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import TrialRecord
from clotho.runs.store import RunStore

TABLE_TEXT_CUT = 2000
"""Characters of a prompt, answer or reasoning kept in a table cell."""
CONVERSATION_CUT = 16000
"""Characters of a whole conversation kept in a table cell (its head and its end)."""
DETAILS_CUT = 4000
"""Characters of a step's tool error details."""
SERVE_TABLE_EVERY = 10
"""`serve` logs its rollouts table every this many groups (the last ROLLOUTS_KEPT rows)."""
ROLLOUTS_KEPT = 256
"""Rows of the groups' rollouts table, by default (`num_rollouts_to_keep`)."""
ROLLOUTS_PER_GROUP = -1
"""Rollouts of each group in the table, by default: all (`num_rollouts_per_group_for_logging`)."""

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
    "tool_errors",
    "reasoning",
    "conversation",
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
    "tool_errors",
    "reasoning",
    "conversation",
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


def reasoning_text(messages: list[dict[str, Any]]) -> str:
    """The model's reasoning, turn by turn (`reasoning_content` of its turns)."""
    parts = [
        _text(m.get("reasoning_content") or m.get("reasoning"))
        for m in messages
        if m.get("role") == "assistant" and (m.get("reasoning_content") or m.get("reasoning"))
    ]
    return _cut("\n---\n".join(parts))


def transcript(messages: list[dict[str, Any]]) -> str:
    """The conversation as the seed's rollouts table shows it: `[SYSTEM]`, `[USER]`,
    `[ASSISTANT thinking]`, `[ASSISTANT]`, `[TOOL CALL] name(arguments)`, `[TOOL RESULT]`
    blocks; a long one keeps its head and its end."""
    blocks: list[str] = []
    for message in messages:
        role = str(message.get("role") or "?")
        if role == "assistant":
            thinking = message.get("reasoning_content") or message.get("reasoning")
            if thinking:
                blocks.append(f"[ASSISTANT thinking]\n{_text(thinking)}")
            content = _text(message.get("content"))
            if content.strip():
                blocks.append(f"[ASSISTANT]\n{content}")
            for call in message.get("tool_calls") or []:
                function = (call.get("function") if isinstance(call, dict) else None) or {}
                arguments = function.get("arguments")
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments)
                blocks.append(f"[TOOL CALL] {function.get('name')}({arguments})")
        elif role == "tool":
            blocks.append(f"[TOOL RESULT]\n{_text(message.get('content'))}")
        else:
            blocks.append(f"[{role.upper()}]\n{_text(message.get('content'))}")
    text = "\n\n".join(blocks)
    if len(text) <= CONVERSATION_CUT:
        return text
    half = CONVERSATION_CUT // 2
    return text[:half] + f"\n\n[... {len(text) - 2 * half} characters ...]\n\n" + text[-half:]


def tool_error_details(errors: Iterable[dict[str, Any]], prefix: str = "") -> list[str]:
    """One line per tool error: `turn N, TOOL: what the model was told`."""
    lines = []
    for error in errors:
        message = " ".join(str(error.get("error", "")).split())[:300]
        lines.append(f"{prefix}turn {error.get('turn')}, {error.get('tool')}: {message}")
    return lines


def _details(lines: list[str]) -> str:
    text = "\n".join(lines)
    return text if len(text) <= DETAILS_CUT else text[:DETAILS_CUT] + " …"


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
    tool_errors_total = 0
    for step, record in enumerate(records):
        prompt, answer, calls = "", "", record.tool_calls
        reasoning = conversation = ""
        failures: list[dict[str, Any]] = []
        detail = _run_json(run_dir, record.detail) if record.detail else None
        if detail is not None:  # read as the viewer does: no link followed, no `..`
            result = detail.get("agent_result") or {}
            messages = result.get("messages") or []
            prompt, answer, calls = conversation_cells(messages)
            reasoning, conversation = reasoning_text(messages), transcript(messages)
            failures = [e for e in result.get("tool_errors") or [] if isinstance(e, dict)]
        tool_errors_total += record.tool_errors
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
            "trial/tool_errors_count": record.tool_errors,
            "trial/tool_error_details": _details(tool_error_details(failures)),
            "eval/tool_errors": tool_errors_total,
            **{f"timings/{k}": v for k, v in record.timings.model_dump().items()},
        }
        tracker.log({k: v for k, v in values.items() if v is not None}, step=step)
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
                record.tool_errors,
                reasoning,
                conversation,
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


def _fingerprint(messages: Any) -> str:
    """A conversation's identity across copies (a group holds copies of its rollouts')."""
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class ToolErrorLog:
    """The tool errors of an environment's rollouts, found again by their conversation: a
    scored group carries the rollouts' messages but not their errors (the trainer's wire
    format has no place for them). `attach` it to the environment before the groups run;
    a group's rows are then matched to the rollouts they came from. Rollouts whose group was
    dropped are forgotten oldest first, past `kept`."""

    def __init__(self, kept: int = 4096) -> None:
        self.kept = kept
        self._errors: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def attach(self, environment: Any) -> ToolErrorLog:
        environment.on_rollout(self.observe)
        return self

    async def observe(self, item: Any, tools: Any, outcome: Any) -> None:
        result = getattr(outcome, "agent", None)
        if result is None:
            return
        errors = [e.model_dump() for e in result.tool_errors]
        self._errors[_fingerprint(result.messages)] = errors
        while len(self._errors) > self.kept:
            self._errors.popitem(last=False)

    def of(self, messages: Any) -> list[dict[str, Any]] | None:
        """The tool errors of the rollout with these messages; None when it is not known."""
        return self._errors.get(_fingerprint(messages))


def _rollouts_option(config: dict[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be a whole number, not {value!r}")
    return value


class GroupTracker:
    """Logs scored groups as they come (`serve`), or from a groups file (`process`).

    The rollouts table keeps `num_rollouts_per_group_for_logging` rollouts of each group
    (-1: all) and the last `num_rollouts_to_keep` rows in all, read from the run's config
    (Atropos' settings of the same names). With a `ToolErrorLog` attached to the
    environment, each step logs its rollouts' tool errors."""

    def __init__(
        self,
        project: str,
        *,
        tool_errors: ToolErrorLog | None = None,
        **options: Unpack[RunOptions],
    ) -> None:
        config = options["config"]
        self.per_group = _rollouts_option(
            config, "num_rollouts_per_group_for_logging", ROLLOUTS_PER_GROUP
        )
        self.kept = _rollouts_option(config, "num_rollouts_to_keep", ROLLOUTS_KEPT)
        if self.per_group < -1 or self.kept < 0:
            raise ConfigError(
                "num_rollouts_per_group_for_logging is -1 (all) or more, num_rollouts_to_keep "
                "0 or more"
            )
        self.tool_errors = tool_errors
        self.tracker = Tracker(project, **options)
        self.step = 0
        self.rows: list[list[Any]] = []
        self.scores: list[float] = []

    def log_group(self, group: Any) -> None:
        """One step: this group's scores and lengths, its tool errors, and the mean score so
        far."""
        data = group.model_dump() if hasattr(group, "model_dump") else dict(group)
        scores = [float(s) for s in data["scores"]]
        self.scores.extend(scores)
        masks = data.get("masks") or []
        tokens = [len(t) for t in data.get("tokens") or []]
        trained = [sum(1 for m in row if m != -100) for row in masks]
        conversations = data.get("messages") or [[] for _ in scores]
        failures: list[list[dict[str, Any]] | None] = []
        for i in range(len(scores)):
            conversation = conversations[i] if i < len(conversations) else []
            known = self.tool_errors.of(conversation) if self.tool_errors and conversation else None
            # a rollout its template split into several rows (the same messages, other
            # tokens: as the SFT export reads them) counts once; two rollouts alike count twice
            rows = data.get("tokens") or []
            repeat = (
                0 < i < len(rows)
                and conversation
                and conversation == conversations[i - 1]
                and rows[i] != rows[i - 1]
            )
            failures.append([] if repeat and known is not None else known)
        values: dict[str, Any] = {
            **_stats(scores, "train/group_score"),
            "train/percent_correct": sum(s > 0 for s in scores) / len(scores) if scores else 0.0,
            "train/mean_score_so_far": sum(self.scores) / len(self.scores),
            "train/group_size": len(scores),
            **_stats([float(t) for t in tokens], "train/tokens"),
            **_stats([float(t) for t in trained], "train/trained_tokens"),
        }
        if self.tool_errors is not None:
            found = [(i, f) for i, f in enumerate(failures) if f is not None]
            values["train/tool_errors_count"] = sum(len(f) for _, f in found)
            values["train/tool_error_details"] = _details(
                [line for i, f in found for line in tool_error_details(f, f"rollout {i}, ")]
            )
        self.tracker.log(values, step=self.step)
        shown = len(scores) if self.per_group == -1 else min(self.per_group, len(scores))
        for i, score in enumerate(scores[:shown]):
            conversation = conversations[i] if i < len(conversations) else []
            prompt, answer, calls = conversation_cells(conversation)
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
                    len(failures[i]) if failures[i] is not None else None,
                    reasoning_text(conversation),
                    transcript(conversation),
                ]
            )
        self.rows = self.rows[-self.kept :] if self.kept else []
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
    groups_file: Path,
    project: str,
    *,
    stats: Any = None,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    tool_errors: ToolErrorLog | None = None,
) -> None:
    """Log a `clotho process` JSONL of scored groups: a step per group (with its tool errors
    when `tool_errors` watched the run), then the stats (how many groups were dropped and
    why). `config` is the environment's (its table settings are read from it)."""
    tracker = GroupTracker(
        project,
        name=name or groups_file.stem,
        config={**(config or {}), "groups_file": str(groups_file)},
        job_type="process",
        directory=groups_file.parent,
        tool_errors=tool_errors,
    )
    try:
        if groups_file.exists():
            for line in groups_file.read_text().splitlines():
                if line.strip():
                    tracker.log_group(json.loads(line))
    finally:
        tracker.finish(stats)
