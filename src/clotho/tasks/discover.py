"""Every task format `clotho eval` and `clotho check` read, found under the given paths."""

from __future__ import annotations

from pathlib import Path

from clotho.errors import TaskError
from clotho.tasks.base import EvalTask
from clotho.tasks.harbor import discover_tasks
from clotho.tasks.trial import HarborTrial


def discover(paths: list[Path]) -> tuple[list[EvalTask], list[tuple[Path, TaskError]]]:
    """Harbor task directories (and folders of them) and Terminal-Bench 2.0 row files.

    Blocking (file reads, archives unpacked): callers run it off the event loop."""
    tasks, errors = discover_tasks(paths)
    return [HarborTrial(t) for t in tasks], errors
