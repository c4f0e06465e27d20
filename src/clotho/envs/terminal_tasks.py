"""Harbor / Terminal-Bench task directories as an RL environment (the bundled examples by
default): the instruction is the prompt, the task's own tests are the reward."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from clotho.agent.result import AgentResult
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.evaluation import EvalSample
from clotho.errors import ConfigError
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.tasks.harbor import Task, discover_tasks
from clotho.tasks.images import ImageResolver, task_sandbox_config
from clotho.tasks.trial import setup_workspace
from clotho.tasks.verify import run_verifier

BUNDLED = Path(__file__).resolve().parents[3] / "examples" / "tasks"


class TerminalTasksConfig(EnvConfig):
    tasks: list[str] = Field(default_factory=lambda: [str(BUNDLED)])
    eval_tasks: list[str] | None = Field(None, description="default: the training tasks")
    shuffle: bool = True


class TerminalTasksEnv(Environment[Task]):
    name: ClassVar[str] = "terminal_tasks"
    config_cls: ClassVar[type[EnvConfig]] = TerminalTasksConfig
    config: TerminalTasksConfig

    async def setup(self) -> None:
        self.tasks = self._load(self.config.tasks)
        self.eval_tasks = (
            self._load(self.config.eval_tasks) if self.config.eval_tasks else self.tasks
        )
        self._order: list[Task] = []
        self._configs: dict[str, SandboxConfig] = {}
        if isinstance(self.config.sandbox, DockerSandboxConfig):
            # Task images are built (once per content) before the first rollout needs them.
            resolver = ImageResolver(self._require_pool().docker)
            for task in {t.name: t for t in [*self.tasks, *self.eval_tasks]}.values():
                self._configs[task.name] = await task_sandbox_config(
                    task, self.config.sandbox, resolver
                )

    @staticmethod
    def _load(paths: list[str]) -> list[Task]:
        tasks, errors = discover_tasks([Path(p) for p in paths])
        if errors:
            raise ConfigError("; ".join(str(e) for _, e in errors))
        if not tasks:
            raise ConfigError(f"no tasks under {paths}")
        return tasks

    async def get_next_item(self) -> Task:
        if not self._order:
            self._order = list(self.tasks)
            if self.config.shuffle:
                self.rng.shuffle(self._order)
        return self._order.pop()

    def format_prompt(self, item: Task) -> str:
        return item.instruction

    def sandbox_config(self, item: Task) -> SandboxConfig:
        return self._configs.get(item.name, self.config.sandbox)

    async def setup_workspace(self, item: Task, sandbox: Sandbox) -> None:
        await setup_workspace(item, sandbox, self.sandbox_config(item))

    async def verify(self, item: Task, result: AgentResult, sandbox: Sandbox) -> float:
        return (await run_verifier(item, sandbox)).reward

    async def evaluate(self) -> list[EvalSample]:
        import asyncio

        tools = self.resolve_tools()
        semaphore = asyncio.Semaphore(self.config.eval_concurrency)

        async def one(task: Task) -> EvalSample:
            async with semaphore:
                rollout = await self.rollout(task, tools)
            return EvalSample(name=task.name, category=task.category, rollout=rollout)

        return list(await asyncio.gather(*(one(t) for t in self.eval_tasks)))
