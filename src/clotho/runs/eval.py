"""`run_eval`: every (task, attempt) through `run_trial`, bounded, streamed to a run directory."""

from __future__ import annotations

import asyncio
import fnmatch
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clotho.agent.base import Agent
from clotho.agent.llm import LLMAgent
from clotho.agent.loop import AgentLimits
from clotho.agent.models import build_model
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.chat.client import ModelConfig
from clotho.runs.metrics import compute_metrics, latest
from clotho.runs.records import EvalConfig, RunMetrics, TrialDetail, TrialRecord
from clotho.runs.store import RunStore
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.harbor import Task, discover_tasks
from clotho.tasks.images import ImageResolver, task_sandbox_config
from clotho.tasks.trial import ErrorInfo, TrialOutcome, run_trial
from clotho.tools.builtin import default_registry

Listener = Callable[[str, object], None]


def build_agent(config: EvalConfig) -> tuple[Agent, Any]:
    """The agent, and the model client to close afterwards (None for reference agents)."""
    if config.agent == "oracle":
        return OracleAgent(), None
    if config.agent == "nop":
        return NopAgent(), None
    # No endpoint configured: the embedded local model.
    client = build_model(config.model or ModelConfig())
    tools = default_registry().resolve(config.toolsets)
    agent = LLMAgent(client, tools, AgentLimits(max_turns=config.max_turns))
    return agent, client


def select(tasks: list[Task], include: list[str], skip: list[str]) -> list[Task]:
    def matches(task: Task, patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(task.name, p) for p in patterns)

    chosen = [t for t in tasks if not include or matches(t, include)]
    return [t for t in chosen if not matches(t, skip)]


def _record(task: Task, attempt: int, agent: str, outcome: TrialOutcome) -> TrialRecord:
    result = outcome.agent
    return TrialRecord(
        task=task.name,
        category=task.category,
        attempt=attempt,
        reward=outcome.reward,
        rewards=outcome.rewards,
        passed=outcome.passed,
        error=outcome.error,
        stop_reason=result.stop_reason if result else None,
        turns=result.turns if result else 0,
        tool_calls=result.tool_calls if result else 0,
        tool_errors=len(result.tool_errors) if result else 0,
        duration_s=round(outcome.duration_s, 3),
        agent=agent,
        finished_at=time.time(),
    )


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
    tasks, task_errors = discover_tasks([Path(p) for p in config.paths])
    tasks = select(tasks, config.filter, config.skip)
    previous = latest(store.load_records()) if resume else {}
    # Infra failures say nothing about the agent: a resumed run tries them again.
    done = {k for k, r in previous.items() if r.error is None or r.error.kind != "infra"}
    for path, error in task_errors:
        for attempt in range(config.attempts):
            if (path.name, attempt) in done:
                continue
            record = TrialRecord(
                task=path.name,
                category="invalid",
                attempt=attempt,
                reward=None,
                passed=False,
                error=ErrorInfo(kind="task", message=str(error)),
                agent=config.agent,
                finished_at=time.time(),
            )
            store.append(record, TrialDetail(record=record))
            notify("task_error", record)
    pending = [(t, a) for t in tasks for a in range(config.attempts) if (t.name, a) not in done]
    notify("start", {"total": len(tasks) * config.attempts, "pending": len(pending)})
    agent, client = build_agent(config)
    labels = {"clotho.run": f"{out_dir.name}-{secrets.token_hex(3)}"}
    semaphore = asyncio.Semaphore(config.concurrency)
    started = time.perf_counter()
    pool = SlotPool(
        PoolConfig(max_size=2 * config.concurrency),
        labels=labels,
        docker_url=getattr(config.sandbox, "docker_url", None),
    )
    resolver = (
        ImageResolver(pool.docker, force_build=config.force_build)
        if isinstance(config.sandbox, DockerSandboxConfig)
        else None
    )
    configs: dict[str, asyncio.Future[SandboxConfig]] = {}

    async def resolve_all() -> None:
        """Sandbox configurations (images built) in the order the trials will need them."""
        for task, _ in pending:
            future = configs[task.name]
            if future.done():
                continue
            try:
                future.set_result(await task_sandbox_config(task, config.sandbox, resolver))
            except Exception as exc:
                future.set_exception(exc)

    def prewarm(index: int) -> None:
        """Start the sandbox of the trial that will run `concurrency` trials from now."""
        ahead = index + config.concurrency
        if config.prewarm and ahead < len(pending):
            future = configs[pending[ahead][0].name]
            if future.done() and future.exception() is None:
                pool.prewarm(future.result())

    async def one(index: int, task: Task, attempt: int) -> None:
        try:
            sandbox_config = await configs[task.name]
        except Exception as exc:
            outcome = TrialOutcome(error=ErrorInfo(kind="infra", message=f"environment: {exc}"))
            record = _record(task, attempt, config.agent, outcome)
            store.append(record, TrialDetail(record=record))
            notify("trial_end", record)
            return
        async with semaphore:
            notify("trial_start", (task.name, attempt))
            prewarm(index)
            outcome = await run_trial(
                task,
                agent,
                sandbox_config,
                task_timeout_s=config.task_timeout_s,
                labels={"clotho.attempt": str(attempt)},
                pass_threshold=config.pass_threshold,
                pool=pool,
            )
            record = _record(task, attempt, config.agent, outcome)
            store.append(
                record,
                TrialDetail(record=record, agent_result=outcome.agent, verifier=outcome.verifier),
            )
            notify("trial_end", record)

    try:
        async with pool, asyncio.TaskGroup() as group:
            loop = asyncio.get_running_loop()
            for task, _ in pending:
                configs.setdefault(task.name, loop.create_future())
            group.create_task(resolve_all())
            for index, (task, attempt) in enumerate(pending):
                group.create_task(one(index, task, attempt))
    finally:
        for future in configs.values():
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warnings
        if client is not None:
            await client.aclose()
        metrics = compute_metrics(store.load_records(), config.attempts)
        metrics.duration_s = round(time.perf_counter() - started, 3)
        store.write_metrics(metrics)
    return metrics
