"""The one place agents are built: `clotho eval` and every environment (`process`, `serve`,
`evaluate`) get their model's agent from `llm_agent`, so limits and the system prompt mean
the same on both paths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from clotho.agent.base import Agent
from clotho.agent.llm import DEFAULT_SYSTEM_PROMPT, LLMAgent
from clotho.agent.loop import AgentLimits
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.chat.client import ModelConfig
from clotho.chat.models import Model, build_model
from clotho.tools.builtin import default_registry
from clotho.tools.tool import Tool

AgentKind = Literal["llm", "oracle", "nop"]


def llm_agent(
    model: Model,
    tools: Sequence[Tool],
    *,
    max_turns: int,
    time_limit_s: float | None = None,
    max_total_tokens: int | None = None,
    system_prompt: str | None = None,
    command_timeout_s: float | None = None,
) -> LLMAgent:
    """The model's agent of one attempt (no system prompt given: the default one)."""
    limits = AgentLimits(
        max_turns=max_turns, time_limit_s=time_limit_s, max_total_tokens=max_total_tokens
    )
    return LLMAgent(
        model,
        tools,
        limits,
        system_prompt=system_prompt or DEFAULT_SYSTEM_PROMPT,
        command_timeout_s=command_timeout_s,
    )


async def build_agent(
    kind: AgentKind,
    model: ModelConfig | None,
    toolsets: list[str] | None,
    *,
    max_turns: int,
    system_prompt: str | None = None,
    command_timeout_s: float | None = None,
) -> tuple[Agent, Model | None]:
    """An agent by name, and the model client to close afterwards (None for the reference
    agents). No endpoint configured: the embedded local model."""
    if kind == "oracle":
        return OracleAgent(), None
    if kind == "nop":
        return NopAgent(), None
    client = await build_model(model or ModelConfig())
    tools = default_registry().resolve(toolsets)
    agent = llm_agent(
        client,
        tools,
        max_turns=max_turns,
        system_prompt=system_prompt,
        command_timeout_s=command_timeout_s,
    )
    return agent, client
