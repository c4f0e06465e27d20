"""Procedural bug injections into Python source, with the standard library's `ast`.

Each mutator finds nodes of one kind and rewrites only the source text of one node (found
by the positions `ast` records), so the rest of the file, comments and formatting included,
stays byte for byte: the gold patch (the reverse of the injection) is a minimal diff. Why
`ast` and not `libcst` or the `swesmith` package: `ast` ships with Python, its positions
are exact since 3.8, and every mutation here is a local text replacement; libcst would add
a dependency to round-trip formatting we never change, and swesmith pulls in an LLM stack
and Docker images it expects to find on a hub.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

_FLIP_COMPARE = {
    ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="), ast.NotEq: ("!=", "=="), ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"), ast.In: ("in", "not in"), ast.NotIn: ("not in", "in"),
}  # fmt: skip


@dataclass(frozen=True)
class Mutation:
    """One injected bug: where, what kind, and the new source of the file."""

    kind: str
    path: str
    line: int
    before: str  # the node's source
    after: str
    source: str  # the whole mutated file


def _lines_offsets(source: str) -> list[int]:
    offsets = [0]
    for line in source.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    return offsets


class _Source:
    def __init__(self, text: str) -> None:
        self.text = text
        self.offsets = _lines_offsets(text)
        self.encoded = [line.encode() for line in text.splitlines(keepends=True)]

    def index(self, line: int, col_bytes: int) -> int:
        """Character offset of (1-based line, UTF-8 byte column), as `ast` reports them."""
        prefix = self.encoded[line - 1][:col_bytes].decode(errors="replace")
        return self.offsets[line - 1] + len(prefix)

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.index(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.index(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    def replace(self, start: int, end: int, new: str) -> str:
        return self.text[:start] + new + self.text[end:]


Edit = tuple[int, int, str, str]  # start, end, replacement, kind
Finder = Callable[[ast.AST, _Source], Iterator[Edit]]


def _compare(node: ast.AST, src: _Source) -> Iterator[Edit]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _FLIP_COMPARE:
        old, new = _FLIP_COMPARE[type(node.ops[0])]
        _, left_end = src.span(node.left)
        right_start, _ = src.span(node.comparators[0])
        between = src.text[left_end:right_start]
        if between.strip() == old:
            yield left_end, right_start, between.replace(old, new), "flip_comparison"


def _boolop(node: ast.AST, src: _Source) -> Iterator[Edit]:
    if isinstance(node, ast.BoolOp) and len(node.values) == 2:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        _, left_end = src.span(node.values[0])
        right_start, _ = src.span(node.values[1])
        between = src.text[left_end:right_start]
        if between.strip() == old:
            yield left_end, right_start, between.replace(old, new), "flip_boolean"


def _off_by_one(node: ast.AST, src: _Source) -> Iterator[Edit]:
    targets: list[ast.expr] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        targets = list(node.args[:2])
    elif isinstance(node, ast.Slice):
        targets = [b for b in (node.lower, node.upper) if b is not None]
    for bound in targets:
        start, end = src.span(bound)
        text = src.text[start:end]
        if "\n" in text:
            continue
        if isinstance(bound, ast.Constant) and type(bound.value) is int:
            yield start, end, str(bound.value + 1), "off_by_one"
        else:
            yield start, end, f"{text} + 1" if _atomic(bound) else f"({text}) + 1", "off_by_one"


def _atomic(node: ast.expr) -> bool:
    return isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript | ast.Constant)


def _remove_statement(node: ast.AST, src: _Source) -> Iterator[Edit]:
    for field in ("body", "orelse", "finalbody"):
        body = getattr(node, field, None)
        if not isinstance(body, list) or len(body) < 2:
            continue
        for stmt in body:
            if not isinstance(stmt, ast.Assign | ast.AugAssign | ast.Expr | ast.AnnAssign):
                continue
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if stmt.lineno != stmt.end_lineno:
                continue
            start, end = src.span(stmt)
            line_start = src.offsets[stmt.lineno - 1]
            line_end = src.offsets[stmt.lineno]
            if src.text[line_start:start].strip() or src.text[end:line_end].strip():
                continue  # not alone on its line
            yield line_start, line_end, "", "remove_statement"


def _swap_arguments(node: ast.AST, src: _Source) -> Iterator[Edit]:
    if isinstance(node, ast.Call) and len(node.args) >= 2:
        a, b = node.args[0], node.args[1]
        if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
            return
        a_start, a_end = src.span(a)
        b_start, b_end = src.span(b)
        first, second = src.text[a_start:a_end], src.text[b_start:b_end]
        if first == second or "\n" in src.text[a_start:b_end]:
            return
        middle = src.text[a_end:b_start]
        yield a_start, b_end, second + middle + first, "swap_arguments"


def _return_value(node: ast.AST, src: _Source) -> Iterator[Edit]:
    if isinstance(node, ast.Return) and node.value is not None:
        start, end = src.span(node.value)
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, bool):
            yield start, end, str(not value.value), "change_return"
        elif isinstance(value, ast.Constant) and type(value.value) is int:
            yield start, end, str(value.value + 1), "change_return"
        elif isinstance(value, ast.Constant) and value.value is None:
            return
        else:
            yield start, end, "None", "change_return"


def _invert_condition(node: ast.AST, src: _Source) -> Iterator[Edit]:
    if isinstance(node, ast.If | ast.While) and node.test.lineno == node.test.end_lineno:
        start, end = src.span(node.test)
        yield start, end, f"not ({src.text[start:end]})", "invert_condition"


MUTATORS: dict[str, Finder] = {
    "flip_comparison": _compare,
    "flip_boolean": _boolop,
    "off_by_one": _off_by_one,
    "remove_statement": _remove_statement,
    "swap_arguments": _swap_arguments,
    "change_return": _return_value,
    "invert_condition": _invert_condition,
}


def mutations(path: str, source: str, kinds: list[str] | None = None) -> list[Mutation]:
    """Every single-site mutation of `source` that still parses and changes the code."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    src = _Source(source)
    original = ast.dump(tree)
    found: list[Mutation] = []
    seen: set[str] = set()
    finders = [MUTATORS[k] for k in (kinds or list(MUTATORS))]
    for node in ast.walk(tree):
        for finder in finders:
            for start, end, new, kind in finder(node, src):
                mutated = src.replace(start, end, new)
                if mutated in seen:
                    continue
                seen.add(mutated)
                try:
                    changed = ast.dump(ast.parse(mutated)) != original
                except SyntaxError:
                    continue
                if changed:
                    line = source.count("\n", 0, start) + 1
                    found.append(Mutation(kind, path, line, source[start:end], new, mutated))
    return found


def sample(candidates: list[Mutation], n: int, seed: int) -> list[Mutation]:
    """Up to `n` mutations in a seeded order that spreads over kinds and files."""
    rng = random.Random(seed)
    by_kind: dict[str, list[Mutation]] = {}
    for m in candidates:
        by_kind.setdefault(m.kind, []).append(m)
    for group in by_kind.values():
        rng.shuffle(group)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    ordered: list[Mutation] = []
    while len(ordered) < n and any(by_kind.values()):
        for kind in kinds:
            if by_kind[kind] and len(ordered) < n:
                ordered.append(by_kind[kind].pop())
    return ordered
