"""What `clotho view` shows: run directories and scored-group files, read incrementally.

A run directory's `results.jsonl` grows while the run writes it: each source remembers the
byte offset it read up to and reads only what was appended since (a line still being
written waits for its newline). A file that shrank or was replaced (a resumed run rewrites
it when an attempt runs again) is read again from the start, under a new `version`, so a
client that paged through the old one knows to start over.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clotho.runs.metrics import compute_metrics, latest
from clotho.runs.records import RunMetrics, TrialRecord

MESSAGE_CUT = 300
"""Characters of an error message kept in a table row (the trial view has all of it)."""


@dataclass
class _Tail:
    """Complete lines appended to a file since the last read."""

    path: Path
    offset: int = 0
    inode: tuple[int, int] | None = None
    version: int = 0

    def read(self) -> tuple[list[bytes], bool]:
        """(new complete lines, whether the file was replaced and everything is new)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            reset = self.offset > 0
            if reset:
                self.offset, self.inode, self.version = 0, None, self.version + 1
            return [], reset
        inode = (st.st_dev, st.st_ino)
        reset = False
        if (self.inode is not None and inode != self.inode) or st.st_size < self.offset:
            self.offset, reset, self.version = 0, True, self.version + 1
        self.inode = inode
        if st.st_size == self.offset:
            return [], reset
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            return [], reset
        self.offset += end + 1
        return [line for line in data[:end].split(b"\n") if line.strip()], reset


def _row(index: int, r: TrialRecord) -> dict[str, Any]:
    """A table row: what the run view sorts and filters on, nothing more."""
    return {
        "i": index,
        "task": r.task,
        "category": r.category,
        "attempt": r.attempt,
        "reward": r.reward,
        "passed": r.passed,
        "scored": r.scored,
        "error": r.error.kind if r.error else None,
        "message": r.error.message[:MESSAGE_CUT] if r.error else None,
        "turns": r.turns,
        "tool_calls": r.tool_calls,
        "tool_errors": r.tool_errors,
        "duration_s": r.duration_s,
        "stop": r.stop_reason,
        "finished_at": r.finished_at,
    }


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunSource:
    """One run directory (`clotho eval`, `clotho evaluate`)."""

    id: str
    path: Path
    kind: str = "run"
    records: list[TrialRecord] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    _tail: _Tail | None = None
    _metrics: RunMetrics | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tail = _Tail(self.path / "results.jsonl")

    @property
    def version(self) -> int:
        assert self._tail is not None
        return self._tail.version

    def refresh(self) -> None:
        """Read what was appended to results.jsonl since the last call."""
        assert self._tail is not None
        with self._lock:
            lines, reset = self._tail.read()
            if reset:
                self.records, self.rows = [], []
            if not lines and not reset:
                return
            for line in lines:
                try:
                    record = TrialRecord.model_validate_json(line)
                except ValidationError:
                    continue  # a line cut short by a crash: skipped, as the run store does
                self.rows.append(_row(len(self.records), record))
                self.records.append(record)
            self._metrics = None

    def config(self) -> dict[str, Any]:
        return _read_json(self.path / "config.json") or {}

    def metrics(self) -> RunMetrics:
        """Metrics of what is written so far (a run still going has no metrics.json yet)."""
        with self._lock:
            if self._metrics is None:
                attempts = int(self.config().get("attempts") or 1)
                attempts = max(attempts, max((r.attempt + 1 for r in self.records), default=1))
                self._metrics = compute_metrics(self.records, attempts=attempts)
            return self._metrics

    def summary(self) -> dict[str, Any]:
        """One line of the runs view."""
        self.refresh()
        config = self.config()
        metrics = self.metrics()
        model = config.get("model") or {}
        final = list(latest(self.records).values())
        starts = [r.finished_at - r.duration_s for r in final if r.finished_at]
        ends = [r.finished_at for r in final if r.finished_at]
        done = _read_json(self.path / "metrics.json")
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.path.name,
            "path": str(self.path),
            "date": min(starts) if starts else _mtime(self.path),
            "agent": config.get("agent") or (final[0].agent if final else None),
            "model": model.get("model") if isinstance(model, dict) else None,
            "pass_rate": metrics.pass_rate,
            "ci95": metrics.pass_rate_ci95,
            "mean_reward": metrics.mean_reward,
            "n": metrics.n_attempts,
            "n_scored": metrics.n_scored,
            "n_passed": metrics.n_passed,
            "n_tasks": metrics.n_tasks,
            "errors": metrics.errors,
            "wall_s": (done or {}).get("duration_s") or (max(ends) - min(starts) if ends else None),
            "finished": done is not None,
            "version": self.version,
        }

    def overview(self) -> dict[str, Any]:
        """The run view's header: summary, metrics (per category, pass@k, timings), config."""
        return {
            "summary": self.summary(),
            "metrics": self.metrics().model_dump(mode="json"),
            "config": self.config(),
        }

    def trials(self, since: int = 0, version: int | None = None) -> dict[str, Any]:
        """Rows from `since` on; all of them again when the file was replaced meanwhile."""
        self.refresh()
        with self._lock:
            if version is not None and version != self.version:
                since = 0
            return {
                "version": self.version,
                "since": since,
                "total": len(self.rows),
                "rows": self.rows[since:],
            }

    def detail(self, index: int) -> dict[str, Any] | None:
        """The trial's detail file (conversation, verifier, tokens), read on demand."""
        self.refresh()
        if not 0 <= index < len(self.records):
            return None
        record = self.records[index]
        out: dict[str, Any] = {"record": record.model_dump(mode="json")}
        if record.detail:
            trials = (self.path / "trials").resolve()
            path = (self.path / record.detail).resolve()
            if path.is_relative_to(trials) and path.is_file():
                data = _read_json(path)
                if data is not None:
                    data["record"] = out["record"]  # the line is what was finally recorded
                    out = data
        return out


