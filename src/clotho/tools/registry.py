"""`ToolRegistry`: the tools of one process or environment, toolsets (named groups of tools,
with includes) and toolset distributions (sampled per group)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterable

from pydantic import BaseModel, Field, field_validator

from clotho.errors import ConfigError
from clotho.tools.tool import Tool


class Toolset(BaseModel):
    name: str
    tools: list[str] = Field(default_factory=list)
    includes: list[str] = Field(default_factory=list)
    description: str = ""
    needs: str = Field("", description="what it needs to work, for people (README, errors)")
    check: Callable[[], None] | None = Field(
        None,
        exclude=True,
        description="raises ConfigError when the toolset cannot work here (no provider, no "
        "key): run whenever it is chosen, so a run fails at setup, not mid-rollout",
    )
    probe: Callable[[], Awaitable[None]] | None = Field(
        None,
        exclude=True,
        description="the check that needs I/O (is the provider reachable: a network?), "
        "awaited by `ToolRegistry.prepare` at setup",
    )


class ToolsetDistribution(BaseModel):
    """Each toolset is included independently with its probability; sampled once per group."""

    name: str
    probabilities: dict[str, float]

    @field_validator("probabilities")
    @classmethod
    def _check(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("a distribution needs at least one toolset")
        for key, p in value.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"probability of {key!r} must be within [0, 1], got {p}")
        if max(value.values()) <= 0.0:
            raise ValueError("at least one toolset needs a probability above 0")
        return value

    def sample(self, rng: random.Random) -> list[str]:
        """Never empty: if nothing was drawn, the most likely toolset is used."""
        chosen = [name for name, p in self.probabilities.items() if rng.random() < p]
        if not chosen:
            chosen = [max(self.probabilities, key=lambda k: self.probabilities[k])]
        return chosen


class ToolRegistry:
    """Tools and toolsets of one process or environment; nothing here is global."""

    def __init__(self) -> None:
        self.tools: dict[str, Tool] = {}
        self.toolsets: dict[str, Toolset] = {}
        self.distributions: dict[str, ToolsetDistribution] = {}

    def add_tool(self, tool: Tool) -> Tool:
        if tool.name in self.tools:
            raise ConfigError(f"tool {tool.name!r} is registered twice")
        self.tools[tool.name] = tool
        return tool

    def add_toolset(self, toolset: Toolset) -> Toolset:
        self.toolsets[toolset.name] = toolset
        return toolset

    def add_distribution(self, distribution: ToolsetDistribution) -> ToolsetDistribution:
        unknown = set(distribution.probabilities) - set(self.toolsets)
        if unknown:
            raise ConfigError(
                f"distribution {distribution.name!r}: unknown toolsets {sorted(unknown)}"
            )
        self.distributions[distribution.name] = distribution
        return distribution

    def toolset_tools(
        self, name: str, _seen: frozenset[str] = frozenset(), *, check: bool = False
    ) -> list[str]:
        """The toolset's tool names, includes resolved; `check` runs each toolset's check."""
        if name not in self.toolsets:
            raise ConfigError(f"unknown toolset {name!r}; known: {sorted(self.toolsets)}")
        if name in _seen:
            raise ConfigError(f"toolset {name!r} includes itself")
        toolset = self.toolsets[name]
        if check and toolset.check is not None:
            toolset.check()
        names = list(toolset.tools)
        for included in toolset.includes:
            names += self.toolset_tools(included, _seen | {name}, check=check)
        return list(dict.fromkeys(names))

    def resolve(
        self, enabled: Iterable[str] | None = None, disabled: Iterable[str] | None = None
    ) -> list[Tool]:
        """Tools of the enabled toolsets (all when None) minus those of the disabled ones.
        An enabled toolset that cannot work here (its check) is a `ConfigError`, never
        silently left out; a disabled one is not checked."""
        enabled_names = list(enabled) if enabled is not None else list(self.toolsets)
        disabled_names = set(disabled or [])
        wanted: list[str] = []
        for name in enabled_names:
            wanted += self.toolset_tools(name, check=name not in disabled_names)
        removed: set[str] = set()
        for name in disabled or []:
            removed |= set(self.toolset_tools(name))
        result = []
        for tool_name in dict.fromkeys(wanted):
            if tool_name in removed:
                continue
            if tool_name not in self.tools:
                raise ConfigError(f"toolset refers to unknown tool {tool_name!r}")
            result.append(self.tools[tool_name])
        return result

    async def prepare(
        self, enabled: Iterable[str] | None = None, disabled: Iterable[str] | None = None
    ) -> list[Tool]:
        """`resolve`, then each chosen toolset's probe (I/O, off the event loop's back): the
        setup-time verdict that a provider is reachable."""
        enabled_names = list(enabled) if enabled is not None else list(self.toolsets)
        tools = self.resolve(enabled_names, disabled)
        await self.probe([n for n in enabled_names if n not in set(disabled or [])])
        return tools

    async def probe(self, names: Iterable[str]) -> None:
        """Await the probes of the named toolsets and of those they include, once each."""
        seen: set[str] = set()
        pending = list(names)
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name not in self.toolsets:
                raise ConfigError(f"unknown toolset {name!r}; known: {sorted(self.toolsets)}")
            toolset = self.toolsets[name]
            pending += toolset.includes
            if toolset.probe is not None:
                await toolset.probe()

    async def prepare_distribution(
        self, distribution: str, disabled: Iterable[str] | None = None
    ) -> None:
        """Check and probe every toolset a distribution can draw, once, at setup."""
        if distribution not in self.distributions:
            raise ConfigError(
                f"unknown toolset distribution {distribution!r}; known: {sorted(self.distributions)}"
            )
        names = [n for n, p in self.distributions[distribution].probabilities.items() if p > 0]
        await self.prepare(names, disabled)

    def sample(
        self, distribution: str, rng: random.Random, disabled: Iterable[str] | None = None
    ) -> list[Tool]:
        if distribution not in self.distributions:
            raise ConfigError(
                f"unknown toolset distribution {distribution!r}; known: {sorted(self.distributions)}"
            )
        return self.resolve(self.distributions[distribution].sample(rng), disabled)
