"""The model agent: a system prompt, the task instruction, tools, and the agent loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clotho.agent.base import AgentContext
from clotho.agent.loop import AgentLimits, AgentLoop
from clotho.agent.result import AgentResult
from clotho.chat.models import Model
from clotho.tools.runtime import ToolRuntime
from clotho.tools.tool import Tool

DEFAULT_SYSTEM_PROMPT = """\
You are an expert engineer working in a Linux terminal to complete a task.
Use the tools to inspect the environment, make the changes and check your work.
The task's working directory is {workdir}. When the task is complete, reply with a short
summary and no tool calls."""


class LLMAgent:
    name = "llm"

    def __init__(
        self,
        model: Model,
        tools: Sequence[Tool],
        limits: AgentLimits | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        max_output_chars: int = 16_000,
        command_timeout_s: float | None = None,
    ) -> None:
        self.model = model
        self.tools = list(tools)
        self.limits = limits or AgentLimits()
        self.system_prompt = system_prompt
        self.max_output_chars = max_output_chars
        self.command_timeout_s = command_timeout_s  # each command's default and cap

    async def run(self, ctx: AgentContext) -> AgentResult:
        limits = self.limits
        if ctx.time_limit_s is not None:
            own = limits.time_limit_s
            limits = limits.model_copy(
                update={"time_limit_s": min(own, ctx.time_limit_s) if own else ctx.time_limit_s}
            )
        runtime = ToolRuntime(sandbox=ctx.sandbox, max_output_chars=self.max_output_chars)
        if self.command_timeout_s is not None:
            runtime.default_timeout_s = runtime.max_timeout_s = self.command_timeout_s
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append(
                {
                    "role": "system",
                    "content": self.system_prompt.format(workdir=ctx.sandbox.workdir),
                }
            )
        messages.append({"role": "user", "content": ctx.instruction})
        session = self.model.session()  # a token backend keeps one ledger per run
        return await AgentLoop(session, self.tools, runtime, limits).run(
            messages, into=ctx.transcript
        )
