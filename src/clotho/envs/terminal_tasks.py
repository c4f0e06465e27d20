"""Harbor / Terminal-Bench task directories as an RL environment (the bundled examples by
default): the instruction is the prompt, the task's own tests are the reward."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from clotho.data import DatasetSource
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.pass_order import PassOrder, PassOrdered
from clotho.envs.harbor_rollouts import HarborRollouts
from clotho.errors import ConfigError
from clotho.tasks.discover import discover_harbor
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import Task

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


class TerminalTasksEnv(HarborRollouts, PassOrdered, Environment[Task]):
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
        # rollout needs it, several at a time; the backend decides what that takes.
        self._init_rollouts()
        tasks = {t.path: t for t in [*self.tasks, *self.eval_tasks]}
        self._prepared = await self.prepare_environments(
            {path: environment_spec(task) for path, task in tasks.items()}
        )

    @staticmethod
    async def _load(sources: list[str | DatasetSource]) -> list[Task]:
        tasks, errors = await asyncio.to_thread(discover_harbor, list(sources))
        if errors:
            raise ConfigError("; ".join(str(e) for _, e in errors))
        if not tasks:
            raise ConfigError(f"no tasks under {sources}")
        return tasks

    async def evaluation_items(self) -> list[Task]:
        return self.eval_tasks

    def sample_label(self, item: Task) -> tuple[str, str]:
        return item.name, item.category
