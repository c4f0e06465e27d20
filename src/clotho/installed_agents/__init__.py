"""Third-party agent CLIs (mini-swe-agent, codex, claude-code, opencode) run in the task's
sandbox behind the model gateway: adapters, their host-side installs and the `Agent` that runs
them (base.py). The bundled adapters register themselves when this package is imported."""

# The bundled adapters, imported to register.
from clotho.installed_agents import claude_code, codex, mini_swe_agent, opencode  # noqa: F401
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
