"""`run_eval`: plan the attempts, schedule their sandboxes, run each through the one rollout
path, and record every outcome in a run directory as it ends.

An attempt the infrastructure lost (an infra error: its node died, its backend broke) runs
again within the run, within the retry budget (`rollout.run.RetryBudget`): its failed try is
written first (so a crash leaves it for `--resume`), then superseded by the retry's line,
so results.jsonl keeps one line per attempt and metrics never count the lost try. The retry
queues behind the attempts already waiting, after a short pause; a new sandbox is opened
for it, which the ray backend places on a live node only.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from clotho.agent.base import Agent
from clotho.chat.models import Model
from clotho.errors import ErrorInfo
from clotho.rollout import RolloutOutcome, run_retried, run_rollout
from clotho.rollout.agents import build_agent as build_named_agent
from clotho.runs.metrics import compute_metrics
from clotho.runs.plan import EvalPlan, plan_eval
from clotho.runs.records import EvalConfig, RunMetrics, TrialDetail, TrialRecord
from clotho.runs.schedule import EnvironmentScheduler, retry_budget
from clotho.runs.store import RunStore
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.base import EvalTask

Listener = Callable[[str, object], None]


async def build_agent(config: EvalConfig) -> tuple[Agent, Model | None]:
    """The agent, and the model client to close afterwards (None for reference agents)."""
    return await build_named_agent(
        config.agent,
        config.model,
        config.toolsets,
        max_turns=config.max_turns,
        system_prompt=config.system_prompt,
        command_timeout_s=config.command_timeout_s,
        tools_config=config.tools,
    )


class Recorder:
    """Turns outcomes into records, writes them, and tells the listener (eval's and
    generate's runs)."""

    def __init__(self, store: RunStore, agent: str, notify: Listener) -> None:
        self.store = store
        self.agent = agent
        self.notify = notify

    def _record(
        self, task: EvalTask, attempt: int, outcome: RolloutOutcome, lost: list[ErrorInfo]
    ) -> TrialRecord:
        record = TrialRecord.from_outcome(
            outcome, task=task.name, category=task.category, attempt=attempt, agent=self.agent
        )
        record.lost_tries = list(lost)
        return record

    async def outcome(
        self,
        task: EvalTask,
        attempt: int,
        outcome: RolloutOutcome,
        lost: list[ErrorInfo] | None = None,
    ) -> None:
        record = self._record(task, attempt, outcome, lost or [])
        await self.store.append(record, TrialDetail.of(record, outcome))
        self.notify("trial_end", record)

    async def lost(
        self, task: EvalTask, attempt: int, outcome: RolloutOutcome, lost: list[ErrorInfo]
    ) -> None:
        """A try that runs again: its line stands until the retry's replaces it; its detail
        file is kept beside the attempt's (`<task>__<attempt>.lost<n>.json`)."""
        record = self._record(task, attempt, outcome, lost)
        detail = TrialDetail.of(record, outcome)
        await self.store.append(record, detail, suffix=f".lost{len(lost) + 1}")
        self.store.supersede({record.key})
        self.notify("trial_retry", record)

    async def invalid(self, plan: EvalPlan) -> None:
        for record in plan.invalid:
            await self.store.append(record, TrialDetail.of(record))
            self.notify("task_error", record)


async def run_eval(
    config: EvalConfig,
    out_dir: Path,
    *,
    resume: bool = False,
    listener: Listener | None = None,
) -> RunMetrics:
    """Run the evaluation; on cancellation (Ctrl-C) what finished is kept and metrics written."""
    notify = listener or (lambda event, data: None)
    store = RunStore(out_dir)
    store.prepare(resume)
    store.write_config(config)
    plan = await plan_eval(config, store, resume)
    recorder = Recorder(store, config.agent, notify)
    await recorder.invalid(plan)
    notify("start", {"total": plan.total, "pending": len(plan.pending), "skipped": plan.skipped})
    started = time.perf_counter()
    pool = SlotPool(
        PoolConfig(max_size=2 * config.concurrency),
        labels={"clotho.run": f"{out_dir.name}-{secrets.token_hex(3)}"},
    )
    client: Model | None = None
    complete = False
    try:
        async with pool:
            agent, client = await build_agent(config)
            mounts = getattr(agent, "sandbox_mounts", None)  # an installed agent's packages
            if mounts is not None:  # in the config, so prewarmed sandboxes have them too
                sandbox = config.sandbox.with_ro_mounts(mounts())
                config = config.model_copy(update={"sandbox": sandbox})
            await _run_pending(config, plan, pool, agent, recorder)
        complete = True
    finally:
        if client is not None:
            await client.aclose()
        records = await asyncio.to_thread(store.load_records)
        metrics = compute_metrics(records, config.attempts)
        metrics.duration_s = round(time.perf_counter() - started, 3)
        # Stopped (Ctrl-C, a signal, an exception): said so, with how far it got, so that
        # nobody reads the attempts that never ran as a finished run's.
        done = {r.key for r in records}
        left = sum(1 for task, attempt in plan.pending if (task.name, attempt) not in done)
        metrics.complete = complete and left == 0
        metrics.n_planned = plan.total
        metrics.n_finished = plan.total - left
        store.write_metrics(metrics)
    return metrics


async def _run_pending(
    config: EvalConfig, plan: EvalPlan, pool: SlotPool, agent: Agent, recorder: Recorder
) -> None:
    """Every pending attempt, `concurrency` at a time, environments prepared in order of need;
    an attempt lost to the infrastructure is tried again within the run's retry budget."""
    scheduler = EnvironmentScheduler(pool, config, plan.pending)
    semaphore = asyncio.Semaphore(config.concurrency)
    budget = retry_budget(config, len(plan.pending))

    async def once(index: int, task: EvalTask, attempt: int, retry: bool) -> RolloutOutcome:
        try:
            prepared = await scheduler.prepared(task, again=retry)
        except Exception as exc:
            return RolloutOutcome.failed(exc, "environment")
        async with semaphore:
            if not retry:
                recorder.notify("trial_start", (task.name, attempt))
                scheduler.prewarm_after(index)
            spec = task.rollout(
                agent,
                prepared,
                timeout_s=config.task_timeout_s,
                labels={"clotho.attempt": str(attempt)},
                pass_threshold=config.pass_threshold,
            )
            return await run_rollout(spec, pool)

    async def one(index: int, task: EvalTask, attempt: int) -> None:
        async def lost(outcome: RolloutOutcome, before: list[ErrorInfo]) -> None:
            await recorder.lost(task, attempt, outcome, before)

        outcome = await run_retried(
            lambda retry: once(index, task, attempt, retry), budget, on_lost=lost
        )
        await recorder.outcome(task, attempt, outcome, outcome.lost_tries)

    async with scheduler, asyncio.TaskGroup() as group:
        for index, (task, attempt) in enumerate(plan.pending):
            group.create_task(one(index, task, attempt))
