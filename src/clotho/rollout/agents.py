"""The one place agents are built: `clotho eval` and every environment (`process`, `serve`,
`evaluate`) get their model's agent from `llm_agent`, so limits and the system prompt mean
the same on both paths. An installed agent's name (`clotho.installed_agents.agent_names`)
builds an `InstalledAgentRunner` behind one `Gateway` over the same model `llm` would use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from clotho.agent.base import Agent
from clotho.agent.llm import DEFAULT_SYSTEM_PROMPT, LLMAgent
from clotho.agent.loop import AgentLimits
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.chat.client import ModelConfig
from clotho.chat.models import Model, ModelSession, build_model
from clotho.gateway.record import GatewayLimits
from clotho.gateway.server import Gateway
from clotho.installed_agents.base import InstalledAgentRunner
from clotho.tools.builtin import ToolsConfig, default_registry
from clotho.tools.tool import Tool

# clotho's own agents; any other name is an installed agent's (`installed_agents`).
OwnAgentKind = Literal["llm", "oracle", "nop"]
OWN_AGENTS: tuple[str, ...] = ("llm", "oracle", "nop")
AgentKind = str


def agent_kinds() -> list[str]:
    """Every name `--agent` takes: clotho's own, then the registered installed agents."""
    from clotho.installed_agents import agent_names

    return [*OWN_AGENTS, *agent_names()]


class GatewayModel:
    """The model of a run of installed agents: its gateway and the client behind it, closed
    together at the end of the run (the listeners first, then the client)."""

    def __init__(self, gateway: Gateway, client: Model) -> None:
        self.gateway = gateway
        self.client = client

    def session(self) -> ModelSession:
        return self.client.session()

    async def aclose(self) -> None:
        try:
            await self.gateway.aclose()
        finally:
            await self.client.aclose()


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
    tools_config: ToolsConfig | None = None,
) -> tuple[Agent, Model | None]:
    """An agent by name, and the model client to close afterwards (None for the reference
    agents). No endpoint configured: the embedded local model. An installed agent's name:
    its runner, its model calls through one gateway for the run, `max_turns` its budget of
    model calls per attempt (`system_prompt`, `toolsets` and `tools_config` are clotho's own
    agent's)."""
    if kind == "oracle":
        return OracleAgent(), None
    if kind == "nop":
        return NopAgent(), None
    if kind != "llm":
        from clotho.installed_agents import installed_agent

        adapter = installed_agent(kind)  # a ConfigError naming the known ones
        config = model or ModelConfig()
        client = await build_model(config)
        closing = GatewayModel(Gateway(client, model_name=config.model), client)
        runner = InstalledAgentRunner(adapter, closing.gateway, GatewayLimits(max_turns=max_turns))
        return runner, closing
    # The toolsets first: one that cannot work here (no key, provider unreachable) is a
    # ConfigError before any model is loaded.
    tools = await default_registry(tools_config).prepare(toolsets)
    client = await build_model(model or ModelConfig())
    agent = llm_agent(
        client,
        tools,
        max_turns=max_turns,
        system_prompt=system_prompt,
        command_timeout_s=command_timeout_s,
    )
    return agent, client
