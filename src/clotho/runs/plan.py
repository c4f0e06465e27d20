"""Planning an evaluation: which attempts run, which are done, which tasks are invalid."""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clotho.swe  # noqa: F401  (registers the SWE task format with discovery)
from clotho.errors import ConfigError, ErrorInfo
from clotho.runs.metrics import latest
from clotho.runs.records import EvalConfig, TrialRecord
from clotho.runs.store import RunStore
from clotho.tasks.base import EvalTask
from clotho.tasks.discover import discover
from clotho.tasks.trial import HarborTrial

# Tasks known not to run on a backend (the reference harness keeps such a list for Modal).
DEFAULT_SKIPS_FILE = Path(__file__).with_name("default_skips.toml")


@dataclass
class EvalPlan:
    pending: list[tuple[EvalTask, int]]  # (task, attempt) still to run, in order
    invalid: list[TrialRecord]  # `task` errors to record for tasks that could not be loaded
    total: int  # attempts the run has in all, done or not
    skipped: list[str] = dataclasses.field(default_factory=list)  # by the backend's default list


def select(tasks: list[EvalTask], include: list[str], skip: list[str]) -> list[EvalTask]:
    def matches(task: EvalTask, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(task.name, p) for p in patterns)

    chosen = [t for t in tasks if not include or matches(t, include)]
    return [t for t in chosen if not matches(t, skip)]


def backend_names(sandbox: Any) -> list[str]:
    """The backends a run's sandboxes go through: a cluster's own and the one its nodes run."""
    names = [sandbox.backend]
    inner = getattr(sandbox, "inner", None)
    if inner is not None:
        names += backend_names(inner)
    return names


def default_skips(backends: list[str], source: bool | str = True) -> list[str]:
    """The patterns of tasks known not to run on `backends`, from the bundled list (`source`
    true), a TOML file of the same form (a path), or none (false). A list that cannot be
    read is a `ConfigError`: a run must not quietly run what it meant to skip."""
    if source is False:
        return []
    path = DEFAULT_SKIPS_FILE if source is True else Path(str(source)).expanduser()
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"default_skips: cannot read {path}: {exc}") from exc
    patterns: list[str] = []
    for name in backends:
        found = data.get(name, [])
        if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
            raise ConfigError(f"{path}: {name} must be a list of task names or globs")
        patterns += found
    return patterns


def with_run_options(task: EvalTask, config: EvalConfig) -> EvalTask:
    """The task with the run's overrides of its own settings: `verifier_timeout_s` replaces
    a Harbor task's `[verifier] timeout_sec` (its trial's wall clock follows)."""
    if config.verifier_timeout_s is None or not isinstance(task, HarborTrial):
        return task
    harbor = task.task
    verifier = harbor.config.verifier.model_copy(update={"timeout_sec": config.verifier_timeout_s})
    settings = harbor.config.model_copy(update={"verifier": verifier})
    return HarborTrial(dataclasses.replace(harbor, config=settings))


async def plan_eval(config: EvalConfig, store: RunStore, resume: bool) -> EvalPlan:
    """Discovery (file reads, dataset rows unpacked) runs off the event loop."""
    swe = config.swe
    if config.verifier_timeout_s is not None:  # SWE instances' tests run under their options
        swe = swe.model_copy(update={"test_timeout_s": config.verifier_timeout_s})
    skips = await asyncio.to_thread(
        default_skips, backend_names(config.sandbox), config.default_skips
    )
    tasks, task_errors = await asyncio.to_thread(
        discover, [Path(p) for p in config.paths], options={"swe": swe}
    )
    tasks = select(tasks, config.filter, config.skip)
    kept = select(tasks, [], skips)
    skipped = sorted({t.name for t in tasks} - {t.name for t in kept})
    tasks = [with_run_options(t, config) for t in kept]
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
    return EvalPlan(
        pending=pending, invalid=invalid, total=len(tasks) * config.attempts, skipped=skipped
    )
