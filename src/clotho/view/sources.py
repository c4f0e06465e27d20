"""What `clotho view` shows: run directories and scored-group files, read incrementally.

A run directory's `results.jsonl` grows while the run writes it: each source remembers the
byte offset it read up to and reads only what was appended since (a line still being
written waits for its newline). A file that shrank or was replaced (a resumed run rewrites
it when an attempt runs again) is read again from the start, under a new `version`, so a
client that paged through the old one knows to start over.

Files are opened as `runs/files.py` opens them: from the folder the user named, without
following links (a `trials/` linked elsewhere shows nothing) and regular files only (a FIFO
is refused, never waited on).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clotho.errors import UNSCORED_KINDS
from clotho.runs import files
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import RunMetrics, TrialRecord

try:  # the api/dev extras have it: 10,000 lines parse in a third of json's time
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

MESSAGE_CUT = 300
"""Characters of an error message kept in a table row (the trial view has all of it)."""


@dataclass
class _Tail:
    """Complete lines appended to a file (`rel` inside the folder `root`) since the last read."""

    root: Path
    rel: str
    offset: int = 0
    inode: tuple[int, int] | None = None
    version: int = 0

    def read(self) -> tuple[list[bytes], bool]:
        """(new complete lines, whether the file was replaced and everything is new)."""
        try:
            fd = files.open_regular(self.root, self.rel)
        except OSError:  # missing, a link, a FIFO: nothing to show
            reset = self.offset > 0
            if reset:
                self.offset, self.inode, self.version = 0, None, self.version + 1
            return [], reset
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            inode = (st.st_dev, st.st_ino)
            reset = False
            if (self.inode is not None and inode != self.inode) or st.st_size < self.offset:
                self.offset, reset, self.version = 0, True, self.version + 1
            self.inode = inode
            if st.st_size == self.offset:
                return [], reset
            f.seek(self.offset)
            data = f.read(st.st_size - self.offset)
        end = data.rfind(b"\n")
        if end < 0:
            return [], reset
        self.offset += end + 1
        return [line for line in data[:end].split(b"\n") if line.strip()], reset


COLUMNS = (
    "i",
    "task",
    "category",
    "attempt",
    "reward",
    "passed",
    "scored",
    "error",
    "message",
    "turns",
    "tool_calls",
    "tool_errors",
    "duration_s",
)
"""A table row's fields, in the order rows are sent (arrays, not objects: half the bytes)."""


def _number(value: Any) -> int | float | None:
    """`value` if it is a finite number, else None: a results file is data anyone may have
    written, and the page shows a number field as a number or not at all."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _row(index: int, r: dict[str, Any]) -> list[Any] | None:
    """A table row (what the run view sorts and filters on) from a results.jsonl line's
    JSON; None when the line is no trial record."""
    task, category = r.get("task"), r.get("category")
    if not isinstance(task, str) or not isinstance(category, str):
        return None
    error = r.get("error") if isinstance(r.get("error"), dict) else None
    kind = error.get("kind") if error else None
    kind = kind if isinstance(kind, str) else None
    message = error.get("message") if error else None
    return [
        index,
        task,
        category,
        _number(r.get("attempt", 0)),
        _number(r.get("reward")),
        r.get("passed") is True,
        kind not in UNSCORED_KINDS,
        kind,
        message[:MESSAGE_CUT] if isinstance(message, str) else None,
        _number(r.get("turns", 0)),
        _number(r.get("tool_calls", 0)),
        _number(r.get("tool_errors", 0)),
        _number(r.get("duration_s", 0.0)),
    ]


class Pieces:
    """Token ids as text pieces, with a `tokenizer.json` (each id decoded on its own, special
    tokens kept), so a sequence reads as text with its trained tokens marked."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        if path.suffix == ".gguf":  # the embedded model's own vocabulary
            from clotho.chat.gguf_tokenizer import gguf_tokenizer, read_gguf_vocab

            self.tokenizer = gguf_tokenizer(read_gguf_vocab(path))
            return
        file = path / "tokenizer.json" if path.is_dir() else path
        self.tokenizer = Tokenizer.from_file(str(file))

    def __call__(self, ids: list[int]) -> list[str]:
        return self.tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)


