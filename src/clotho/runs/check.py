"""Check task directories: the reference solution must pass and doing nothing must fail."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel, Field

import clotho.swe  # noqa: F401  (registers the SWE task format with discovery)
from clotho.agent.base import Agent
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.rollout import RolloutOutcome
from clotho.sandbox import SandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.base import EvalTask
from clotho.tasks.discover import discover
from clotho.tasks.trial import run_trial


class TaskCheck(BaseModel):
    task: str
    oracle_reward: float | None = None
    nop_reward: float | None = None
    problems: list[str] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _describe(name: str, outcome: RolloutOutcome) -> str:
    if outcome.error is not None:
        return f"{name}: {outcome.error.kind} error: {outcome.error.message}"
    return f"{name}: reward {outcome.reward}"


async def check_task(task: EvalTask, sandbox: SandboxConfig, pool: SlotPool) -> TaskCheck:
    agents: tuple[Agent, Agent] = (OracleAgent(), NopAgent())
    oracle, nop = await asyncio.gather(*(run_trial(task, a, sandbox, pool) for a in agents))
    check = TaskCheck(task=task.name, oracle_reward=oracle.reward, nop_reward=nop.reward)
    if not oracle.passed:
        check.problems.append("the oracle does not pass (" + _describe("oracle", oracle) + ")")
    if nop.passed:
        check.problems.append("doing nothing passes: the tests check too little")
    elif nop.error is not None and nop.error.kind != "verifier":
        check.problems.append(_describe("nop", nop))
    return check


async def check_tasks(
    paths: list[Path], sandbox: SandboxConfig, concurrency: int = 4
) -> tuple[list[TaskCheck], list[str]]:
    tasks, errors = await asyncio.to_thread(discover, paths)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: EvalTask) -> TaskCheck:
        async with semaphore:
            return await check_task(task, sandbox, pool)

    async with SlotPool(
        PoolConfig(max_size=2 * concurrency), labels={"clotho.run": "check"}
    ) as pool:
        checks = await asyncio.gather(*(one(t) for t in tasks))
    return list(checks), [str(e) for _, e in errors]
