"""The run directory: results streamed line by line, metrics and config beside them."""

from __future__ import annotations

import json
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
    def __init__(self, root: Path) -> None:
        self.root = root
        self.results_path = root / "results.jsonl"
        self.trials_dir = root / "trials"

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

    def append(self, record: TrialRecord, detail: TrialDetail) -> None:
        name = f"{_safe(record.task)}__{record.attempt}.json"
        record.detail = f"trials/{name}"
        detail.record = record
        _write_json(self.trials_dir / name, detail)
        with self.results_path.open("a") as f:
            f.write(record.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_config(self, config: BaseModel) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _write_json(self.root / "config.json", config)

    def write_metrics(self, metrics: RunMetrics) -> None:
        _write_json(self.root / "metrics.json", metrics)

    def write_task_errors(self, errors: list[str]) -> None:
        (self.root / "task_errors.json").write_text(json.dumps(errors, indent=2) + "\n")