_PIECES: dict[str, Pieces | None] = {}
_PIECES_LOCK = threading.Lock()


def pieces_for(path: str | Path | None) -> Pieces | None:
    """The decoder of this tokenizer path, loaded once; None when there is none to load."""
    if not path:
        return None
    key = str(path)
    with _PIECES_LOCK:
        if key not in _PIECES:
            try:
                _PIECES[key] = Pieces(key)
            except Exception:  # not a tokenizers file: ids are shown as they are
                _PIECES[key] = None
        return _PIECES[key]


def _token_ids(ids: Any) -> bool:
    """Whether `ids` is a list of token ids (a file may hold anything there)."""
    return isinstance(ids, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    )


def add_pieces(sequences: list[dict[str, Any]], pieces: Pieces | None) -> None:
    if pieces is None:
        return
    for seq in sequences:
        ids = seq.get("tokens") if isinstance(seq, dict) else None
        if ids and _token_ids(ids) and "pieces" not in seq:
            seq["pieces"] = pieces(ids)


def tool_text(content: Any) -> str | None:
    """A tool message's content as the text it carries, when it is JSON-encoded: a JSON
    string decoded, or a tool's JSON object (`{"output": ..., "exit_code": ...}`, as the
    terminal tool and the oracle write it) as its output followed by its other fields, so
    newlines are real ones. None when the content is no such JSON (shown as it is)."""
    if not isinstance(content, str) or not content.lstrip().startswith(("{", '"')):
        return None
    try:
        value = json.loads(content)
    except ValueError:
        return None
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        return None
    parts: list[str] = []
    output = value.get("output")
    if isinstance(output, str):
        parts.append(output.rstrip("\n"))
    for key, field_value in value.items():
        if key == "output" and isinstance(output, str):
            continue
        if isinstance(field_value, str):
            shown = field_value if "\n" not in field_value else "\n" + field_value
        else:
            shown = json.dumps(field_value, ensure_ascii=False)
        parts.append(f"{key}: {shown}")
    return "\n".join(parts)


def add_tool_texts(messages: Any) -> None:
    """Each tool message whose content is JSON gets `content_text`, what the page shows
    (as text, escaped; the content itself stays as recorded)."""
    if not isinstance(messages, list):
        return
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "tool":
            shown = tool_text(message.get("content"))
            if shown is not None:
                message["content_text"] = shown


def _read_json(root: Path, rel: str) -> dict[str, Any] | None:
    """The JSON object in the regular file `rel` inside `root`; None for anything else."""
    try:
        value = json.loads(files.read_file(root, rel))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@dataclass
