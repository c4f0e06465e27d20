"""Turning the (name, text) pairs of the XML formats into typed arguments, by schema."""

from __future__ import annotations

from typing import Any

from clotho.chat.parsers.base import Malformed, name_problem
from clotho.chat.parsers.schema_values import ToolSchemas, ValueProblem, convert


def typed_arguments(
    schemas: ToolSchemas, tool: str, pairs: list[tuple[str, str]]
) -> dict[str, Any]:
    """Arguments of `tool` from its (parameter, raw text) pairs, each converted by the tool's
    schema (see `schema_values`). A repeated parameter, a name that is not one (spaces, markup,
    escapes) or a value that does not fit its type makes the whole call malformed."""
    args: dict[str, Any] = {}
    for param, raw in pairs:
        if not param:
            raise Malformed("a parameter has no name", name=tool)
        if name_problem(param):  # an escape or separator leaked into it
            raise Malformed(f"{param!r} is not a parameter name", name=tool)
        if param in args:
            raise Malformed(f"parameter {param!r} is given twice", name=tool)
        schema = schemas.parameter(tool, param)
        try:
            args[param] = convert(raw, schema)
        except ValueProblem as e:
            raise Malformed(f"parameter {param!r} {e}", name=tool) from None
    return args
