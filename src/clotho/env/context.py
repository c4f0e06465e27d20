"""`ToolContext`: reward code works in the very sandbox the agent used, asynchronously."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from clotho.errors import describe_validation_error
from clotho.sandbox.base import ExecResult, Sandbox
from clotho.tools.registry import ToolRegistry
from clotho.tools.runtime import ToolRuntime
from clotho.tools.tool import Tool


class ToolContext:
    def __init__(
        self,
        sandbox: Sandbox,
        tools: dict[str, Tool] | None = None,
        registry: ToolRegistry | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.tools = tools or {}
        self.registry = registry  # where a tool the rollout was not given is found
        self._runtime = ToolRuntime(sandbox=sandbox)

    async def terminal(
        self, command: str, timeout: float = 180.0, cwd: str | None = None
    ) -> ExecResult:
        return await self.sandbox.exec(command, timeout=timeout, cwd=cwd)

    async def read_file(self, path: str) -> bytes:
        return await self.sandbox.read_file(path)

    async def read_text(self, path: str) -> str:
        return (await self.sandbox.read_file(path)).decode("utf-8", errors="replace")

    async def write_file(self, path: str, data: bytes | str) -> None:
        await self.sandbox.write_file(path, data.encode() if isinstance(data, str) else data)

    async def upload(self, local: Path, remote: str) -> None:
        await self.sandbox.upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await self.sandbox.download(remote, local)

    async def search(self, pattern: str, path: str = ".", **kwargs: Any) -> str:
        from clotho.tools.files import search_files

        return await self.call_tool(search_files.name, {"pattern": pattern, "path": path, **kwargs})

    async def call_tool(self, name: str, arguments: dict[str, Any] | str) -> str:
        """Run a tool as the agent would; errors come back as an exception, not a string."""
        tool = self.tools.get(name)
        if tool is None:
            if self.registry is None:  # the built-ins, with the default tools settings
                from clotho.tools.builtin import default_registry

                self.registry = default_registry()
            tool = self.registry.tools.get(name)
        if tool is None:
            raise KeyError(f"unknown tool {name!r}")
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        try:
            validated = tool.validate(arguments)
        except ValidationError as exc:
            raise ValueError(describe_validation_error(exc)) from exc
        return await tool.run(self._runtime, validated)