class RunSource:
    """One run directory (`clotho eval`, `clotho evaluate`)."""

    id: str
    path: Path
    kind: str = "run"
    tokenizer: str | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    _records: list[TrialRecord | None] = field(default_factory=list)
    _tail: _Tail | None = None
    _metrics: RunMetrics | None = None
    _summary: dict[str, Any] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _validating: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tail = _Tail(self.path, "results.jsonl")

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
                self.lines, self.rows, self._records = [], [], []
            if not lines and not reset:
                return
            for line in lines:
                try:
                    data = _loads(line)
                except ValueError:
                    continue  # a line cut short by a crash: skipped, as the run store does
                row = _row(len(self.lines), data) if isinstance(data, dict) else None
                if row is not None:
                    self.rows.append(row)
                    self.lines.append(data)
            self._metrics = self._summary = None

    @property
    def records(self) -> list[TrialRecord]:
        """The lines as validated records (on first use: the table needs only the rows)."""
        with self._validating:
            for data in self.lines[len(self._records) :]:
                try:
                    self._records.append(TrialRecord.model_validate(data))
                except ValidationError:
                    self._records.append(None)
            return [r for r in self._records if r is not None]

    def _record(self, index: int) -> TrialRecord | None:
        try:
            return TrialRecord.model_validate(self.lines[index])
        except ValidationError:
            return None

    def config(self) -> dict[str, Any]:
        return _read_json(self.path, "config.json") or {}

    def metrics(self) -> RunMetrics:
        """The run's metrics.json when it is at least as new as results.jsonl (a finished
        run), else computed from what is written so far (a run still going)."""
        with self._lock:
            if self._metrics is None:
                self._metrics = self._saved_metrics() or self._computed_metrics()
            return self._metrics

    def _saved_metrics(self) -> RunMetrics | None:
        if self._metrics_stale():
            return None
        try:
            saved = RunMetrics.model_validate_json(files.read_file(self.path, "metrics.json"))
        except (OSError, ValidationError):
            return None
        if saved.mean_reward_n is None:
            # Written before the mean reward counted scored failures as 0: read it again
            # from the records, so that it and the pass rate are over the same attempts.
            computed = self._computed_metrics()
            saved.mean_reward, saved.mean_reward_n = computed.mean_reward, computed.mean_reward_n
        return saved

    def _metrics_stale(self) -> bool:
        """metrics.json is missing or older than results.jsonl (a resumed run appends)."""
        try:
            saved = files.stat_file(self.path, "metrics.json")
            return saved.st_mtime < files.stat_file(self.path, "results.jsonl").st_mtime
        except OSError:
            return True

    def _status(self, done: dict[str, Any] | None) -> str:
        """ "running" (no metrics.json yet, or a resumed run writing after it), "stopped"
        (the run says it did not finish), else "finished" (also a run written before
        `complete` was recorded: it was read as finished then)."""
        if done is None:
            return "running"
        if done.get("complete") is False:
            return "running" if self._metrics_stale() else "stopped"
        return "finished"

    def _computed_metrics(self) -> RunMetrics:
        records = self.records
        attempts = int(self.config().get("attempts") or 1)
        attempts = max(attempts, max((r.attempt + 1 for r in records), default=1))
        return compute_metrics(records, attempts=attempts)

    def summary(self) -> dict[str, Any]:
        """One line of the runs view (kept until results.jsonl changes)."""
        self.refresh()
        if self._summary is None:
            self._summary = self._summarise()
        return self._summary

    def _summarise(self) -> dict[str, Any]:
        config = self.config()
        metrics = self.metrics()
        model = config.get("model") or {}
        ends = [_number(d.get("finished_at")) or 0.0 for d in self.lines]
        starts = [
            end - (_number(d.get("duration_s")) or 0.0)
            for end, d in zip(ends, self.lines, strict=True)
            if end
        ]
        ends = [end for end in ends if end]
        done = _read_json(self.path, "metrics.json")
        status = self._status(done)
        agent = self.lines[0].get("agent") if self.lines else None
        return {
            "id": self.id,
            "kind": self.kind,
            "name": self.path.name,
            "path": str(self.path),
            "date": min(starts) if starts else _mtime(self.path),
            "agent": config.get("agent") or agent,
            "model": model.get("model") if isinstance(model, dict) else None,
            "pass_rate": metrics.pass_rate,
            "ci95": metrics.pass_rate_ci95,
            "mean_reward": metrics.mean_reward,
            "n": metrics.n_attempts,
            "n_scored": metrics.n_scored,
            "n_passed": metrics.n_passed,
            "n_tasks": metrics.n_tasks,
            "errors": metrics.errors,
            "mean_reward_n": metrics.mean_reward_n,
            "wall_s": _number((done or {}).get("duration_s"))
            or (max(ends) - min(starts) if ends else None),
            "finished": status == "finished",
            "status": status,
            "n_planned": _number((done or {}).get("n_planned")),
            "n_finished": _number((done or {}).get("n_finished")),
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
                "columns": COLUMNS,
                "rows": self.rows[since:],
            }

    def detail(self, index: int) -> dict[str, Any] | None:
        """The trial's detail file (conversation, verifier, tokens), read on demand."""
        self.refresh()
        if not 0 <= index < len(self.lines):
            return None
        record = self._record(index)
        if record is None:
            return {"record": self.lines[index], "run": self.path.name}
        out: dict[str, Any] = {"record": record.model_dump(mode="json")}
        if record.detail and record.detail.startswith("trials/"):
            data = _read_json(self.path, record.detail)  # no link followed on the way
            if data is not None:
                data["record"] = out["record"]  # the line is what was finally recorded
                out = data
        out["run"] = self.path.name
        result = out.get("agent_result")
        result = result if isinstance(result, dict) else {}
        add_tool_texts(result.get("messages"))
        sequences = result.get("sequences") or []
        if isinstance(sequences, list) and sequences:
            add_pieces(sequences, pieces_for(self.tokenizer_path()))
        return out

    def tokenizer_path(self) -> str | None:
        """`--tokenizer`, else the run's own: its `model.tokenizer`, or the embedded model's
        GGUF file for a run on the embedded model (no `model`, or `api: local`)."""
        if self.tokenizer:
            return self.tokenizer
        model = self.config().get("model")
        if isinstance(model, dict) and model.get("tokenizer"):
            return str(model["tokenizer"])
        if model is None or (isinstance(model, dict) and model.get("api") == "local"):
            try:
                from clotho.chat.local_model import find_smollm2_gguf

                return str(find_smollm2_gguf())
            except Exception:  # the `local` extra is not installed
                return None
        return None


