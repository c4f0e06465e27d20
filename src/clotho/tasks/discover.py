"""Every task format `clotho eval` and `clotho check` read, found under the given paths."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clotho.data import HUB_PREFIX, DatasetSource, Record, read_records
from clotho.errors import TaskError
from clotho.tasks.base import EvalTask
from clotho.tasks.harbor import Task, default_rows_cache, discover_tasks
from clotho.tasks.trial import HarborTrial

if TYPE_CHECKING:
    from clotho.swe.instance import SweOptions
    from clotho.swe.repos import RepoCache

SourceLike = Path | str | DatasetSource


def dataset_source(entry: SourceLike) -> DatasetSource | None:
    """The entry as a dataset to read whole (a `DatasetSource`, or `hf:NAME[?options]`);
    None for a path, which discovery looks at itself (a task folder, a rows file...)."""
    if isinstance(entry, DatasetSource):
        return entry
    text = str(entry)
    return DatasetSource.parse(text) if text.startswith(HUB_PREFIX) else None


def _is_instance(data: Any) -> bool:
    return isinstance(data, dict) and "instance_id" in data and "base_commit" in data


def _is_row(data: Any) -> bool:
    return isinstance(data, dict) and "task_name" in data and "instruction" in data


def _first_ok(records: Iterator[Record]) -> tuple[Any, Iterator[Record]]:
    """The first readable record's data, and every record (that one included) still to use."""
    head: list[Record] = []
    for record in records:
        head.append(record)
        if record.ok:
            return record.data, chain(head, records)
    return None, iter(head)


class _Found:
    """What discovery collects: tasks, errors (a path naming the bad task or record), and the
    paths and row task folders left for Harbor discovery."""

    def __init__(self, swe: SweOptions | None, rows_cache: Path | None) -> None:
        self.tasks: list[EvalTask] = []
        self.errors: list[tuple[Path, TaskError]] = []
        self.harbor: list[Path] = []
        self.swe = swe
        self.rows_cache = rows_cache or default_rows_cache()
        self._repos: RepoCache | None = None

    def repos(self) -> tuple[SweOptions, RepoCache]:
        from clotho.swe.instance import SweOptions
        from clotho.swe.repos import RepoCache

        options = self.swe or SweOptions()
        if self._repos is None:  # one cache for the run: rollouts of a repository share its lock
            self._repos = RepoCache(
                options.cache_path(),
                repos_dir=Path(options.repos_dir) if options.repos_dir else None,
                network=options.network_clone,
            )
        return options, self._repos

    def instances(self, records: Iterator[Record], base: Path | None, name: Path) -> None:
        from clotho.swe.instance import instances_from_records
        from clotho.swe.trial import SweTrial

        options, cache = self.repos()
        instances, bad = instances_from_records(records, base)
        self.tasks.extend(SweTrial(i, options, cache) for i in instances)
        self.errors.extend((name / key.replace("/", "_"), error) for key, error in bad)

    def dataset(self, source: DatasetSource) -> None:
        """A dataset read whole: SWE instances or Terminal-Bench 2.0 rows, told apart by the
        first readable record (after the field mapping)."""
        from clotho.tasks.rows import rows_from_records

        first, records = _first_ok(read_records(source))
        base = Path(source.path).resolve().parent if source.path is not None else None
        if first is None or _is_instance(first):
            before = len(self.errors)
            self.instances(records, base, Path(source.label))
            if first is None and len(self.errors) == before:
                self.errors.append((Path(source.label), TaskError(f"{source.label}: no records")))
        elif _is_row(first):
            dirs, bad = rows_from_records(records, self.rows_cache, source.stem, source.label)
            self.harbor.extend(dirs)
            self.errors.extend(bad)
        else:
            columns = ", ".join(sorted(map(str, first))[:20]) if isinstance(first, dict) else ""
            self.errors.append(
                (
                    Path(source.label),
                    TaskError(
                        f"{source.label}: neither SWE instances (instance_id, base_commit) nor "
                        f"Terminal-Bench rows (task_name, instruction); its first record has "
                        f"{columns or type(first).__name__}: map columns with `fields`"
                    ),
                )
            )


def discover(
    paths: list[SourceLike], *, swe: SweOptions | None = None, rows_cache: Path | None = None
) -> tuple[list[EvalTask], list[tuple[Path, TaskError]]]:
    """Harbor task directories (and folders of them), Terminal-Bench 2.0 row files, and
    SWE-bench / SWE-smith instance files (.jsonl/.json whose records have `instance_id` and
    `base_commit`, .parquet files with those columns; `swe` says where their repositories
    come from); and datasets (`hf:NAME[?split=...]` or a `DatasetSource`) of either kind.
    A bad instance is an error named by its instance id (`path.name` of its error's path).

    Blocking (file reads, archives unpacked, Hub downloads): callers run it off the event
    loop. A missing extra (pyarrow, datasets) or an unreachable Hub raises `ConfigError`."""
    from clotho.swe.instance import is_instance_file

    found = _Found(swe, rows_cache)
    for entry in paths:
        source = dataset_source(entry)
        if source is not None:
            found.dataset(source)
            continue
        path = Path(entry)
        if is_instance_file(path):
            records = read_records(DatasetSource(path=str(path)))
            found.instances(records, path.resolve().parent, path)
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
    from clotho.tasks.rows import load_rows

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
