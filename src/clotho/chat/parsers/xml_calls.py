"""The XML formats (qwen3_coder, glm45, glm47) write parameter values as raw text, with no
escaping, so a value may hold the format's own tags: a file that is a template or a test
fixture, a whole `<tool_call>` block, a lone closing tag in a string literal. Where a value
ends is then a choice between readings of the same text; this module makes it, the same way
for every XML format:

1. A value ends only at its closing tag where the format's structure resumes (the next
   parameter's tag or the end of the call follows); any other closing tag is part of the value.
2. A value that holds a nested block (an opening tag standing where the structure puts one:
   at the start of the value, after a call or function header inside the value, or after the
   closing tag of a nested block) holds that block's closing tag too: a closing tag inside a
   nested block never ends the value, so a literal call inside a value is never read as the
   end of it, and a value cut off after such a block is cut off, not short.
3. Of the readings left, the turn reads the one that leaves no stray tags in the prose (text
   between calls), then the one with the fewest malformed calls, then the one with the fewest
   calls, then the one ending values earliest. So a literal block inside a value stays in it
   (reading it as calls would leave the value's own closing tags as prose, or make more
   calls), and a call lying inside another call's value is never run.

Two cases stay truly ambiguous. `...</parameter>\n<parameter=NAME>...` inside a value reads as
the next parameter, even when the tool does not declare NAME or NAME was given already: the
call then fails visibly (clotho's tools refuse unknown arguments, and a parameter given twice
is an error), while keeping the text in the value would run the call with a value the model
may not have meant. And a later call whose value ends with that value's own closing tags reads
the same as a value holding the later call: rule 3 takes the reading with fewer calls.

A call that cannot be read ends, by the same ranking, at its own `</tool_call>` rather than at
a `<tool_call>` inside one of its values.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from clotho.chat.parsers.base import (
    Malformed,
    ToolCallParser,
    Turn,
    error_extent,
    ran_out,
    skip_space,
)
from clotho.chat.parsers.xml_args import typed_arguments

# Bounds on the search for adversarial text: readings tried per call, later `</tool_call>`s an
# unreadable call may end at, closing tags looked at per parse before the search stops (then
# each call keeps its most likely reading), calls looked ahead.
_READINGS = 32
_EXTENTS = 8
_STEPS = 4096
_LOOKAHEAD = 200


@dataclass(slots=True)
class Function:
    name: str
    pairs: list[tuple[str, str]]
    begin: int
    end: int


@dataclass(slots=True)
class Reading:
    """One way to read a call: where it ends, and its functions."""

    end: int
    functions: list[Function]


@dataclass(slots=True)
class Cursor:
    """Reading a call at `i`, inside function `name` (its tag at `begin`) with the `pairs`
    read so far, after the functions `done`."""

    i: int
    name: str
    begin: int
    pairs: list[tuple[str, str]]
    done: list[Function]


@dataclass(slots=True)
class Value:
    """A value of parameter `param` starts at `cursor.i`: where it ends is the choice."""

    cursor: Cursor
    param: str


Step = Reading | Value | Malformed
"""What reading the structure up to the next choice gives: a whole call, a value to end, or
the reason the call cannot be read this way."""


@dataclass(slots=True)
class Walk:
    """What reading one call found out: the failures met (first one first), and a step budget
    shared by the whole parse."""

    budget: list[int]
    failed: list[Malformed] = field(default_factory=list)

    def fail(self, problem: Malformed) -> None:
        self.failed.append(problem)


class XmlCallParser(ToolCallParser):
    """A format whose calls open with START and end with END, with raw-text values."""

    START: ClassVar[str]
    END: ClassVar[str]
    STRAY: ClassVar[tuple[str, ...]]
    """Tags that have no place in prose: finding one there means a value was read short."""
    VALUE_OPEN: ClassVar[str]
    VALUE_CLOSE: ClassVar[str]
    RESUME: ClassVar[tuple[str, ...]]
    """What follows a VALUE_CLOSE (after `_skip`) where the structure resumes."""

    def _skip(self, text: str, i: int) -> int:
        """Past what may separate tags."""
        return skip_space(text, i)

    def _resumes(self, text: str, after: int, nested: bool = False) -> bool:
        """The format's structure resumes at `after` (the end of a VALUE_CLOSE); in a block
        `nested` in a value, the enclosing value may also end there."""
        j = self._skip(text, after)
        return text.startswith(self.RESUME, j) or (nested and text.startswith(self.VALUE_CLOSE, j))

    def _ran_out(self, text: str, i: int) -> bool:
        """The text ends at `i`, or with the start of what may follow a value's closing tag."""
        return ran_out(text, i, *self.RESUME)

    @abstractmethod
    def _opens(self, text: str, o: int, v: int, nested: int) -> bool:
        """The VALUE_OPEN at `o`, in a value starting at `v`, opens a nested block: it stands
        where the structure puts one, at the start of the value, after a call or function
        header that is itself inside the value, or right after a nested block's closing tag
        (ending at `nested`)."""

    def _value_closes(self, text: str, v: int, walk: Walk, stray: list[int]) -> Iterator[int]:
        """Where a value starting at `v` may end, in order: each VALUE_CLOSE not inside a
        nested block (opened by a VALUE_OPEN where `_opens`, and closed, like any value, only
        where the structure resumes) after which `_resumes`. The first VALUE_CLOSE at depth 0
        that the structure does not follow goes to `stray` (for the error when nothing fits)."""
        closer, opener = self.VALUE_CLOSE, self.VALUE_OPEN
        depth = 0
        nested = -1  # where the last closing tag of a nested block ends
        i = v
        while True:
            c = text.find(closer, i)
            if c < 0:
                return
            walk.budget[0] -= 1
            o = text.find(opener, i, c)
            while o >= 0:
                if self._opens(text, o, v, nested):
                    depth += 1
                o = text.find(opener, o + len(opener), c)
            after = c + len(closer)
            if depth > 0:
                if self._resumes(text, after, nested=True):  # else: text of the nested value
                    depth -= 1
                    nested = after
            elif self._resumes(text, after):
                yield c
            elif not stray:
                stray.append(c)
            i = after

    @abstractmethod
    def _start(self, text: str, body: int) -> Step:
        """Read the call whose body starts at `body` up to its first value."""

    @abstractmethod
    def _advance(self, text: str, cur: Cursor) -> Step:
        """Read on from `cur` (just after a value's closing tag) up to the next value; `cur`
        is the reader's own, and may become the cursor of that value."""

    def _clean(self, value: str) -> str:
        """A value as the model meant it, from the text between its tags."""
        return value

    def _readings(self, text: str, body: int, walk: Walk) -> Iterator[Reading]:
        """The readings of the call whose body starts at `body`, most likely first (values
        ending at their earliest closing tags); the failures met go to `walk`."""
        # One entry per value being read: its candidate ends, and whether one was tried.
        stack: list[tuple[Iterator[int], Value, list[int], list[bool]]] = []
        step: Step | None = self._start(text, body)
        while True:
            if isinstance(step, Reading):
                yield step
            elif isinstance(step, Malformed):
                walk.fail(step)
            elif step is not None:
                stray: list[int] = []
                closes = self._value_closes(text, step.cursor.i, walk, stray)
                stack.append((closes, step, stray, [False]))
            step = None
            while stack:
                closes, value, stray, tried = stack[-1]
                close = next(closes, None)
                if close is None:
                    stack.pop()
                    if not tried[0]:
                        cur = value.cursor
                        walk.fail(
                            self._unclosed(text, self.VALUE_CLOSE, stray, cur.name, value.param)
                        )
                    continue
                tried[0] = True
                cur = value.cursor
                pairs = [*cur.pairs, (value.param, self._clean(text[cur.i : close]))]
                after = close + len(self.VALUE_CLOSE)
                step = self._advance(text, Cursor(after, cur.name, cur.begin, pairs, cur.done))
                break
            if step is None:
                return

    def _unclosed(
        self, text: str, closer: str, stray: list[int], name: str, param: str
    ) -> Malformed:
        """Why no closing tag ends the value of `param`: there is none at all (the text ends
        inside the value), or the first one is followed by something else (`stray`)."""
        if not stray:
            return Malformed(
                f"the value of {param!r} is not closed with {closer}",
                name=name,
                truncated=True,  # a value runs until its closing tag: here, the end
            )
        after = stray[0] + len(closer)
        found = text[after : after + 20]
        return Malformed(
            f"the {closer} of {param!r} is followed by {found!r} instead of the next "
            "argument or the end of the call",
            name=name,
            truncated=self._ran_out(text, after),
            at=stray[0],
        )

    def _scan(self, text: str, turn: Turn) -> None:
        if not _quick(self, text, turn):
            _Search(self, text).apply(turn)


