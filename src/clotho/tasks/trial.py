"""One attempt at one task: sandbox, workspace, agent, verifier, cleanup."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from pydantic import BaseModel, Field

from clotho.agent.base import Agent, AgentContext
from clotho.agent.result import AgentResult
from clotho.errors import ClothoError, ErrorKind
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.factory import open_sandbox
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import Task
from clotho.tasks.images import COMPOSE_FILES
from clotho.tasks.verify import VerifierOutcome, run_verifier

log = logging.getLogger(__name__)

# Files of environment/ that describe how to build a container, not workspace content.
BUILD_FILES = ("Dockerfile", ".dockerignore", *COMPOSE_FILES)


class ErrorInfo(BaseModel):
    kind: ErrorKind
    message: str


class TrialOutcome(BaseModel):
    reward: float | None = None
    rewards: dict[str, float] = Field(default_factory=dict)
    passed: bool = False
    error: ErrorInfo | None = None
    agent: AgentResult | None = None
    verifier: VerifierOutcome | None = None
    phase: Literal["setup", "agent", "verify", "done"] = "setup"
    duration_s: float = 0.0


async def setup_workspace(task: Task, sandbox: Sandbox, config: SandboxConfig) -> None:
    """The files of environment/ (other than build files) become the workspace.

    A container built from the task's Dockerfile already has its workspace.
    """
    env_dir = task.environment_dir
    if not env_dir.is_dir():
        return
    if isinstance(config, DockerSandboxConfig) and (
        (env_dir / "Dockerfile").is_file() or any((env_dir / n).is_file() for n in COMPOSE_FILES)
    ):
        return
    await sandbox.upload(env_dir, sandbox.workdir)
    present = [name for name in BUILD_FILES if (env_dir / name).exists()]
    if present:
        await sandbox.exec("rm -f -- " + " ".join(present), timeout=30)


async def run_trial(
    task: Task,
    agent: Agent,
    sandbox_config: SandboxConfig,
    *,
    task_timeout_s: float | None = None,
    labels: dict[str, str] | None = None,
    pass_threshold: float = 1.0,
    pool: SlotPool | None = None,
) -> TrialOutcome:
    """Never raises for the task's or the agent's failures; they are recorded in the outcome."""
    outcome = TrialOutcome()
    started = time.perf_counter()
    try:
        async with asyncio.timeout(task_timeout_s):
            await _attempt(task, agent, sandbox_config, outcome, labels or {}, pool)
    except TimeoutError:
        outcome.error = ErrorInfo(
            kind="agent",
            message=f"task wall-clock limit of {task_timeout_s:g} s reached during {outcome.phase}",
        )
    except ClothoError as exc:
        outcome.error = ErrorInfo(kind=exc.kind, message=str(exc))
    except Exception as exc:
        log.exception("internal error in trial of %s", task.name)
        outcome.error = ErrorInfo(
            kind="infra", message=f"internal error: {type(exc).__name__}: {exc}"
        )
    if outcome.verifier is not None:
        outcome.reward = outcome.verifier.reward
        outcome.rewards = outcome.verifier.rewards
        outcome.passed = outcome.error is None and outcome.reward >= pass_threshold
    outcome.duration_s = time.perf_counter() - started
    return outcome


async def _attempt(
    task: Task,
    agent: Agent,
    sandbox_config: SandboxConfig,
    outcome: TrialOutcome,
    labels: dict[str, str],
    pool: SlotPool | None,
) -> None:
    labels = {**labels, "clotho.task": task.name}
    if pool is not None:
        sandbox = await pool.acquire(sandbox_config, labels=labels)
    else:
        sandbox = await open_sandbox(sandbox_config, labels)
    try:
        await setup_workspace(task, sandbox, sandbox_config)
        outcome.phase = "agent"
        context = AgentContext(
            instruction=task.instruction,
            sandbox=sandbox,
            time_limit_s=task.config.agent.timeout_sec,
            solution_dir=task.solution_dir if task.solution_dir.is_dir() else None,
        )
        outcome.agent = await agent.run(context)
        if outcome.agent.stop_reason == "model_error":
            outcome.error = ErrorInfo(kind="infra", message=outcome.agent.error or "model error")
            return
        outcome.phase = "verify"
        outcome.verifier = await run_verifier(task, sandbox)
        outcome.phase = "done"
    finally:
        if pool is not None:
            await asyncio.shield(pool.release(sandbox))
        else:
            await asyncio.shield(sandbox.close())
