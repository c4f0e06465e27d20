"""Agents: the model-driven loop and the reference agents."""

from clotho.agent.base import Agent, AgentContext
from clotho.agent.llm import LLMAgent
from clotho.agent.loop import AgentLimits, AgentLoop
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.agent.result import AgentResult, ToolErrorRecord

__all__ = [
    "Agent",
    "AgentContext",
    "AgentLimits",
    "AgentLoop",
    "AgentResult",
    "LLMAgent",
    "NopAgent",
    "OracleAgent",
    "ToolErrorRecord",
]
