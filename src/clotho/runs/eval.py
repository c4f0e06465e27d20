"""`run_eval`: plan the attempts, schedule their sandboxes, run each through the one rollout
path, and record every outcome in a run directory as it ends."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from clotho.agent.base import Agent
from clotho.agent.llm import LLMAgent
from clotho.agent.loop import AgentLimits
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.chat.client import ModelConfig
from clotho.chat.models import Model, build_model
from clotho.rollout import RolloutOutcome, run_rollout
from clotho.runs.metrics import compute_metrics
from clotho.runs.plan import EvalPlan, plan_eval
from clotho.runs.records import EvalConfig, RunMetrics, TrialDetail, TrialRecord
from clotho.runs.schedule import EnvironmentScheduler
from clotho.runs.store import RunStore
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.base import EvalTask
from clotho.tools.builtin import default_registry

Listener = Callable[[str, object], None]


async def build_agent(config: EvalConfig) -> tuple[Agent, Model | None]:
    """The agent, and the model client to close afterwards (None for reference agents)."""
    if config.agent == "oracle":
        return OracleAgent(), None
    if config.agent == "nop":
        return NopAgent(), None
    # No endpoint configured: the embedded local model.
    client = await build_model(config.model or ModelConfig())
    tools = default_registry().resolve(config.toolsets)
    return LLMAgent(client, tools, AgentLimits(max_turns=config.max_turns)), client


class _Recorder:
    """Turns outcomes into records, writes them, and tells the listener."""

    def __init__(self, store: RunStore, agent: str, notify: Listener) -> None:
        self.store = store
        self.agent = agent
        self.notify = notify

    async def outcome(self, task: EvalTask, attempt: int, outcome: RolloutOutcome) -> None:
        record = TrialRecord.from_outcome(
            outcome, task=task.name, category=task.category, attempt=attempt, agent=self.agent
        )
        await self.store.append(record, TrialDetail.of(record, outcome))
        self.notify("trial_end", record)

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
    recorder = _Recorder(store, config.agent, notify)
    await recorder.invalid(plan)
    notify("start", {"total": plan.total, "pending": len(plan.pending)})
    started = time.perf_counter()
    pool = SlotPool(
        PoolConfig(max_size=2 * config.concurrency),
        labels={"clotho.run": f"{out_dir.name}-{secrets.token_hex(3)}"},
    )
    client: Model | None = None
    try:
        async with pool:
            agent, client = await build_agent(config)
            await _run_pending(config, plan, pool, agent, recorder)
    finally:
        if client is not None:
            await client.aclose()
        records = await asyncio.to_thread(store.load_records)
        metrics = compute_metrics(records, config.attempts)
        metrics.duration_s = round(time.perf_counter() - started, 3)
        store.write_metrics(metrics)
    return metrics


async def _run_pending(
    config: EvalConfig, plan: EvalPlan, pool: SlotPool, agent: Agent, recorder: _Recorder
) -> None:
    """Every pending attempt, `concurrency` at a time, environments prepared in order of need."""
    scheduler = EnvironmentScheduler(pool, config, plan.pending)
    semaphore = asyncio.Semaphore(config.concurrency)

    async def one(index: int, task: EvalTask, attempt: int) -> None:
        try:
            prepared = await scheduler.prepared(task)
        except Exception as exc:
            await recorder.outcome(task, attempt, RolloutOutcome.failed(exc, "environment"))
            return
        async with semaphore:
            recorder.notify("trial_start", (task.name, attempt))
            scheduler.prewarm_after(index)
            spec = task.rollout(
                agent,
                prepared,
                timeout_s=config.task_timeout_s,
                labels={"clotho.attempt": str(attempt)},
                pass_threshold=config.pass_threshold,
            )
            await recorder.outcome(task, attempt, await run_rollout(spec, pool))

    async with scheduler, asyncio.TaskGroup() as group:
        for index, (task, attempt) in enumerate(plan.pending):
            group.create_task(one(index, task, attempt))
