"""One record of a dataset, or the error that took its place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clotho.errors import TaskError


@dataclass(frozen=True, slots=True)
class Record:
    """`where` names the place (`file.jsonl:3`, `file.parquet[2]`, `hf:name@test[7]`);
    `number` is 1-based (a .jsonl line, else a position), 0 when the whole source failed.
    `data` is the parsed value (usually a dict; consumers validate it) unless `error` is set."""

    where: str
    number: int
    data: Any = None
    error: TaskError | None = None

    @classmethod
    def failed(cls, where: str, number: int, problem: str) -> Record:
        return cls(where, number, None, TaskError(f"{where}: {problem}"))

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def whole_source(self) -> bool:
        """The source could not be read at all (this error stands for all of it)."""
        return self.number == 0


def remap(data: Any, fields: dict[str, str], where: str) -> Any:
    """The record with each mapped field read from its column (`{prompt: question}` renames
    `question` to `prompt`); unmapped columns are kept as they are."""
    if not fields:
        return data
    if not isinstance(data, dict):
        raise TaskError(f"{where}: expected an object, got {type(data).__name__}")
    missing = {name: column for name, column in fields.items() if column not in data}
    if missing:
        name, column = next(iter(missing.items()))
        raise TaskError(
            f"{where}: no column {column!r} (fields.{name}); it has: "
            + ", ".join(sorted(map(str, data))[:20])
        )
    out = {k: v for k, v in data.items() if k not in fields.values()}
    out.update({name: data[column] for name, column in fields.items()})
    return out
