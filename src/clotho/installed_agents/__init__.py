"""Third-party agent CLIs (mini-swe-agent, ...) run in the task's sandbox behind the model
gateway: adapters, their host-side installs and the `Agent` that runs them (base.py)."""

from clotho.installed_agents.base import (
    AgentInstall,
    InstalledAgent,
    InstalledAgentRunner,
    InstalledRun,
    agent_names,
    installed_agent,
    register_agent,
)

__all__ = [
    "AgentInstall",
    "InstalledAgent",
    "InstalledAgentRunner",
    "InstalledRun",
    "agent_names",
    "installed_agent",
    "register_agent",
]
