"""The run directory: results streamed line by line, metrics and config beside them."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from pydantic import BaseModel, ValidationError

from clotho.errors import ConfigError
from clotho.runs.records import RunMetrics, TrialDetail, TrialRecord


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _write_json(path: Path, model: BaseModel) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(model.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


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
        if self.results_path.exists() and not resume:
            raise ConfigError(
                f"{self.root} already holds a run; pass --resume to continue it or choose another --out"
            )
        self.trials_dir.mkdir(parents=True, exist_ok=True)

    def load_records(self) -> list[TrialRecord]:
        """Records written so far; a line cut short by a crash is skipped, not fatal."""
        if not self.results_path.exists():
            return []
        records = []
        for line in self.results_path.read_text().splitlines():
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
            await asyncio.to_thread(self._write, self.trials_dir / name, detail, record)

    def _write(self, detail_path: Path, detail: TrialDetail, record: TrialRecord) -> None:
        _write_json(detail_path, detail)
        if record.key in self._superseded:
            self._superseded.discard(record.key)
            self._replace_line(record)
            return
        with self.results_path.open("a") as f:
            f.write(record.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _replace_line(self, record: TrialRecord) -> None:
        """Rewrite results.jsonl without the attempt's earlier lines, then with its new one."""
        kept = [r for r in self.load_records() if r.key != record.key]
        tmp = self.results_path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            f.writelines(r.model_dump_json() + "\n" for r in [*kept, record])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.results_path)

    def write_config(self, config: BaseModel) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _write_json(self.root / "config.json", config)

    def write_metrics(self, metrics: RunMetrics) -> None:
        _write_json(self.root / "metrics.json", metrics)
