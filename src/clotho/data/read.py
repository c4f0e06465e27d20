"""Reading a `DatasetSource`: records one by one, the field mapping applied, the limit kept.

`read_records` blocks (file reads, Hub downloads): it is for discovery code that already runs
off the event loop. Async callers use `load_records` (everything, read in a worker thread)
or `stream_records` (batches read in a worker thread as the caller consumes them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from clotho.data.files import read_json, read_jsonl, read_parquet
from clotho.data.hub import read_hub
from clotho.data.record import Record, remap
from clotho.data.source import FILE_FORMATS, DatasetSource
from clotho.errors import TaskError


def _raw(source: DatasetSource) -> Iterator[Record]:
    if source.hub is not None:
        yield from read_hub(source)
        return
    path = Path(source.path or "")
    label = source.label
    form = source.file_format()
    if form is None:
        known = ", ".join(sorted(FILE_FORMATS))
        raise TaskError(f"{label}: not a dataset file ({known}); set `format` to read it anyway")
    if path.is_dir():
        raise TaskError(f"{label}: a folder, not a dataset file (for a `datasets` folder: hub)")
    if form == "jsonl":
        yield from read_jsonl(path, label)
    elif form == "json":
        yield from read_json(path, label)
    else:
        yield from read_parquet(path, label, source.batch_rows)


def read_records(source: DatasetSource | str | Path) -> Iterator[Record]:
    """The source's records (at most `limit`, counting bad ones), each mapped by `fields`.

    A source that cannot be read at all is one error record (`whole_source`) rather than an
    exception; a missing extra (pyarrow, datasets) and an unreachable Hub raise `ConfigError`
    (the user has to act, and no other source would fare better)."""
    source = DatasetSource.parse(source)
    records = _raw(source)
    try:
        for record in islice(records, source.limit):
            if record.error is not None or not source.fields:
                yield record
                continue
            try:
                mapped = Record(
                    record.where, record.number, remap(record.data, source.fields, record.where)
                )
            except TaskError as exc:
                mapped = Record(record.where, record.number, None, exc)
            yield mapped
    except TaskError as exc:
        yield Record(source.label, 0, None, exc)
    except OSError as exc:
        problem = exc.strerror or str(exc)
        yield Record(source.label, 0, None, TaskError(f"{source.label}: cannot be read: {problem}"))
    finally:
        records.close()


def peek(source: DatasetSource | str | Path) -> Any:
    """The first record's data that could be read, or None (blocking, like `read_records`)."""
    records = read_records(source)
    try:
        return next((r.data for r in records if r.ok), None)
    finally:
        records.close()


async def load_records(source: DatasetSource | str | Path) -> list[Record]:
    """Every record, read in a worker thread (for a set that fits in memory)."""
    return await asyncio.to_thread(lambda: list(read_records(source)))


async def stream_records(
    source: DatasetSource | str | Path, batch: int = 256
) -> AsyncIterator[Record]:
    """Records as the caller consumes them, `batch` at a time from a worker thread: a large
    file or a streamed Hub dataset is never held whole, and the event loop never reads."""
    records = read_records(source)
    try:
        while True:
            chunk = await asyncio.to_thread(lambda: list(islice(records, batch)))
            for record in chunk:
                yield record
            if len(chunk) < batch:
                return
    finally:
        # The worker is done with the generator (every await above has returned), unless a
        # cancellation interrupted one: then it is still running and closes on its own end.
        with contextlib.suppress(ValueError):
            await asyncio.to_thread(records.close)
