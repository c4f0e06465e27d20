"""`clotho bench parsers`: how fast each tool-call format is parsed client-side.

Every rollout turn goes through a parser, so this is a per-turn cost of the token backend.
Turns are what an agent writes: a sentence or two, then one to three calls to shell and file
tools (commands, paths, a small file with quotes, newlines and markup), each written by the
format's own `render`, and parsed with the tools' schemas as a rollout would.
"""

from __future__ import annotations

import random
import time
from typing import Any

from pydantic import BaseModel, Field

from clotho.chat.parsers import get_parser, list_parsers

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": props},
        },
    }
    for name, props in {
        "bash": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "read_file": {
            "path": {"type": "string"},
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
        },
        "write_file": {"path": {"type": "string"}, "content": {"type": "string"}},
        "search": {
            "pattern": {"type": "string"},
            "include": {"type": "array", "items": {"type": "string"}},
            "case_sensitive": {"type": "boolean"},
        },
    }.items()
]

_PROSE = [
    "Let me look at the failing test first.",
    "The import error comes from the renamed module; I'll fix the path and rerun the tests.",
    "I'll check what the config loader does with an empty file.",
    "",
]
_COMMANDS = [
    "cd /app && python -m pytest -q tests/test_api.py 2>&1 | tail -n 20",
    'grep -rn "def load_config" src/ | head',
    "git diff --stat && git status --short",
    "ls -la /app/src && cat setup.cfg",
]
_FILE = '''import json
from pathlib import Path


def load_config(path: str) -> dict:
    """Read the config; an empty file means defaults."""
    text = Path(path).read_text()
    if not text.strip():
        return {"debug": False, "tags": ["<none>"]}
    return json.loads(text)
'''


class FormatThroughput(BaseModel):
    format: str
    turns: int = Field(description="turns parsed in the measured time")
    seconds: float
    turns_per_s: float
    mb_per_s: float
    calls_per_s: float
    mean_turn_bytes: float


class ParsersBench(BaseModel):
    seconds_per_format: float
    formats: dict[str, FormatThroughput]


def _turn(rng: random.Random) -> tuple[str | None, list[tuple[str, dict[str, Any]]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["bash", "bash", "read_file", "write_file", "search"])
        if kind == "bash":
            calls.append(("bash", {"command": rng.choice(_COMMANDS), "timeout": 60}))
        elif kind == "read_file":
            offset = rng.randint(1, 400)
            calls.append(
                ("read_file", {"path": "src/app/config.py", "offset": offset, "limit": 80})
            )
        elif kind == "write_file":
            calls.append(("write_file", {"path": "src/app/config.py", "content": _FILE}))
        else:
            calls.append(
                ("search", {"pattern": "load_config(", "include": ["*.py"], "case_sensitive": True})
            )
    return rng.choice(_PROSE) or None, calls


def bench_format(name: str, seconds: float, *, turns: int = 64, seed: int = 7) -> FormatThroughput:
    """Parse `turns` distinct turns round and round for about `seconds`."""
    rng = random.Random(seed)
    maker = get_parser(name, TOOLS)
    specs = [_turn(rng) for _ in range(turns)]
    texts = [maker.render(calls, content) for content, calls in specs]
    expected = [len(calls) for _, calls in specs]
    for text, n in zip(texts, expected, strict=True):  # the bench must measure real parses
        result = maker.parse(text)
        if len(result.calls) != n or result.errors:
            raise RuntimeError(f"{name}: a benchmark turn did not parse cleanly: {result.errors}")
    sizes = [len(t.encode()) for t in texts]
    parser = get_parser(name, TOOLS)
    done = n_bytes = n_calls = 0
    started = time.perf_counter()
    while True:
        for text in texts:
            parser.parse(text)
        done += len(texts)
        n_bytes += sum(sizes)
        n_calls += sum(expected)
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return FormatThroughput(
        format=name,
        turns=done,
        seconds=elapsed,
        turns_per_s=done / elapsed,
        mb_per_s=n_bytes / elapsed / 1e6,
        calls_per_s=n_calls / elapsed,
        mean_turn_bytes=sum(sizes) / len(sizes),
    )


def run_parsers_bench(seconds: float = 3.0, formats: list[str] | None = None) -> ParsersBench:
    """Measure each format (all by default) for an equal share of `seconds`."""
    names = formats or list_parsers()
    unknown = sorted(set(names) - set(list_parsers()))
    if unknown:
        raise ValueError(
            f"unknown parser(s) {', '.join(unknown)}; known: {', '.join(list_parsers())}"
        )
    share = seconds / len(names)
    return ParsersBench(
        seconds_per_format=share,
        formats={name: bench_format(name, share) for name in names},
    )
