"""A JSONL trainer sink: scored groups appended one per line, and the loader for them.

Each line is a `ScoredGroup`: all 14 upstream keys, as `/batch` serves a group, plus
`schema_version`, so offline trainers and upstream tools that read Atropos group files read
ours, and upstream files (no `schema_version`) load here as version 1.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from clotho.env.scored import SCHEMA_VERSION, ScoredGroup
from clotho.errors import ConfigError
from clotho.trainers.protocol import OFF_LOOP_BYTES, GroupLike, to_wire


def _append(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(text)
        f.flush()


class JsonlSink:
    """Appends groups to `path`; same `send`, `send_groups` and `wait_for_room` calls as
    `AtroposClient`."""

    def __init__(self, path: Path, *, env_id: int | None = None) -> None:
        self.path = path
        self.env_id = env_id
        self.written = 0
        self._lock = asyncio.Lock()

    async def send_groups(self, groups: Sequence[GroupLike]) -> int:
        lines = [to_wire(group, self.env_id) for group in groups]
        text = "".join(line.model_dump_json() + "\n" for line in lines)
        async with self._lock:
            if len(text) > OFF_LOOP_BYTES:
                await asyncio.to_thread(_append, self.path, text)
            else:
                _append(self.path, text)
            self.written += len(lines)
        return len(lines)

    async def send(self, group: GroupLike) -> None:
        """One group (the `GroupSink` call environments' drivers make)."""
        await self.send_groups([group])

    async def wait_for_room(self) -> None:
        """A file is never full: no backpressure."""

    async def aclose(self) -> None:
        """Nothing is held open between calls; present so sinks are interchangeable."""


def load_groups(path: Path) -> list[ScoredGroup]:
    """Every group in `path`. A last line cut short (a crash mid-write) is skipped; any other
    bad line is an error naming the line, so damaged data is never silently dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read groups file {path}: {exc}") from exc
    lines = text.split("\n")
    groups: list[ScoredGroup] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        unfinished = number == len(lines)  # no newline after it: the writer never finished
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if unfinished:
                continue
            raise ConfigError(f"{path}:{number}: not JSON: {exc}") from exc
        version = data.get("schema_version", SCHEMA_VERSION) if isinstance(data, dict) else None
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise ConfigError(
                f"{path}:{number}: schema_version {version} is newer than this clotho "
                f"understands ({SCHEMA_VERSION}); upgrade clotho"
            )
        try:
            groups.append(ScoredGroup.model_validate(data))
        except ValidationError as exc:
            if unfinished:
                continue
            raise ConfigError(f"{path}:{number}: not a scored group: {exc}") from exc
    return groups