@dataclass(slots=True)
class _Option:
    end: int
    reading: Reading | None
    problem: Malformed | None
    cut: bool = False


@dataclass(slots=True)
class _Plan:
    prose: int
    start: int  # -1: prose to the end of the text
    option: _Option | None
    rest: _Plan | None


_Score = tuple[int, int, int]


class _Search:
    """The best reading of a whole turn (see the module docstring), by dynamic programming
    over the positions where prose resumes."""

    def __init__(self, parser: XmlCallParser, text: str) -> None:
        self.parser = parser
        self.text = text
        self.budget = [_STEPS]
        self.memo: dict[int, tuple[_Score, _Plan]] = {}
        self.closes_after: dict[int, bool] = {}

    def _close_after(self, end: int) -> bool:
        """Some value could end after `end`: the text from there holds a closing tag at depth 0
        where the structure resumes (only then can a call have a reading ending later)."""
        known = self.closes_after.get(end)
        if known is None:
            walk = Walk(self.budget)
            known = next(self.parser._value_closes(self.text, end, walk, []), None) is not None
            self.closes_after[end] = known
        return known

    def _stray(self, a: int, b: int) -> int:
        return _stray(self.parser, self.text, a, b)

    def _options(self, start: int) -> Iterator[_Option]:
        text, p = self.text, self.parser
        body = start + len(p.START)
        walk = Walk(self.budget)
        n = 0
        for reading in p._readings(text, body, walk):
            yield _Option(reading.end, reading, None)
            n += 1
            if n >= _READINGS:
                return
        if n:
            return
        problem = walk.failed[0] if walk.failed else Malformed("the call cannot be read")
        if problem.truncated:
            yield _Option(len(text), None, problem, True)
            return
        if problem.at is None:
            stop, cut = error_extent(text, body, p.END, (p.START,))
            yield _Option(stop, None, problem, cut)
        else:  # a value opened at `at` has no end: a <tool_call> after it may be its text
            stop = problem.at
        for _ in range(_EXTENTS):
            close = text.find(p.END, stop)
            if close < 0:
                break
            stop = close + len(p.END)
            yield _Option(stop, None, problem)
        if stop < len(text):
            yield _Option(len(text), None, problem)

    def best(self, pos: int, depth: int = 0) -> tuple[_Score, _Plan]:
        known = self.memo.get(pos)
        if known is not None:
            return known
        start = self.text.find(self.parser.START, pos)
        if start < 0:
            found: tuple[_Score, _Plan] = (
                (self._stray(pos, len(self.text)), 0, 0),
                _Plan(pos, -1, None, None),
            )
        else:
            prose = self._stray(pos, start)
            chosen: tuple[_Score, _Plan] | None = None
            for option in self._options(start):
                if depth >= _LOOKAHEAD:
                    rest = self._greedy(option.end)
                    chosen = ((prose, 0, 0), _Plan(pos, start, option, rest))
                    break
                (stray, errors, calls), rest = self.best(option.end, depth + 1)
                reading = option.reading
                if reading is None:  # an unreadable call counts the calls it covers
                    covered = max(1, self.text.count(self.parser.START, start, option.end))
                score = (
                    prose + stray,
                    errors + (reading is None),
                    calls + (len(reading.functions) if reading else covered),
                )
                if chosen is None or score < chosen[0]:
                    chosen = (score, _Plan(pos, start, option, rest))
                if self.budget[0] <= 0:
                    break  # out of budget: the first (most likely) reading stands
                if reading and not self._close_after(option.end):
                    # Later readings end values at later closing tags, all before this end:
                    # they cannot leave less stray text or fewer calls.
                    break
            assert chosen is not None  # _options always yields
            found = chosen
        self.memo[pos] = found
        return found

    def _greedy(self, pos: int) -> _Plan:
        """The rest of a very long turn, each call read its most likely way."""
        steps: list[tuple[int, int, _Option | None]] = []
        while True:
            start = self.text.find(self.parser.START, pos)
            if start < 0:
                steps.append((pos, -1, None))
                break
            option = next(self._options(start))
            steps.append((pos, start, option))
            pos = option.end
        plan: _Plan | None = None
        for prose, start, option in reversed(steps):
            plan = _Plan(prose, start, option, plan)
        assert plan is not None
        return plan

    def apply(self, turn: Turn) -> None:
        text = self.text
        plan: _Plan | None = self.best(0)[1]
        while plan is not None:
            if plan.start < 0 or plan.option is None:
                turn.text(text[plan.prose :])
                return
            turn.text(text[plan.prose : plan.start])
            option = plan.option
            raw = text[plan.start : option.end]
            if option.reading is None:
                problem = option.problem or Malformed("the call cannot be read")
                turn.error(raw, problem.problem, problem.name, truncated=option.cut)
            else:
                _report(self.parser, text, raw, option.reading, turn)
            plan = plan.rest


