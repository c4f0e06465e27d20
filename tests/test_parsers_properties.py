"""Property tests: in every format, what `render` writes `parse` reads back, ids never repeat
in a trajectory, a turn cut anywhere never yields a call the model did not write, and no text
makes a parser raise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clotho.chat.parsers import ParseResult, get_parser, list_parsers

XML_CLOSERS = {"qwen3_coder": "</parameter>", "glm45": "</arg_value>", "glm47": "</arg_value>"}
# Per XML format: tags that may open a block nested in a value, a lone opening tag, and a lone
# closing sequence (a value's own closing tags, as a template would hold them).
XML_OPENERS = {
    "qwen3_coder": (("<parameter=", "<function="), "<parameter=q>", "\n</function>\n</tool_call>"),
    "glm45": (("<arg_value>",), "<arg_value>", "\n</tool_call>"),
    "glm47": (("<arg_value>",), "<arg_value>", "</tool_call>"),
}
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


def plain_text(fmt: str) -> st.SearchStrategy[str]:
    """Text with no tag that could end a value or open a block nested in it (other formats'
    markers, and this format's other tags, included)."""
    closer, (openers, _, _) = XML_CLOSERS[fmt], XML_OPENERS[fmt]
    return TEXT.filter(lambda s: closer not in s and not any(o in s for o in openers))


def xml_string(fmt: str, *, tail: bool = False) -> st.SearchStrategy[str]:
    """String values holding the format's own tags where it can tell them from structure:
    whole calls of the format (a template, a fixture), a closing tag followed by text, and a
    lone opening tag inside text. With `tail`, also the value's own closing sequence: the
    reading that keeps the value whole is then the one leaving no stray tags in the prose,
    but only in a turn of one call (in a later call, the same text could as well end it; and
    cut right after it, the text is a finished call)."""
    parser, plain = get_parser(fmt), plain_text(fmt)
    closer, (_, opener, closing) = XML_CLOSERS[fmt], XML_OPENERS[fmt]
    block = st.tuples(NAMES, NAMES, plain).map(lambda t: parser.render([(t[0], {t[1]: t[2]})]))
    pieces = [plain, block, st.just(closer + "x"), st.just("x" + opener)]
    if tail:
        pieces.append(st.just(closer + closing))
    return st.lists(st.one_of(*pieces), max_size=5).map("".join)


@st.composite
def typed_turn(
    draw: st.DrawFn, fmt: str, strings: st.SearchStrategy[str] | None = None
) -> tuple[list[dict[str, Any]], list[tuple[str, dict]]]:
    """Tools with typed parameters, and calls whose values fit them (what XML can carry:
    `strings`, by default text without the format's value tags, and JSON for the rest)."""
    text = plain_text(fmt)
    values = {
        "string": text if strings is None else strings,
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


def check_cut(fmt: str, tools: Any, calls: list, data: st.DataObject) -> tuple[ParseResult, str]:
    """The turn cut at a drawn place: only complete calls before the cut are read."""
    parser = get_parser(fmt, tools)
    text = parser.render(calls)
    cut = text[: data.draw(st.integers(0, len(text)))]
    result = parser.parse(cut)
    got = [(c.name, c.arguments) for c in result.calls]
    assert got == calls[: len(got)], cut
    return result, cut


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


@pytest.mark.parametrize("fmt", sorted(XML_CLOSERS))
@SETTINGS
@given(data=st.data())
def test_xml_values_holding_the_formats_own_tags_round_trip(fmt: str, data: st.DataObject) -> None:
    """A value may hold whole calls of its format, and its tags where the structure does not
    resume after them: it is read back whole, and nothing inside it becomes a call."""
    tail = data.draw(st.booleans())
    tools, calls = data.draw(typed_turn(fmt, xml_string(fmt, tail=tail)))
    check_round_trip(fmt, tools, calls[:1] if tail else calls, data.draw(content_for(fmt)))


@pytest.mark.parametrize("fmt", sorted(XML_CLOSERS))
@SETTINGS
@given(data=st.data())
def test_a_cut_turn_with_tags_in_its_values_never_yields_a_call_the_model_did_not_write(
    fmt: str, data: st.DataObject
) -> None:
    """Cut anywhere, even inside a value holding a whole call: only the complete calls before
    the cut are read (a cut value's error may say what follows a closing tag in it, since the
    text cannot tell a cut from a stray tag)."""
    tools, calls = data.draw(typed_turn(fmt, xml_string(fmt)))
    check_cut(fmt, tools, calls, data)


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
    result, cut = check_cut(fmt, tools, calls, data)
    for error in result.errors:
        assert "not finished" in error.message, (cut, error.message)


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
