"""Local dataset files, record by record: JSONL (line by line), JSON, Parquet (in batches).

A record that cannot be read (a line that is not UTF-8 or not JSON, a Parquet row group that
cannot be decoded) is an error record of its own and the rest of the file still loads; a file
that cannot be opened at all is one error record with number 0. Blocking: run off the event
loop (`clotho.data.load_records` / `stream_records` do).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from clotho.data.record import Record
from clotho.errors import ConfigError, TaskError

# One JSONL line, and a whole .json file, are parsed in memory: past these caps the line (or
# file) is an error. Within them memory is bounded, not small: text costs about its size,
# a line of many small numbers several times more. TB2 rows carry base64 archives, hence
# the sizes; for bigger sets use JSONL with small lines or Parquet.
MAX_LINE_BYTES = 512 * 1024**2
MAX_JSON_BYTES = 1024**3
# A .json object whose list under one of these keys holds the records.
LIST_KEYS = ("instances", "rows", "records", "data", "items", "examples", "tasks")
_CHUNK = 1024**2


def _problem(exc: BaseException) -> str:
    """An exception's text on one printable line (a library's message may carry bytes of
    the hostile file itself)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = "".join(c if c.isprintable() else " " for c in str(exc))
    return " ".join(text.split())[:200] or type(exc).__name__


def _long_lines(file: IO[bytes], cap: int) -> Iterator[bytes | None]:
    """The file's lines (newline kept); None for a line longer than `cap`, which is skipped
    without ever being held whole in memory."""
    while True:
        line = file.readline(cap + 1)
        if not line:
            return
        if len(line) <= cap or line.endswith(b"\n"):
            yield line
            continue
        while not line.endswith(b"\n"):  # drop the rest of the overlong line
            line = file.readline(_CHUNK)
            if not line:
                break
        yield None


def read_jsonl(path: Path, label: str) -> Iterator[Record]:
    with path.open("rb") as file:
        for number, raw in enumerate(_long_lines(file, MAX_LINE_BYTES), start=1):
            where = f"{label}:{number}"
            if raw is None:
                yield Record.failed(where, number, f"longer than {MAX_LINE_BYTES} bytes")
                continue
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                yield Record.failed(where, number, f"not UTF-8 text (byte {exc.start})")
                continue
            if not line.strip():
                continue
            try:
                yield Record(where, number, json.loads(line))
            except (ValueError, RecursionError) as exc:
                yield Record.failed(where, number, f"not valid JSON: {_problem(exc)}")


def read_json(path: Path, label: str) -> Iterator[Record]:
    """A list of records, an object holding one under a known key, or one object."""
    if path.stat().st_size > MAX_JSON_BYTES:
        raise TaskError(f"{label}: larger than {MAX_JSON_BYTES} bytes: use JSONL or Parquet")
    try:
        data = json.loads(path.read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise TaskError(f"{label}: not UTF-8 text (invalid byte at offset {exc.start})") from exc
    except (ValueError, RecursionError) as exc:
        raise TaskError(f"{label}: not valid JSON: {_problem(exc)}") from exc
    if isinstance(data, dict):
        held = [data[k] for k in LIST_KEYS if isinstance(data.get(k), list)]
        data = held[0] if len(held) == 1 else [data]
    elif not isinstance(data, list):
        data = [data]
    for index, item in enumerate(data):
        yield Record(f"{label}[{index}]", index + 1, item)


def plain(value: Any) -> Any:
    """Parquet and Arrow values as JSON would hold them: dates and times as ISO strings,
    decimals as floats, durations as seconds (a record must be writable as JSON again)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ConfigError("reading Parquet needs pyarrow: pip install 'clotho-rl[data]'") from exc
    return pq


def read_parquet(path: Path, label: str, batch_rows: int) -> Iterator[Record]:
    """Row group by row group, `batch_rows` rows decoded at a time: a multi-GB file is never
    in memory at once, and a row group that cannot be decoded fails only its own rows."""
    pq = _pyarrow_parquet()
    import pyarrow as pa

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TaskError(f"{label}: not a readable Parquet file: {_problem(exc)}") from exc
    with parquet:
        metadata = parquet.metadata
        first = 0
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            index = first
            try:
                for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=[group]):
                    for data in batch.to_pylist():
                        yield Record(f"{label}[{index}]", index + 1, plain(data))
                        index += 1
            except (pa.ArrowException, OSError, ValueError) as exc:
                where = f"{label}[{index}:{first + rows}]"
                yield Record.failed(
                    where, index + 1, f"row group {group} cannot be decoded: {_problem(exc)}"
                )
            first += rows


def parquet_columns(path: Path, label: str) -> list[str]:
    """The column names, from the footer alone; `TaskError` when it cannot be read."""
    pq = _pyarrow_parquet()
    import pyarrow as pa

    try:
        return list(pq.read_schema(path).names)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TaskError(f"{label}: not a readable Parquet file: {_problem(exc)}") from exc
