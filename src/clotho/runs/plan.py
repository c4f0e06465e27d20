"""Planning an evaluation: which attempts run, which are done, which tasks are invalid."""

from __future__ import annotations

import asyncio
import fnmatch
import time
from dataclasses import dataclass
from pathlib import Path

from clotho.errors import ErrorInfo
from clotho.runs.metrics import latest
from clotho.runs.records import EvalConfig, TrialRecord
from clotho.runs.store import RunStore
from clotho.tasks.base import EvalTask
from clotho.tasks.discover import discover


@dataclass
class EvalPlan:
    pending: list[tuple[EvalTask, int]]  # (task, attempt) still to run, in order
    invalid: list[TrialRecord]  # `task` errors to record for tasks that could not be loaded
    total: int  # attempts the run has in all, done or not


def select(tasks: list[EvalTask], include: list[str], skip: list[str]) -> list[EvalTask]:
    def matches(task: EvalTask, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(task.name, p) for p in patterns)

    chosen = [t for t in tasks if not include or matches(t, include)]
    return [t for t in chosen if not matches(t, skip)]


async def plan_eval(config: EvalConfig, store: RunStore, resume: bool) -> EvalPlan:
    """Discovery (file reads, dataset rows unpacked) runs off the event loop."""
    tasks, task_errors = await asyncio.to_thread(
        discover, [Path(p) for p in config.paths], swe=config.swe
    )
    tasks = select(tasks, config.filter, config.skip)
    previous = latest(await asyncio.to_thread(store.load_records)) if resume else {}
    # Only what may change on a retry runs again (infra failures say nothing about the agent).
    done = {k for k, r in previous.items() if r.error is None or not r.error.retried}
    invalid = [
        TrialRecord(
            task=path.name,
            category="invalid",
            attempt=attempt,
            reward=None,
            passed=False,
            error=ErrorInfo(kind="task", message=str(error)),
            agent=config.agent,
            finished_at=time.time(),
        )
        for path, error in task_errors
        for attempt in range(config.attempts)
        if (path.name, attempt) not in done
    ]
    pending = [(t, a) for t in tasks for a in range(config.attempts) if (t.name, a) not in done]
    store.supersede({(t.name, a) for t, a in pending if (t.name, a) in previous})
    return EvalPlan(pending=pending, invalid=invalid, total=len(tasks) * config.attempts)
