"""SWE-bench / SWE-smith records as a task format of discovery (`tasks/formats.py`):
.jsonl/.json files whose first record has `instance_id` and `base_commit`, .parquet files
with those columns, and datasets of such records. Registered when `clotho.swe` is imported."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clotho.data import DatasetSource, Record
from clotho.swe.instance import SweOptions, instances_from_records, is_instance_file
from clotho.swe.repos import RepoCache
from clotho.swe.trial import SweTrial
from clotho.tasks.formats import Found, TaskFormat, register


def _is_instance(data: Any) -> bool:
    return isinstance(data, dict) and "instance_id" in data and "base_commit" in data


def _repos(found: Found) -> tuple[SweOptions, RepoCache]:
    """The run's options (`Found.options["swe"]`) and one repository cache for the whole
    discovery: rollouts of a repository share its lock."""
    options: SweOptions = found.options.get("swe") or SweOptions()
    cache = found.shared.get("swe")
    if cache is None:
        cache = found.shared["swe"] = RepoCache(
            options.cache_path(),
            repos_dir=Path(options.repos_dir) if options.repos_dir else None,
            network=options.network_clone,
        )
    return options, cache


def _read(found: Found, records: Iterator[Record], source: DatasetSource) -> None:
    options, cache = _repos(found)
    base = Path(source.path).resolve().parent if source.path is not None else None
    instances, bad = instances_from_records(records, base)
    found.tasks.extend(SweTrial(i, options, cache) for i in instances)
    found.bad(source, bad)


SWE = register(
    TaskFormat(
        "swe", "SWE instances (instance_id, base_commit)", _is_instance, _read, is_instance_file
    )
)
