"""What every tool-call parser shares: the result types, trajectory-wide call ids, and the
collector a format's scanner reports text, calls and malformed calls to.

A format module only has to walk the text (`_scan`) and write calls back (`render`); checking
names and arguments, building the messages for the model and joining the content live here,
so every format treats a bad call the same way: the call is removed from the content and
reported in `errors` with a sentence saying what was wrong and what the format looks like,
and the other calls of the turn still count.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from clotho.chat.parsers.json_args import ArgumentsProblem, arguments_object, guess_name
from clotho.chat.parsers.schema_values import ToolSchemas


@dataclass(slots=True)
class ParsedCall:
    """One well-formed call; `arguments` is always a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(slots=True)
class ParseError:
    """A call the model tried to make but got wrong; `message` is written for the model."""

    name: str | None
    raw: str
    message: str


@dataclass(slots=True)
class ParseResult:
    content: str | None
    calls: list[ParsedCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)


class Malformed(Exception):
    """Raised by a format's reader: this call cannot be read. `problem` is one clause.

    `truncated`: the reader ran into the end of the text inside the call (inside a JSON
    string, or a value that lasts until its closing tag), so the model was cut off and the call
    spans the rest of the text. A closing marker that is merely missing is not that: the
    scanner then ends the call where the next one starts, but not before `at`, where the reader
    stopped (what lies before it was read as this call's text: a string, say, that may quote
    another call)."""

    def __init__(
        self,
        problem: str,
        *,
        name: str | None = None,
        truncated: bool = False,
        at: int | None = None,
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.name = name
        self.truncated = truncated
        self.at = at


TRUNCATED = (
    "the call is not finished: the text ends inside it (the output probably hit the token limit)"
)

# Names are looked up by the agent loop; here we only refuse what cannot be a name at all
# (empty, spaces, or markup and JSON punctuation that show the format went wrong).
# A backslash or a control character is an escape or separator that leaked into the name.
_BAD_NAME = re.compile(r"""[\s<>{}\[\]"'`,;()=\\\x00-\x1f\x7f]""")


def name_problem(name: Any) -> str | None:
    if not isinstance(name, str) or not name:
        return "the call has no tool name"
    if name.isidentifier() and len(name) <= 256:
        return None  # the usual name, without a regex
    if len(name) > 256 or _BAD_NAME.search(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        return f"{shown!r} is not a tool name"
    return None


def skip_space(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i].isspace():
        i += 1
    return i


def ran_out(text: str, i: int, *expected: str) -> bool:
    """The text ends at `i` (after whitespace), or with the start of one of the `expected`
    markers: a call that stops here was cut off, not misshapen."""
    rest = text[i:].lstrip()
    return not rest or any(marker.startswith(rest) for marker in expected)


def find_first(text: str, needles: tuple[str, ...], pos: int) -> tuple[int, str]:
    """The earliest of `needles` in `text` from `pos`: (index, needle), or (-1, "")."""
    best, which = -1, ""
    for needle in needles:
        i = text.find(needle, pos)
        if i >= 0 and (best < 0 or i < best):
            best, which = i, needle
    return best, which


def error_extent(
    text: str,
    body: int,
    close: str,
    stops: tuple[str, ...],
    reached_end: bool = False,
    at: int | None = None,
) -> tuple[int, bool]:
    """Where a malformed call whose body starts at `body` ends: after its `close` marker, or
    at the first of `stops` (the next call, the end of a section) so a missing close marker
    does not swallow what follows, or at the end of the text, in which case the call was cut
    off (second value True). When the reader already `reached_end` (inside a JSON string, say,
    where markers mean nothing), the call runs to the end. Markers are looked for from `at`,
    where the reader stopped, when it is given: a marker before it was inside the call's text
    (in a JSON string), so it neither ends this call nor starts another."""
    if reached_end:
        return len(text), True
    if at is not None and at > body:
        body = min(at, len(text))
    end = text.find(close, body)
    nxt, _ = find_first(text, stops, body)
    if end >= 0 and (nxt < 0 or end < nxt):
        return end + len(close), False
    if nxt >= 0:
        return nxt, False
    return len(text), True


def scan_blocks(
    text: str, turn: Turn, start_marker: str, read_call: Callable[[str, int, Turn], int]
) -> None:
    """Prose between calls that open with `start_marker`: each call is read by
    `read_call(text, start, turn)`, which reports it to `turn` and returns where it ends."""
    pos = 0
    while True:
        start = text.find(start_marker, pos)
        if start < 0:
            turn.text(text[pos:])
            return
        turn.text(text[pos:start])
        pos = read_call(text, start, turn)


class Turn:
    """Collects one `parse` call's content pieces, calls and errors."""

    __slots__ = ("_parser", "calls", "errors", "pieces")

    def __init__(self, parser: ToolCallParser) -> None:
        self._parser = parser
        self.pieces: list[str] = []
        self.calls: list[ParsedCall] = []
        self.errors: list[ParseError] = []

    def text(self, piece: str) -> None:
        if piece and not piece.isspace():
            self.pieces.append(piece)

    def call(self, name: Any, arguments: Any, raw: str, model_id: str | None = None) -> None:
        """A call whose structure was read; name and arguments are still checked here."""
        problem = name_problem(name)
        if problem is not None:
            self.error(raw, problem, None)
            return
        try:
            args = arguments_object(arguments)
        except ArgumentsProblem as e:
            self.error(raw, str(e), name)
            return
        self.calls.append(ParsedCall(self._parser._assign_id(model_id, name), name, args))

    def error(self, raw: str, problem: str, name: str | None, *, truncated: bool = False) -> None:
        if truncated:
            problem = TRUNCATED
        if name is None:
            name = guess_name(raw)
        message = f"Tool call not run: {problem}. {self._parser.format_hint}"
        self.errors.append(ParseError(name=name, raw=raw, message=message))

    def result(self) -> ParseResult:
        # Pieces are the text between calls; strip each and keep paragraphs apart.
        content = "\n".join(p.strip() for p in self.pieces) or None
        return ParseResult(content=content, calls=self.calls, errors=self.errors)


class ToolCallParser(ABC):
    """Base of every format. One instance parses one trajectory: ids never repeat in it."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()
    """The strings that start or delimit calls in this format."""
    format_hint: ClassVar[str]
    """One sentence showing the model the expected format, appended to every error."""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools
        self.schemas = ToolSchemas(tools)
        self._used_ids: set[str] = set()
        self._count = 0

    def parse(self, text: str) -> ParseResult:
        turn = Turn(self)
        self._scan(text, turn)
        return turn.result()

    @abstractmethod
    def _scan(self, text: str, turn: Turn) -> None:
        """Walk `text`, reporting prose with `turn.text`, calls with `turn.call`, and
        unreadable calls with `turn.error`."""

    @abstractmethod
    def render(self, calls: list[tuple[str, dict[str, Any]]], content: str | None = None) -> str:
        """The text the model would write for `content` followed by `calls`."""

    # ids -----------------------------------------------------------------------------------

    def _fresh_id(self, n: int) -> str:
        return f"call_{n}"

    def _reused_id(self, model_id: str, name: str, n: int) -> str:
        """A replacement for a model-given id already used in this trajectory."""
        return f"{model_id}_{n}"

    def _assign_id(self, model_id: str | None, name: str) -> str:
        self._count += 1
        if model_id and model_id not in self._used_ids:
            chosen = model_id
        else:
            n = self._count
            while True:
                chosen = self._reused_id(model_id, name, n) if model_id else self._fresh_id(n)
                if chosen not in self._used_ids:
                    break
                n += 1
        self._used_ids.add(chosen)
        return chosen
