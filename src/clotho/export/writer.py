"""Writing an SFT file: filters, duplicates and conversion applied line by line, committed
atomically.

Lines go to a hidden temporary file beside the target; `commit` fsyncs it and renames it
over the target, so the target only ever holds a finished export — an interrupted or killed
run leaves no half line in it (at most a `.partial` file beside it). `SftExporter.add` is
blocking (a chat template renders in Python, a long conversation tokenizes for a while):
callers on an event loop run it in a thread; it is safe to call from several at once.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, Field

from clotho.chat.template import ChatTemplateError
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.errors import ConfigError
from clotho.export.sft import (
    SftConversionError,
    SftOptions,
    Trajectory,
    build_records,
    normalize_messages,
    record_line,
    rejection,
    trajectory_key,
)


class AtomicLines:
    """A text file written line by line that appears under its name only when committed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # A new name of our own (exclusive create), with the permissions the umask gives.
        self.tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.tmp.open("x", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc}") from exc

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, text: str) -> None:
        self._file.write(text)

    def commit(self) -> None:
        """Flush to disk and put the file in place (replacing an older one)."""
        if self._file.closed:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


class SftStats(BaseModel):
    kept: int = Field(0, description="trajectories written")
    lines: int = 0
    skipped: dict[str, int] = Field(default_factory=dict, description="reason -> trajectories")
    first_failure: str | None = Field(None, description="the first conversion failure, if any")

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        text = f"{self.kept} trajectories ({self.lines} lines)"
        return text + (f"; left out: {skipped}" if skipped else "")


class SftExporter:
    """Keeps, converts and writes trajectories one at a time; counts what it left out."""

    def __init__(
        self, path: Path, options: SftOptions, tokenizer: TemplateTokenizer | None = None
    ) -> None:
        if tokenizer is None and options.tokenizer:
            try:
                tokenizer = TemplateTokenizer.from_path(options.tokenizer)
            except ChatTemplateError as exc:
                raise ConfigError(f"SFT tokenizer: {exc}") from exc
        self.options = options
        self.tokenizer = tokenizer
        self.path = path
        self._out = AtomicLines(path)
        self._seen: set[str] = set()
        self._skipped: Counter[str] = Counter()
        self._kept = 0
        self._lines = 0
        self._first_failure: str | None = None
        self._lock = threading.Lock()

    @property
    def stats(self) -> SftStats:
        with self._lock:
            return SftStats(
                kept=self._kept,
                lines=self._lines,
                skipped=dict(self._skipped),
                first_failure=self._first_failure,
            )

    def _skip(self, reason: str) -> None:
        with self._lock:
            self._skipped[reason] += 1

    def add(self, trajectory: Trajectory) -> bool:
        """Write the trajectory if it is kept; False (and counted) when it is not."""
        reason = rejection(trajectory, self.options)
        if reason is not None:
            self._skip(reason)
            return False
        try:
            messages = normalize_messages(trajectory.messages)
            key = trajectory_key(messages, trajectory.tools)
            with self._lock:
                duplicate = self.options.dedup and key in self._seen
                self._seen.add(key)
            if duplicate:
                self._skip("duplicate")
                return False
            records = build_records(
                trajectory, self.options, self.tokenizer, messages=messages, key=key
            )
        # A hostile or broken trajectory (wrong types, nesting too deep) is not convertible:
        # counted, never the end of the export or of the run feeding it.
        except (
            SftConversionError,
            ChatTemplateError,
            TypeError,
            ValueError,
            RecursionError,
        ) as exc:
            with self._lock:
                self._skipped["not convertible"] += 1
                if self._first_failure is None:
                    where = f"{trajectory.task} #{trajectory.attempt}: " if trajectory.task else ""
                    self._first_failure = where + str(exc)
            return False
        text = "".join(record_line(r) for r in records)
        with self._lock:
            if self._out.closed:  # a rollout that ended after the export was committed
                self._skipped["after the end"] += 1
                return False
            self._out.write(text)
            self._kept += 1
            self._lines += len(records)
        return True

    def add_all(self, trajectories: Iterable[Trajectory]) -> None:
        for trajectory in trajectories:
            self.add(trajectory)

    def commit(self) -> SftStats:
        with self._lock:
            self._out.commit()
        return self.stats

    def abort(self) -> None:
        with self._lock:
            self._out.abort()


def export_sft(
    trajectories: Iterable[Trajectory],
    path: Path,
    options: SftOptions,
    tokenizer: TemplateTokenizer | None = None,
) -> SftStats:
    """Write the kept trajectories to `path` in one go (blocking: call it in a thread from a
    loop). The old file is replaced only once the new one is complete."""
    exporter = SftExporter(path, options, tokenizer)
    try:
        exporter.add_all(trajectories)
    except BaseException:
        exporter.abort()
        raise
    return exporter.commit()
