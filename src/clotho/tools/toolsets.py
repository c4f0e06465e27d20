# transitional: removed once env/ imports ToolRegistry from clotho.tools.registry
from clotho.tools.registry import ToolRegistry, Toolset, ToolsetDistribution  # noqa: F401
