"""JSON helpers shared by the JSON-bodied formats: decoding in place, reading a call object,
and turning whatever the model put in `arguments` into a dict (or saying why not)."""

from __future__ import annotations

import json
import re
from typing import Any

_NAME_IN_RAW = re.compile(r'"name"\s*:\s*"([^"\\]{1,200})"')


class ArgumentsProblem(ValueError):
    """The arguments are not a JSON object; the text is a clause for the model."""


class JsonProblem(ValueError):
    """`at`: where the decoder stopped (the call's own text runs at least that far)."""

    def __init__(self, problem: str, truncated: bool, at: int | None = None) -> None:
        super().__init__(problem)
        self.truncated = truncated
        self.at = at


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# strict=False: raw newlines and tabs inside strings (models write code that way) are read as
# what they obviously mean instead of failing the call.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, strict=False)


def loads(text: str) -> Any:
    """`json.loads` without NaN/Infinity, which would not survive being sent on as JSON, and
    tolerant of raw control characters inside strings."""
    return _DECODER.decode(text)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def decode_at(text: str, pos: int) -> tuple[Any, int]:
    """Decode the JSON value starting at `pos` (after whitespace); return it and its end.

    Strings may contain anything, markers included, since the decoder, not a search for the
    closing marker, decides where the value ends.
    """
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as e:
        truncated = e.msg.startswith("Unterminated string") or _cut_token(text[e.pos :], e.msg)
        raise JsonProblem(
            f"the JSON is not valid ({e.msg} at {_where(text, pos, e.pos)})", truncated, e.pos
        ) from None
    except ValueError as e:  # NaN / Infinity
        raise JsonProblem(f"the JSON is not valid ({e})", False) from None


# What the decoder can be left holding when the text stops inside a value.
_TOKEN_START = re.compile(r"[-+.0-9eE]*|t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?")


def _cut_token(rest: str, msg: str) -> bool:
    rest = rest.strip()
    if msg.startswith("Invalid \\uXXXX escape"):
        return len(rest) < 6
    return _TOKEN_START.fullmatch(rest) is not None


def _where(text: str, start: int, at: int) -> str:
    snippet = text[at : at + 20]
    return f"character {at - start + 1}" + (f", near {snippet!r}" if snippet else ", at the end")


def arguments_object(value: Any) -> dict[str, Any]:
    """The call's arguments as a dict. A JSON string is decoded once (some models and
    templates send arguments as a string); anything that is not an object is refused."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = loads(value)
        except ValueError:
            raise ArgumentsProblem(
                "the arguments are a string that does not hold a JSON object"
            ) from None
        if not isinstance(value, dict):
            raise ArgumentsProblem(
                f"the arguments are a string holding {json_type(value)}, not a JSON object"
            )
        return value
    if not isinstance(value, dict):
        raise ArgumentsProblem(f"the arguments must be a JSON object, not {json_type(value)}")
    return value


def call_fields(
    obj: Any, *, keys: tuple[str, ...] = ("arguments", "parameters")
) -> tuple[Any, Any]:
    """(name, arguments) of a `{"name": ..., "arguments": ...}` object; missing arguments
    mean a call without arguments. Raises ArgumentsProblem when it is not such an object."""
    if not isinstance(obj, dict):
        raise ArgumentsProblem(
            f'the call must be a JSON object with "name" and "{keys[0]}", not {json_type(obj)}'
        )
    present = [k for k in keys if k in obj]
    if len(present) > 1:
        raise ArgumentsProblem(f"the call has both {' and '.join(map(repr, present))}; give one")
    return obj.get("name"), (obj[present[0]] if present else {})


def guess_name(raw: str) -> str | None:
    """The tool name in a call we could not read, when one is visible (for the report)."""
    m = _NAME_IN_RAW.search(raw)
    return m.group(1) if m else None
