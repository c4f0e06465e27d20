"""One attempt at one task as a rollout: a Harbor task's workspace, instruction and tests, and
the attempt of any `EvalTask` in a sandbox its backend prepared."""

from __future__ import annotations

from typing import Unpack

from clotho.agent.base import Agent
from clotho.agent.result import AgentResult
from clotho.rollout import RolloutOutcome, RolloutSpec, VerifierOutcome, run_rollout
from clotho.rollout.run import SETUP_MARGIN_S
from clotho.sandbox import EnvironmentSpec, PreparedEnvironment, Sandbox, SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.base import EvalTask, TrialOptions
from clotho.tasks.environment import environment_spec, upload_workspace
from clotho.tasks.harbor import Task
from clotho.tasks.verify import program_digests, run_verifier
from clotho.verify.integrity import ProgramDigests


class HarborTrial:
    """A Harbor task as an `EvalTask`: its environment/, instruction.md and tests/."""

    def __init__(self, task: Task) -> None:
        self.task = task

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def category(self) -> str:
        return self.task.category

    def environment_spec(self) -> EnvironmentSpec:
        return environment_spec(self.task)

    def rollout(
        self, agent: Agent, prepared: PreparedEnvironment, **options: Unpack[TrialOptions]
    ) -> RolloutSpec:
        task = self.task
        timeout_s = options.get("timeout_s")
        baseline: list[ProgramDigests] = []  # taken in the sandbox before the agent starts

        async def prepare(sandbox: Sandbox) -> None:
            if not prepared.workspace_in_image:
                await upload_workspace(task, sandbox)
            baseline.append(await program_digests(task, sandbox))

        async def verify(sandbox: Sandbox, result: AgentResult) -> VerifierOutcome:
            return await run_verifier(task, sandbox, baseline[-1])

        return RolloutSpec(
            sandbox=prepared.config,
            agent=agent,
            instruction=lambda: task.instruction,
            prepare=prepare,
            verify=verify,
            labels={**options.get("labels", {}), "clotho.task": task.name},
            timeout_s=timeout_s if timeout_s is not None else default_timeout_s(task),
            agent_time_limit_s=task.config.agent.timeout_sec,
            solution_dir=task.solution_dir if task.solution_dir.is_dir() else None,
            pass_threshold=options.get("pass_threshold", 1.0),
        )


def default_timeout_s(task: Task) -> float:
    """Every trial has a wall-clock limit: the task's agent and verifier limits, plus setup."""
    return task.config.agent.timeout_sec + task.config.verifier.timeout_sec + SETUP_MARGIN_S


async def run_trial(
    task: EvalTask,
    agent: Agent,
    base: SandboxConfig,
    pool: SlotPool,
    **options: Unpack[TrialOptions],
) -> RolloutOutcome:
    """Prepare the task's sandbox (its image, its limits) and run one rollout in it."""
    try:
        prepared = await pool.prepare(base, task.environment_spec())
    except Exception as exc:
        return RolloutOutcome.failed(exc, "environment")
    return await run_rollout(task.rollout(agent, prepared, **options), pool)
