"""`Tool` and `@tool`: async functions with type hints and a docstring; the JSON schema comes
from them.

    @tool
    async def terminal(rt: ToolRuntime, command: str, timeout: int = 180) -> str:
        '''Run a shell command.

        Args:
            command: the bash command line.
            timeout: seconds before the command is killed.
        '''

The first parameter receives the `ToolRuntime`; the others become the tool's arguments,
validated by a pydantic model (unknown arguments are rejected) before the function runs.
Which tools an agent gets is `clotho.tools.registry`'s business.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, Field, create_model

from clotho.tools.runtime import ToolRuntime

ToolFn = Callable[..., Awaitable[str]]


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {param: description}) from a Google-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            match = re.match(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line)
            if match:
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif stripped and current and line.startswith(" " * 6):
                params[current] += " " + stripped
            elif stripped and not line.startswith(" "):
                in_args = False
                current = None
        if not in_args and not params:
            description.append(line)
    return "\n".join(description).strip(), params


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


@dataclass
class Tool:
    name: str
    description: str
    fn: ToolFn
    params: type[BaseModel]
    parallel: bool = True

    def schema(self) -> dict[str, Any]:
        """The OpenAI `tools` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": _clean_schema(self.params.model_json_schema()),
            },
        }

    def validate(self, arguments: dict[str, Any]) -> BaseModel:
        return self.params.model_validate(arguments)

    async def run(self, runtime: ToolRuntime, arguments: BaseModel) -> str:
        fields = type(arguments).model_fields
        return await self.fn(runtime, **{k: getattr(arguments, k) for k in fields})


def _make_tool(fn: ToolFn, name: str | None, parallel: bool) -> Tool:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool {fn.__name__} must be an async function")
    description, param_docs = parse_docstring(fn.__doc__)
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    for index, (pname, param) in enumerate(inspect.signature(fn).parameters.items()):
        if index == 0:
            continue  # the ToolRuntime
        if pname not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {pname!r} needs a type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], Field(default, description=param_docs.get(pname)))
    model = create_model(  # type: ignore[call-overload]
        f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return Tool(
        name=name or fn.__name__,
        description=description,
        fn=fn,
        params=model,
        parallel=parallel,
    )


@overload
def tool(fn: ToolFn) -> Tool: ...
@overload
def tool(*, name: str | None = None, parallel: bool = True) -> Callable[[ToolFn], Tool]: ...
def tool(
    fn: ToolFn | None = None, *, name: str | None = None, parallel: bool = True
) -> Tool | Callable[[ToolFn], Tool]:
    """Turn an async function into a `Tool`. `parallel=False` keeps calls in order, one at a time."""
    if fn is not None:
        return _make_tool(fn, name, parallel)
    return lambda f: _make_tool(f, name, parallel)
