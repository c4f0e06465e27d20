"""Property tests: in every format, what `render` writes `parse` reads back, ids never repeat
in a trajectory, a turn cut anywhere never yields a call the model did not write, and no text
makes a parser raise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clotho.chat.parsers import get_parser, list_parsers

XML_CLOSERS = {"qwen3_coder": "</parameter>", "glm45": "</arg_value>", "glm47": "</arg_value>"}
JSON_FORMATS = [f for f in list_parsers() if f not in XML_CLOSERS]
ALL_MARKERS = sorted({m for f in list_parsers() for m in get_parser(f).markers})

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,20}", fullmatch=True)
# Arbitrary unicode, plus pieces that break naive parsers: quotes, backslashes, newlines,
# angle brackets, and every format's markers.
TRICKY = st.sampled_from(['"', "'", "\\", "\n", "<", ">", "{", "}", "[", "]", ";", *ALL_MARKERS])
TEXT = st.one_of(
    st.text(max_size=30),
    st.lists(st.one_of(TRICKY, st.text(max_size=4)), max_size=8).map("".join),
)
FLOATS = st.floats(allow_nan=False, allow_infinity=False)


def json_values(text: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | FLOATS | text
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
        max_leaves=8,
    )


JSON_ARGS = st.dictionaries(TEXT, json_values(TEXT), max_size=4)
JSON_CALLS = st.lists(st.tuples(NAMES, JSON_ARGS), min_size=1, max_size=3)


def content_for(fmt: str) -> st.SearchStrategy[str | None]:
    """Prose before the calls: anything that is not itself the start of a call."""
    markers = get_parser(fmt).markers

    def prose(text: str) -> bool:
        if any(m in text for m in (*markers, "<tool_call>")):
            return False
        return not (fmt.startswith("llama") and text.lstrip().startswith("{"))

    return st.none() | TEXT.filter(prose)


@st.composite
def typed_turn(draw: st.DrawFn, fmt: str) -> tuple[list[dict[str, Any]], list[tuple[str, dict]]]:
    """Tools with typed parameters, and calls whose values fit them (what XML can carry:
    strings without the value's closing tag, JSON for the rest)."""
    closer = XML_CLOSERS[fmt]
    text = TEXT.filter(lambda s: closer not in s)
    values = {
        "string": text,
        "integer": st.integers(),
        "number": FLOATS,
        "boolean": st.booleans(),
        "object": st.dictionaries(text, json_values(text), max_size=3),
        "array": st.lists(json_values(text), max_size=3),
    }
    params = st.dictionaries(NAMES, st.sampled_from(sorted(values)), max_size=5)
    tools = draw(st.dictionaries(NAMES, params, min_size=1, max_size=3))
    calls = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(sorted(tools)))
        chosen = draw(st.lists(st.sampled_from(sorted(tools[name]) or [""]), unique=True))
        args = {p: draw(values[tools[name][p]]) for p in chosen if p}
        calls.append((name, args))
    schemas = [
        {
            "type": "function",
            "function": {
                "name": name,
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": kind} for p, kind in ps.items()},
                },
            },
        }
        for name, ps in tools.items()
    ]
    return schemas, calls


def check_round_trip(fmt: str, tools: Any, calls: list, content: str | None) -> None:
    parser = get_parser(fmt, tools)
    text = parser.render(calls, content)
    first = parser.parse(text)
    assert first.errors == [], (text, first.errors)
    assert [(c.name, c.arguments) for c in first.calls] == calls, text
    assert first.content == ((content or "").strip() or None)
    again = parser.parse(text)  # the next turn of the same trajectory
    ids = [c.id for c in first.calls + again.calls]
    assert len(set(ids)) == len(ids) == 2 * len(calls)


@pytest.mark.parametrize("fmt", JSON_FORMATS)
@SETTINGS
@given(data=st.data(), calls=JSON_CALLS)
def test_json_formats_round_trip(fmt: str, data: st.DataObject, calls: list) -> None:
    check_round_trip(fmt, None, calls, data.draw(content_for(fmt)))


@pytest.mark.parametrize("fmt", sorted(XML_CLOSERS))
@SETTINGS
@given(data=st.data())
def test_xml_formats_round_trip_with_their_schema(fmt: str, data: st.DataObject) -> None:
    tools, calls = data.draw(typed_turn(fmt))
    check_round_trip(fmt, tools, calls, data.draw(content_for(fmt)))


@pytest.mark.parametrize("fmt", list_parsers())
@SETTINGS
@given(data=st.data())
def test_a_cut_turn_never_yields_a_call_the_model_did_not_write(
    fmt: str, data: st.DataObject
) -> None:
    """Cut anywhere (the model hit its token limit): the complete calls before the cut are
    read, nothing else is a call, and any error says the call was cut off."""
    if fmt in XML_CLOSERS:
        tools, calls = data.draw(typed_turn(fmt))
    else:
        tools, calls = None, data.draw(JSON_CALLS)
    parser = get_parser(fmt, tools)
    text = parser.render(calls)
    cut = data.draw(st.integers(0, len(text)))
    result = parser.parse(text[:cut])
    got = [(c.name, c.arguments) for c in result.calls]
    assert got == calls[: len(got)], text[:cut]
    for error in result.errors:
        assert "not finished" in error.message, (text[:cut], error.message)


@pytest.mark.parametrize("fmt", list_parsers())
@SETTINGS
@given(pieces=st.lists(st.one_of(TRICKY, st.text(max_size=8)), max_size=30))
def test_no_text_makes_a_parser_raise(fmt: str, pieces: list[str]) -> None:
    result = get_parser(fmt).parse("".join(pieces))
    for call in result.calls:
        assert isinstance(call.name, str) and call.name
        assert isinstance(call.arguments, dict)
    for error in result.errors:
        assert error.message and isinstance(error.raw, str)
