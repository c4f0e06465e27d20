"""The rollout half of an environment whose items are Harbor tasks (`terminal_tasks`,
`endless`): the instruction is the prompt, each task's sandbox is prepared once, and every
rollout is verified in its own sandbox by the tamper-checked verifier, with the program
digests taken before its agent started."""

from __future__ import annotations

from pathlib import Path
from weakref import WeakKeyDictionary

from clotho.agent.result import AgentResult
from clotho.rollout import VerifierOutcome
from clotho.sandbox import PreparedEnvironment, Sandbox, SandboxConfig
from clotho.tasks.environment import upload_workspace
from clotho.tasks.harbor import Task
from clotho.tasks.verify import ProgramDigests, program_digests, run_verifier


class HarborRollouts:
    """Mixin (before `Environment` in the bases); call `_init_rollouts()` in `setup`."""

    _prepared: dict[Path, PreparedEnvironment]  # by task folder
    _baselines: WeakKeyDictionary[Sandbox, ProgramDigests]

    def _init_rollouts(self) -> None:
        self._prepared = {}
        # Per sandbox, taken before its agent started; gone with the sandbox.
        self._baselines = WeakKeyDictionary()

    def format_prompt(self, item: Task) -> str:
        return item.instruction

    def sandbox_config(self, item: Task) -> SandboxConfig:
        return self._prepared[item.path].config

    async def setup_workspace(self, item: Task, sandbox: Sandbox) -> None:
        if not self._prepared[item.path].workspace_in_image:
            await upload_workspace(item, sandbox)
        self._baselines[sandbox] = await program_digests(item, sandbox)

    async def verify(self, item: Task, result: AgentResult, sandbox: Sandbox) -> VerifierOutcome:
        """The task's tests on what this rollout's agent left in its own sandbox."""
        return await run_verifier(item, sandbox, self._baselines.pop(sandbox, None))
