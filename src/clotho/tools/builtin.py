"""The built-in tools, toolsets and distributions, in a fresh registry per caller."""

from __future__ import annotations

from clotho.tools.files import edit_file, read_file, search_files, write_file
from clotho.tools.registry import ToolRegistry, Toolset, ToolsetDistribution
from clotho.tools.terminal import terminal


def default_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for t in (terminal, read_file, write_file, edit_file, search_files):
        registry.add_tool(t)
    registry.add_toolset(Toolset(name="terminal", tools=["terminal"], description="shell"))
    registry.add_toolset(
        Toolset(
            name="file",
            tools=["read_file", "write_file", "edit_file", "search_files"],
            description="read, write, edit and search files",
        )
    )
    registry.add_toolset(Toolset(name="coding", includes=["terminal", "file"]))
    registry.add_distribution(
        ToolsetDistribution(name="terminal_only", probabilities={"terminal": 1.0})
    )
    registry.add_distribution(
        ToolsetDistribution(name="development", probabilities={"terminal": 0.8, "file": 0.8})
    )
    return registry
