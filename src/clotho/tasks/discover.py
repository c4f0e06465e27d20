"""Every task format `clotho eval` and `clotho check` read, found under the given paths:
Harbor's own, and the formats registered in `formats.py`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from clotho.data import HUB_PREFIX, DatasetSource, Record, read_records
from clotho.errors import TaskError
from clotho.tasks.base import EvalTask
from clotho.tasks.formats import Found, task_formats
from clotho.tasks.harbor import Task, default_rows_cache, discover_tasks
from clotho.tasks.rows import load_rows
from clotho.tasks.trial import HarborTrial

SourceLike = Path | str | DatasetSource


def dataset_source(entry: SourceLike) -> DatasetSource | None:
    """The entry as a dataset to read whole (a `DatasetSource`, or `hf:NAME[?options]`);
    None for a path, which discovery looks at itself (a task folder, a rows file...)."""
    if isinstance(entry, DatasetSource):
        return entry
    text = str(entry)
    return DatasetSource.parse(text) if text.startswith(HUB_PREFIX) else None


def _first_ok(records: Iterator[Record]) -> tuple[Any, Iterator[Record]]:
    """The first readable record's data, and every record (that one included) still to use."""
    head: list[Record] = []
    for record in records:
        head.append(record)
        if record.ok:
            return record.data, chain(head, records)
    return None, iter(head)


def _dataset(found: Found, source: DatasetSource) -> None:
    """A dataset read whole, its format told by the first readable record (after the field
    mapping): a registered format's (`task_formats`)."""
    first, records = _first_ok(read_records(source))
    if first is None:  # only unreadable records, or none at all
        bad = [(r.where.rsplit("/", 1)[-1], r.error) for r in records if r.error is not None]
        found.bad(source, bad)
        if not bad:
            found.errors.append((Path(source.label), TaskError(f"{source.label}: no records")))
        return
    for task_format in task_formats():
        if task_format.is_record(first):
            task_format.read(found, records, source)
            return
    columns = ", ".join(sorted(map(str, first))[:20]) if isinstance(first, dict) else ""
    kinds = " nor ".join(sorted(f.what for f in task_formats()))
    found.errors.append(
        (
            Path(source.label),
            TaskError(
                f"{source.label}: neither {kinds}; its first record has "
                f"{columns or type(first).__name__}: map columns with `fields`"
            ),
        )
    )


def discover(
    paths: list[SourceLike],
    *,
    options: Mapping[str, Any] | None = None,
    rows_cache: Path | None = None,
) -> tuple[list[EvalTask], list[tuple[Path, TaskError]]]:
    """Harbor task directories (and folders of them), Terminal-Bench 2.0 row files, files of
    a registered format (`tasks/formats.py`: SWE-bench / SWE-smith instance files, .jsonl/.json
    whose records have `instance_id` and `base_commit`, .parquet files with those columns),
    and datasets (`hf:NAME[?split=...]` or a `DatasetSource`) of any of them. `options` holds
    each format's own by its name (`{"swe": SweOptions}`: where repositories come from). A
    bad instance is an error named by its instance id (`path.name` of its error's path).

    Blocking (file reads, archives unpacked, Hub downloads): callers run it off the event
    loop. A missing extra (pyarrow, datasets) or an unreachable Hub raises `ConfigError`."""
    found = Found(options or {}, rows_cache or default_rows_cache())
    for entry in paths:
        source = dataset_source(entry)
        if source is not None:
            _dataset(found, source)
            continue
        path = Path(entry)
        claimed = next((f for f in task_formats() if f.is_file and f.is_file(path)), None)
        if claimed is not None:
            source = DatasetSource(path=str(path))
            claimed.read(found, read_records(source), source)
        else:
            found.harbor.append(path)
    if found.harbor:
        tasks, harbor_errors = discover_tasks(found.harbor, rows_cache=found.rows_cache)
        found.tasks.extend(HarborTrial(t) for t in tasks)
        found.errors.extend(harbor_errors)
    return found.tasks, found.errors


def discover_harbor(
    sources: list[SourceLike], rows_cache: Path | None = None
) -> tuple[list[Task], list[tuple[Path, TaskError]]]:
    """Harbor tasks for an environment's task list: task directories, folders of them,
    rows files (.jsonl/.json/.parquet) and row datasets (`hf:NAME`, a `DatasetSource` whose
    `fields` map differently named columns). Blocking, like `discover`."""
    cache = rows_cache or default_rows_cache()
    paths: list[Path] = []
    errors: list[tuple[Path, TaskError]] = []
    for entry in sources:
        source = dataset_source(entry)
        if source is None:
            paths.append(Path(entry))  # type: ignore[arg-type]
            continue
        dirs, bad = load_rows(source, cache)
        paths.extend(dirs)
        errors.extend(bad)
    tasks, harbor_errors = discover_tasks(paths, rows_cache=cache)
    return tasks, errors + harbor_errors
