"""Harbor / Terminal-Bench task directories as an RL environment (the bundled examples by
default): the instruction is the prompt, the task's own tests are the reward."""

from __future__ import annotations

import asyncio
import hashlib
import random
from pathlib import Path
from typing import Any, ClassVar
from weakref import WeakKeyDictionary

from pydantic import Field

from clotho.agent.result import AgentResult
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.evaluation import EvalSample
from clotho.errors import ConfigError
from clotho.rollout import VerifierOutcome
from clotho.sandbox import PreparedEnvironment, Sandbox, SandboxConfig
from clotho.tasks.environment import environment_spec, upload_workspace
from clotho.tasks.harbor import Task, discover_tasks
from clotho.tasks.verify import ProgramDigests, program_digests, run_verifier

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
        self.tasks = await self._load(self.config.tasks)
        self.eval_tasks = (
            await self._load(self.config.eval_tasks) if self.config.eval_tasks else self.tasks
        )
        self._order: list[Task] = []
        self._epoch = 0  # passes through the tasks begun
        names = "\n".join(t.name for t in self.tasks).encode()
        self._tasks_digest = hashlib.sha256(names).hexdigest()[:16]
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
    async def _load(paths: list[str]) -> list[Task]:
        tasks, errors = await asyncio.to_thread(discover_tasks, [Path(p) for p in paths])
        if errors:
            raise ConfigError("; ".join(str(e) for _, e in errors))
        if not tasks:
            raise ConfigError(f"no tasks under {paths}")
        return tasks

    def _epoch_order(self, epoch: int) -> list[Task]:
        """The tasks of one pass, shuffled by (seed, epoch) alone: the order never depends on
        what else drew from `rng`, and a resume rebuilds it from two numbers."""
        order = list(self.tasks)
        if self.config.shuffle:
            random.Random(f"{self.config.seed}/{epoch}").shuffle(order)
        return order

    async def get_next_item(self) -> Task:
        if not self._order:
            self._epoch += 1
            self._order = self._epoch_order(self._epoch)
        return self._order.pop()

    def state_dict(self) -> dict[str, Any]:
        """The pass and how many of its tasks are left (popped from the end)."""
        return {
            **super().state_dict(),
            "tasks": self._tasks_digest,
            "epoch": self._epoch,
            "left": len(self._order),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("tasks") != self._tasks_digest:
            raise ConfigError(
                "the serve state was saved for another task set (names or order differ): "
                "resuming it would repeat or skip tasks; use a new --state-dir"
            )
        epoch, left = state.get("epoch"), state.get("left")
        if not isinstance(epoch, int) or not isinstance(left, int) or epoch < 0 or left < 0:
            raise ConfigError(f"epoch/left in the serve state are {epoch!r}/{left!r}")
        if left > len(self.tasks) or (epoch == 0 and left):
            raise ConfigError(f"the serve state has {left} tasks left of {len(self.tasks)}")
        self._epoch = epoch
        self._order = self._epoch_order(epoch)[:left] if epoch else []

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
