"""The built-in tools, toolsets and distributions, in a fresh registry per caller.

`terminal` and `file` need only the sandbox; `browser` needs Chromium (and python3) in it;
`web` and `vision` need a provider the user names (`ToolsConfig`): chosen without one, they
are a `ConfigError` at setup (`Toolset.check`), never tools that answer nothing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from clotho.tools.browser import BROWSER_TOOLS
from clotho.tools.files import edit_file, read_file, search_files, write_file
from clotho.tools.registry import ToolRegistry, Toolset, ToolsetDistribution
from clotho.tools.terminal import terminal
from clotho.tools.vision import VisionConfig, VisionModel, vision_tools
from clotho.tools.web import WebConfig, WebProvider, web_tools


class ToolsConfig(BaseModel):
    """Settings of the toolsets that reach beyond the sandbox."""

    model_config = ConfigDict(extra="forbid")

    web: WebConfig = Field(default_factory=WebConfig)
    vision: VisionConfig = Field(default_factory=VisionConfig)


# Toolset distributions after the seed's (each toolset drawn on its own, once per group).
DISTRIBUTIONS: dict[str, dict[str, float]] = {
    "terminal_only": {"terminal": 1.0},
    "development": {"terminal": 0.8, "file": 0.8},
    "terminal_web": {"terminal": 1.0, "file": 1.0, "web": 1.0},
    "browser_only": {"browser": 1.0},
    "browser_use": {"browser": 1.0, "web": 0.8, "vision": 0.7},
    "browser_tasks": {"browser": 0.97, "vision": 0.12, "terminal": 0.15},
    "research": {"web": 0.9, "browser": 0.7, "vision": 0.5, "terminal": 0.1},
    "mixed_tasks": {"browser": 0.92, "terminal": 0.92, "file": 0.92, "web": 0.35, "vision": 0.15},
    "balanced": {"terminal": 0.5, "file": 0.5, "browser": 0.5, "web": 0.5, "vision": 0.5},
    "everything": {"terminal": 1.0, "file": 1.0, "browser": 1.0, "web": 1.0, "vision": 1.0},
}


def default_registry(
    config: ToolsConfig | None = None, *, environ: dict[str, str] | None = None
) -> ToolRegistry:
    """Every built-in tool, toolset and distribution. `environ` replaces os.environ where the
    web and vision keys are read (tests)."""
    config = config or ToolsConfig()
    web = WebProvider(config.web, environ)
    vision = VisionModel(config.vision, environ)
    registry = ToolRegistry()
    for t in (terminal, read_file, write_file, edit_file, search_files, *BROWSER_TOOLS):
        registry.add_tool(t)
    for t in (*web_tools(web), *vision_tools(vision)):
        registry.add_tool(t)
    registry.add_toolset(
        Toolset(name="terminal", tools=["terminal"], description="shell", needs="the sandbox")
    )
    registry.add_toolset(
        Toolset(
            name="file",
            tools=["read_file", "write_file", "edit_file", "search_files"],
            description="read, write, edit and search files",
            needs="the sandbox",
        )
    )
    registry.add_toolset(Toolset(name="coding", includes=["terminal", "file"]))
    registry.add_toolset(
        Toolset(
            name="browser",
            tools=[t.name for t in BROWSER_TOOLS],
            description="a headless Chromium inside the sandbox: open, read, click, type, "
            "screenshot",
            needs="chromium and python3 in the sandbox (local backend: the host's; Docker: "
            "the image's); reaches what the sandbox's network reaches",
        )
    )
    registry.add_toolset(
        Toolset(
            name="web",
            tools=["web_search", "web_extract"],
            description="search the web and extract pages through a provider",
            needs="tools.web.base_url, the key in tools.web.api_key_env, a network",
            check=web.check,
            probe=web.probe,
        )
    )
    registry.add_toolset(
        Toolset(
            name="vision",
            tools=["analyze_image"],
            description="ask a vision model about an image file",
            needs="tools.vision.base_url and tools.vision.model (OpenAI-compatible)",
            check=vision.check,
        )
    )
    for name, probabilities in DISTRIBUTIONS.items():
        registry.add_distribution(ToolsetDistribution(name=name, probabilities=probabilities))
    return registry
