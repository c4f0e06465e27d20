"""Tools the agent calls; all of them act inside the rollout's sandbox."""

from clotho.tools.builtin import default_registry
from clotho.tools.registry import ToolRegistry, Toolset, ToolsetDistribution
from clotho.tools.runtime import ToolFailure, ToolRuntime
from clotho.tools.tool import Tool, tool

__all__ = [
    "Tool",
    "ToolFailure",
    "ToolRegistry",
    "ToolRuntime",
    "Toolset",
    "ToolsetDistribution",
    "default_registry",
    "tool",
]
