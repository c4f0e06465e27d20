"""Harbor / Terminal-Bench task directories as an RL environment (the bundled examples by
default): the instruction is the prompt, the task's own tests are the reward."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar
from weakref import WeakKeyDictionary

from pydantic import Field

from clotho.agent.result import AgentResult
from clotho.data import DatasetSource
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.evaluation import EvalSample
from clotho.env.pass_order import PassOrder
from clotho.errors import ConfigError
from clotho.rollout import VerifierOutcome
from clotho.sandbox import PreparedEnvironment, Sandbox, SandboxConfig
from clotho.tasks.discover import discover_harbor
from clotho.tasks.environment import environment_spec, upload_workspace
from clotho.tasks.harbor import Task
from clotho.tasks.verify import ProgramDigests, program_digests, run_verifier

BUNDLED = Path(__file__).resolve().parents[3] / "examples" / "tasks"


class TerminalTasksConfig(EnvConfig):
    tasks: list[str | DatasetSource] = Field(
        default_factory=lambda: [str(BUNDLED)],
        description="task folders, Terminal-Bench rows files (.jsonl/.json/.parquet), "
        "`hf:NAME?split=...` row datasets, or dataset sources ({path|hub, fields, ...})",
    )
    eval_tasks: list[str | DatasetSource] | None = Field(
        None, description="like `tasks`; default: the training tasks"
    )
    shuffle: bool = True


class TerminalTasksEnv(Environment[Task]):
    name: ClassVar[str] = "terminal_tasks"
    config_cls: ClassVar[type[EnvConfig]] = TerminalTasksConfig
    config: TerminalTasksConfig

    async def setup(self) -> None:
        self.tasks = await self._load(self.config.tasks)
        self.eval_tasks = (
            await self._load(self.config.eval_tasks) if self.config.eval_tasks else self.tasks
        )
        self._order = PassOrder(
            self.tasks, lambda t: t.name, seed=self.config.seed, shuffle=self.config.shuffle
        )
        # Each task's sandbox (its image built once per content, its limits) before the first
        # rollout needs it; the backend decides what that takes.
        pool = self._require_pool()
        self._prepared: dict[str, PreparedEnvironment] = {}
        # Per sandbox, taken before its agent started; gone with the sandbox.
        self._baselines: WeakKeyDictionary[Sandbox, ProgramDigests] = WeakKeyDictionary()
        for task in {t.name: t for t in [*self.tasks, *self.eval_tasks]}.values():
            self._prepared[task.name] = await pool.prepare(
                self.config.sandbox, environment_spec(task)
            )

    @staticmethod
    async def _load(sources: list[str | DatasetSource]) -> list[Task]:
        tasks, errors = await asyncio.to_thread(discover_harbor, list(sources))
        if errors:
            raise ConfigError("; ".join(str(e) for _, e in errors))
        if not tasks:
            raise ConfigError(f"no tasks under {sources}")
        return tasks

    async def get_next_item(self) -> Task:
        return self._order.next()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "order": self._order.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        order = state.get("order")
        if not isinstance(order, dict):
            raise ConfigError("the serve state has no task order (saved by another version?)")
        self._order.load_state_dict(order)

    def format_prompt(self, item: Task) -> str:
        return item.instruction

    def sandbox_config(self, item: Task) -> SandboxConfig:
        return self._prepared[item.name].config

    async def setup_workspace(self, item: Task, sandbox: Sandbox) -> None:
        if not self._prepared[item.name].workspace_in_image:
            await upload_workspace(item, sandbox)
        self._baselines[sandbox] = await program_digests(item, sandbox)

    async def verify(self, item: Task, result: AgentResult, sandbox: Sandbox) -> VerifierOutcome:
        return await run_verifier(item, sandbox, self._baselines.pop(sandbox, None))

    async def evaluate(self) -> list[EvalSample]:
        tools = self.resolve_tools()
        semaphore = asyncio.Semaphore(self.config.eval_concurrency)

        async def one(task: Task) -> EvalSample:
            async with semaphore:
                rollout = await self.rollout(task, tools)
            return EvalSample(name=task.name, category=task.category, rollout=rollout)

        return list(await asyncio.gather(*(one(t) for t in self.eval_tasks)))
