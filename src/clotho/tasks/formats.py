"""The task formats discovery reads, each registered once: a format says which files and
which dataset records are its own, and turns them into tasks.

Harbor task folders (and folders of them, and Terminal-Bench rows files) are the default
for a path no format claims (`harbor.discover_tasks`); Terminal-Bench 2.0 rows of a dataset
register here (`ROWS`); SWE-bench / SWE-smith records register in `swe/format.py` (loaded
with `clotho.swe`), so `tasks/` never imports a format above it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clotho.data import DatasetSource, Record
from clotho.errors import TaskError
from clotho.tasks.base import EvalTask
from clotho.tasks.rows import rows_from_records


class Found:
    """What one discovery collects (tasks, errors naming the bad task or record, the folders
    left for Harbor discovery) and what its formats share while it runs."""

    def __init__(self, options: Mapping[str, Any], rows_cache: Path) -> None:
        self.tasks: list[EvalTask] = []
        self.errors: list[tuple[Path, TaskError]] = []
        self.harbor: list[Path] = []
        self.options = options  # per format name: its options (`EvalConfig.swe` for "swe")
        self.rows_cache = rows_cache
        self.shared: dict[str, Any] = {}  # a format's own, for the whole discovery

    def bad(self, source: DatasetSource, errors: Iterable[tuple[str, TaskError]]) -> None:
        """Errors of records, each named under its source by its key (an instance id...)."""
        name = Path(source.label)
        self.errors.extend((name / key.replace("/", "_"), error) for key, error in errors)


# Add the records of `source` (a file or a dataset; those still to read) to `found`.
ReadRecords = Callable[[Found, Iterator[Record], DatasetSource], None]


@dataclass(frozen=True)
class TaskFormat:
    """One format of task records."""

    name: str  # its options' key in `Found.options`
    what: str  # its records, for messages: "SWE instances (instance_id, base_commit)"
    is_record: Callable[[Any], bool]  # a dataset's first readable record is one of its own
    read: ReadRecords
    is_file: Callable[[Path], bool] | None = None  # a file of its records (else: Harbor's)


_FORMATS: dict[str, TaskFormat] = {}


def register(task_format: TaskFormat) -> TaskFormat:
    """Make a format known to discovery (again under the same name: replaced)."""
    _FORMATS[task_format.name] = task_format
    return task_format


def task_formats() -> tuple[TaskFormat, ...]:
    """The registered formats, in registration order."""
    return tuple(_FORMATS.values())


def _is_row(data: Any) -> bool:
    return isinstance(data, dict) and "task_name" in data and "instruction" in data


def _read_rows(found: Found, records: Iterator[Record], source: DatasetSource) -> None:
    dirs, bad = rows_from_records(records, found.rows_cache, source.stem, source.label)
    found.harbor.extend(dirs)
    found.errors.extend(bad)


# Terminal-Bench 2.0 rows of a dataset: unpacked into Harbor task folders (`rows.py`).
ROWS = register(
    TaskFormat("rows", "Terminal-Bench rows (task_name, instruction)", _is_row, _read_rows)
)
