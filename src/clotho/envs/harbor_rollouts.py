"""The rollout half of an environment whose items are Harbor tasks (`terminal_tasks`,
`endless`): each task's sandbox is prepared once, and each rollout is the very attempt
`clotho eval` makes (`HarborTrial.rollout`: the workspace, program digests taken before the
agent, the task's agent and verifier limits, its wall clock, the tamper-checked verifier)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clotho.rollout import RolloutSpec
from clotho.sandbox import PreparedEnvironment, SandboxConfig
from clotho.tasks.harbor import Task
from clotho.tasks.trial import HarborTrial
from clotho.tools.tool import Tool

if TYPE_CHECKING:
    from clotho.agent.llm import LLMAgent


class HarborRollouts:
    """Mixin (before `Environment` in the bases); call `_init_rollouts()` in `setup`."""

    _prepared: dict[Path, PreparedEnvironment]  # by task folder

    if TYPE_CHECKING:

        def agent(self, tools: Sequence[Tool]) -> LLMAgent: ...

    def _init_rollouts(self) -> None:
        self._prepared = {}

    def format_prompt(self, item: Task) -> str:
        return item.instruction

    def sandbox_config(self, item: Task) -> SandboxConfig:
        return self._prepared[item.path].config

    def rollout_spec(self, item: Task, tools: Sequence[Tool]) -> RolloutSpec:
        spec = HarborTrial(item).rollout(self.agent(tools), self._prepared[item.path])
        spec.solution_dir = None  # the model's agent never sees the reference solution
        return spec
