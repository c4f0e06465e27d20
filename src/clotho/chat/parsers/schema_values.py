"""Typing XML parameter values by the tool's JSON schema (qwen3_coder, glm45, glm47).

Those formats write every value as text, so `123` could be a string or a number. We follow the
schema instead of guessing: a string parameter keeps the text as written; integer, number,
boolean, null, object and array parameters are read as JSON (plus the Python spellings
`True`/`False`/`None` that Qwen3-Coder's chat template produces). A parameter with no usable
schema (unknown tool, unknown parameter, no `type`) keeps the string. A value that fits none
of the declared types is an error for the call, reported to the model.
"""

from __future__ import annotations

from typing import Any

from clotho.chat.parsers.json_args import loads

# Non-standard spellings seen in real tool schemas.
_ALIASES = {
    "str": "string",
    "text": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
}
_KNOWN = {"string", "integer", "number", "boolean", "null", "object", "array"}
# Most specific first: with ["integer", "string"], "7" is 7.
_ORDER = ("null", "boolean", "integer", "number", "object", "array")
_SAID = {
    "null": "null",
    "boolean": "true or false",
    "integer": "an integer",
    "number": "a number",
    "object": "a JSON object",
    "array": "a JSON array",
}
_PY_TYPE = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


class ValueProblem(ValueError):
    """The value does not convert to any declared type; the text is a clause for the model."""


class ToolSchemas:
    """Parameter schemas by tool name, from OpenAI-style tool definitions."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self._props: dict[str, dict[str, Any]] = {}
        for tool in tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            self._props[fn["name"]] = props if isinstance(props, dict) else {}

    def parameter(self, tool: str, param: str) -> dict[str, Any] | None:
        schema = self._props.get(tool, {}).get(param)
        return schema if isinstance(schema, dict) else None


def declared_types(schema: dict[str, Any] | None) -> frozenset[str] | None:
    """The JSON types a schema allows, or None when it does not say (keep the string)."""
    if not schema:
        return None
    found: set[str] = set()
    kind = schema.get("type")
    if isinstance(kind, str):
        found.add(_ALIASES.get(kind.lower(), kind.lower()))
    elif isinstance(kind, list):
        found.update(_ALIASES.get(k.lower(), k.lower()) for k in kind if isinstance(k, str))
    elif isinstance(schema.get("anyOf") or schema.get("oneOf"), list):
        for sub in schema.get("anyOf") or schema.get("oneOf"):
            sub_types = declared_types(sub) if isinstance(sub, dict) else None
            if sub_types is None:
                return None
            found.update(sub_types)
    elif isinstance(schema.get("enum"), list):
        found.update(_PY_TYPE.get(type(v), "object") for v in schema["enum"])
    elif "const" in schema:
        found.add(_PY_TYPE.get(type(schema["const"]), "object"))
    found &= _KNOWN
    return frozenset(found) or None


def convert(raw: str, schema: dict[str, Any] | None) -> Any:
    """The value of parameter text `raw` under `schema` (see the module docstring)."""
    types = declared_types(schema)
    if types is None or types == {"string"}:
        return raw
    text = raw.strip()
    for kind in _ORDER:
        if kind in types:
            ok, value = _as(kind, text)
            if ok:
                return value
    if "string" in types:
        return raw
    shown = text if len(text) <= 80 else text[:77] + "..."
    wanted = " or ".join(_SAID[t] for t in _ORDER if t in types)
    raise ValueProblem(f"must be {wanted} (the tool's schema says so), but {shown!r} is not")


def _as(kind: str, text: str) -> tuple[bool, Any]:
    lowered = text.lower()
    if kind == "null":
        return (True, None) if lowered in ("null", "none") else (False, None)
    if kind == "boolean":
        return (True, lowered == "true") if lowered in ("true", "false") else (False, None)
    try:
        value = loads(text)
    except ValueError:
        return False, None
    if kind == "integer":
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, None
    if kind == "number":
        return (not isinstance(value, bool) and isinstance(value, int | float)), value
    if kind == "object":
        return isinstance(value, dict), value
    return isinstance(value, list), value  # array