@dataclass
class GroupsSource:
    """A JSONL file of scored groups (`clotho process --out`), and its `.stats.json`."""

    id: str
    path: Path
    kind: str = "groups"
    groups: list[dict[str, Any]] = field(default_factory=list)
    _tail: _Tail | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tail = _Tail(self.path)

    @property
    def stats_path(self) -> Path:
        return self.path.with_suffix(".stats.json")

    def refresh(self) -> None:
        assert self._tail is not None
        with self._lock:
            lines, reset = self._tail.read()
            if reset:
                self.groups = []
            for line in lines:
                try:
                    group = json.loads(line)
                except ValueError:
                    continue
                if isinstance(group, dict) and isinstance(group.get("scores"), list):
                    self.groups.append(group)

    def summary(self) -> dict[str, Any]:
        self.refresh()
        scores = [s for g in self.groups for s in g["scores"]]
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.path.name,
            "path": str(self.path),
            "date": _mtime(self.path),
            "n_groups": len(self.groups),
            "n": len(scores),
            "mean_score": sum(scores) / len(scores) if scores else None,
            "stats": _read_json(self.stats_path),
        }

    def group_rows(self) -> list[dict[str, Any]]:
        self.refresh()
        return [_group_row(i, g) for i, g in enumerate(self.groups)]

    def group(self, index: int) -> dict[str, Any] | None:
        self.refresh()
        if not 0 <= index < len(self.groups):
            return None
        return {"index": index, **self.groups[index]}


def _group_row(index: int, group: dict[str, Any]) -> dict[str, Any]:
    scores = group["scores"]
    masks = group.get("masks") or []
    return {
        "i": index,
        "scores": scores,
        "mean": sum(scores) / len(scores) if scores else None,
        "tokens": [len(t) for t in group.get("tokens") or []],
        "trained": [sum(1 for m in row if m != -100) for row in masks],
    }


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


Source = RunSource | GroupsSource


def discover(paths: list[Path]) -> list[Source]:
    """Run directories and group files under the paths given, in order, each once.

    A folder with `results.jsonl` is a run; a folder without holds runs one level down (so
    `clotho view runs` shows every run in it); a `.jsonl` file is a file of scored groups.
    """
    found: list[Path] = []
    for path in paths:
        if path.is_file() or (path / "results.jsonl").exists() or (path / "config.json").exists():
            found.append(path)
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if (child.is_dir() and (child / "results.jsonl").exists()) or (
                    child.suffix == ".jsonl" and child.is_file()
                ):
                    found.append(child)
    sources: list[Source] = []
    seen: set[Path] = set()
    for path in found:
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        sid = str(len(sources))
        sources.append(GroupsSource(sid, path) if path.is_file() else RunSource(sid, path))
    return sources