def _quick(p: XmlCallParser, text: str, turn: Turn) -> bool:
    """The common case, read without search: each value ends at the first closing tag after
    it, and the structure resumes there; no stray tag is left in the prose; and every value
    tag of the text is used by a value (so no value holds one). Then no reading is better
    (any later closing tag ends a parameter whose opening tag would nest in the longer value)
    and this one goes to `turn`. False when it is not the case."""
    close_tag, open_tag = p.VALUE_CLOSE, p.VALUE_OPEN
    calls: list[tuple[int, int, Reading]] = []
    values = pos = 0
    while True:
        start = text.find(p.START, pos)
        stop = len(text) if start < 0 else start
        if text.find("<", pos, stop) >= 0 and _stray(p, text, pos, stop):
            return False
        if start < 0:
            break
        step = p._start(text, start + len(p.START))
        while isinstance(step, Value):
            cur = step.cursor
            close = text.find(close_tag, cur.i)
            if close < 0:
                return False  # (an opening tag in the value fails the count below, and
                # `_advance` fails where the structure does not resume)
            cur.pairs.append((step.param, p._clean(text[cur.i : close])))
            cur.i = close + len(close_tag)
            values += 1
            step = p._advance(text, cur)
        if not isinstance(step, Reading):
            return False
        calls.append((pos, start, step))
        pos = step.end
    if not text.count(close_tag) == values == text.count(open_tag):
        return False
    for prose, start, reading in calls:
        turn.text(text[prose:start])
        _report(p, text, text[start : reading.end], reading, turn)
    turn.text(text[pos:])
    return True


def _stray(parser: XmlCallParser, text: str, a: int, b: int) -> int:
    """How many tags that have no place in prose the text from `a` to `b` holds."""
    piece = text[a:b]
    return sum(piece.count(tag) for tag in parser.STRAY) if "<" in piece else 0


def _report(parser: XmlCallParser, text: str, raw: str, reading: Reading, turn: Turn) -> None:
    """The calls of one reading, typed by the tools' schemas; a value that does not fit its
    type makes the whole `<tool_call>` an error."""
    typed: list[tuple[Function, dict[str, Any]]] = []
    for fn in reading.functions:
        try:
            typed.append((fn, typed_arguments(parser.schemas, fn.name, fn.pairs)))
        except Malformed as e:
            turn.error(raw, e.problem, e.name)
            return
    for fn, args in typed:
        turn.call(fn.name, args, raw if len(typed) == 1 else text[fn.begin : fn.end])