@dataclass
class GroupsSource:
    """A JSONL file of scored groups (`clotho process --out`), and its `.stats.json`."""

    id: str
    path: Path
    kind: str = "groups"
    tokenizer: str | None = None
    groups: list[dict[str, Any]] = field(default_factory=list)
    _tail: _Tail | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._tail = _Tail(self.path.parent, self.path.name)

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
                if _is_group(group):
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
            "stats": _read_json(self.path.parent, self.stats_path.name),
        }

    def group_rows(self) -> list[dict[str, Any]]:
        self.refresh()
        return [_group_row(i, g) for i, g in enumerate(self.groups)]

    def group(self, index: int) -> dict[str, Any] | None:
        self.refresh()
        if not 0 <= index < len(self.groups):
            return None
        group = {"index": index, **self.groups[index]}
        for messages in group.get("messages") or []:
            add_tool_texts(messages)
        pieces = pieces_for(self.tokenizer)
        if pieces is not None:
            group["pieces"] = [
                pieces(ids) if _token_ids(ids) else None for ids in _lists(group.get("tokens"))
            ]
        return group


def _is_group(group: Any) -> bool:
    """A scored group as far as the page needs: a list of numeric scores."""
    if not isinstance(group, dict) or not isinstance(group.get("scores"), list):
        return False
    return all(_number(score) is not None for score in group["scores"])


def _lists(value: Any) -> list[list[Any]]:
    """Per-rollout lists (tokens, masks), anything else as empty."""
    if not isinstance(value, list):
        return []
    return [row if isinstance(row, list) else [] for row in value]


def _group_row(index: int, group: dict[str, Any]) -> dict[str, Any]:
    scores = group["scores"]
    return {
        "i": index,
        "scores": scores,
        "mean": sum(scores) / len(scores) if scores else None,
        "tokens": [len(t) for t in _lists(group.get("tokens"))],
        "trained": [sum(1 for m in row if m != -100) for row in _lists(group.get("masks"))],
    }


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


Source = RunSource | GroupsSource


def discover(paths: list[Path], *, tokenizer: str | None = None) -> list[Source]:
    """Run directories and group files under the paths given, in order, each once.

    A folder with `results.jsonl` is a run; a folder without holds runs one level down (so
    `clotho view runs` shows every run in it); a `.jsonl` file is a file of scored groups.
    `tokenizer` (a tokenizer.json or its folder) shows token ids as text; a run whose config
    names its tokenizer uses that one otherwise.
    """
    found: list[Path] = []
    for named in paths:
        path = named.resolve()  # what the user named may be a link: their choice
        if path.is_file() or (path / "results.jsonl").exists() or (path / "config.json").exists():
            found.append(path)
        elif path.is_dir():
            for child in sorted(path.iterdir()):
                if child.is_symlink():  # a link in a listing leads where nobody named
                    continue
                if (child.is_dir() and os.path.lexists(child / "results.jsonl")) or (
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
        kind = GroupsSource if path.is_file() else RunSource
        sources.append(kind(sid, path, tokenizer=tokenizer))
    return sources
