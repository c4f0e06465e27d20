"""The run directory: results streamed line by line, metrics and config beside them.

Every file is reached through `files.py`: without following links, regular files only, the
folder made 0700 and its files 0600."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from pydantic import BaseModel, ValidationError

from clotho.errors import ConfigError
from clotho.runs import files
from clotho.runs.records import RunMetrics, TrialDetail, TrialRecord


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _write_json(root: Path, rel: str, model: BaseModel) -> None:
    files.write_file(root, rel, (model.model_dump_json(indent=2) + "\n").encode())


class RunStore:
    """Writes happen off the event loop (each record is fsync'ed), one at a time, in order."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.results_path = root / "results.jsonl"
        self.trials_dir = root / "trials"
        self._writing = asyncio.Lock()
        self._superseded: set[tuple[str, int]] = set()  # attempts whose old line goes

    def supersede(self, keys: set[tuple[str, int]]) -> None:
        """These attempts run again: their new line replaces the old one, not beside it."""
        self._superseded |= keys

    def prepare(self, resume: bool) -> None:
        if os.path.lexists(self.results_path) and not resume:
            raise ConfigError(
                f"{self.root} already holds a run; pass --resume to continue it or choose another --out"
            )
        try:
            files.make_run_dir(self.root)
            for name in ("results.jsonl", "config.json", "metrics.json"):
                if os.path.lexists(self.root / name):
                    files.stat_file(self.root, name)  # a link or a FIFO: refused here
        except OSError as exc:
            raise ConfigError(
                f"{self.root}: cannot use it as a run folder ({exc}); its files must be "
                "regular files and trials/ a folder, not links"
            ) from exc

    def load_records(self) -> list[TrialRecord]:
        """Records written so far; a line cut short by a crash is skipped, not fatal."""
        try:
            text = files.read_file(self.root, "results.jsonl").decode(errors="replace")
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ConfigError(f"{self.results_path}: cannot read it: {exc}") from exc
        records = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                records.append(TrialRecord.model_validate_json(line))
            except ValidationError:
                continue
        return records

    async def append(self, record: TrialRecord, detail: TrialDetail, *, suffix: str = "") -> None:
        """The trial's detail file, then its line in results.jsonl, flushed to disk (replacing
        the attempt's earlier line when it was superseded). `suffix` names the detail file of
        a try that is retried, so the retry's own file does not overwrite it."""
        name = f"{_safe(record.task)}__{record.attempt}{suffix}.json"
        record.detail = f"trials/{name}"
        detail.record = record
        async with self._writing:
            await asyncio.to_thread(self._write, f"trials/{name}", detail, record)

    def _write(self, detail_rel: str, detail: TrialDetail, record: TrialRecord) -> None:
        _write_json(self.root, detail_rel, detail)
        if record.key in self._superseded:
            self._superseded.discard(record.key)
            self._replace_line(record)
            return
        files.append_line(self.root, "results.jsonl", (record.model_dump_json() + "\n").encode())

    def _replace_line(self, record: TrialRecord) -> None:
        """Rewrite results.jsonl without the attempt's earlier lines, then with its new one."""
        kept = [r for r in self.load_records() if r.key != record.key]
        text = "".join(r.model_dump_json() + "\n" for r in [*kept, record])
        files.write_file(self.root, "results.jsonl", text.encode())

    def write_config(self, config: BaseModel) -> None:
        files.make_run_dir(self.root)
        _write_json(self.root, "config.json", config)

    def write_metrics(self, metrics: RunMetrics) -> None:
        _write_json(self.root, "metrics.json", metrics)
