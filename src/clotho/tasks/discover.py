"""Every task format `clotho eval` and `clotho check` read, found under the given paths."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from clotho.errors import TaskError
from clotho.tasks.base import EvalTask
from clotho.tasks.harbor import discover_tasks
from clotho.tasks.trial import HarborTrial

if TYPE_CHECKING:
    from clotho.swe.instance import SweOptions


def discover(
    paths: list[Path], *, swe: SweOptions | None = None
) -> tuple[list[EvalTask], list[tuple[Path, TaskError]]]:
    """Harbor task directories (and folders of them), Terminal-Bench 2.0 row files, and
    SWE-bench / SWE-smith instance files (.jsonl/.json whose records have `instance_id` and
    `base_commit`; `swe` says where their repositories come from). A bad instance is an
    error named by its instance id (`path.name` of its error's path).

    Blocking (file reads, archives unpacked): callers run it off the event loop."""
    from clotho.swe.instance import SweOptions, is_instance_file, load_instances
    from clotho.swe.repos import RepoCache
    from clotho.swe.trial import SweTrial

    tasks: list[EvalTask] = []
    errors: list[tuple[Path, TaskError]] = []
    others: list[Path] = []
    options = swe or SweOptions()
    cache: RepoCache | None = None
    for path in paths:
        if not is_instance_file(path):
            others.append(path)
            continue
        if cache is None:  # one cache for the run: rollouts of a repository share its lock
            cache = RepoCache(
                options.cache_path(),
                repos_dir=Path(options.repos_dir) if options.repos_dir else None,
                network=options.network_clone,
            )
        instances, bad = load_instances(path)
        tasks.extend(SweTrial(i, options, cache) for i in instances)
        errors.extend((path / name.replace("/", "_"), error) for name, error in bad)
    if others:
        found, harbor_errors = discover_tasks(others)
        tasks.extend(HarborTrial(t) for t in found)
        errors.extend(harbor_errors)
    return tasks, errors
