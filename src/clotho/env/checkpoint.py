"""Where `clotho serve` is in its environment's item sequence, kept so a stopped run resumes
without producing an item twice or skipping one.

The cursor is the environment's `state_dict()` (what `get_next_item` reads and changes) after
the last item taken, plus, for every item taken whose group was neither sent nor dropped, the
state from just *before* it was taken. Groups finish in any order with several workers; this
pair stays exact whatever the order: a resume re-takes each unfinished item from its own
"before" state, then continues from the "after" state. A group that was sent is finished
before the cursor is saved, so it never repeats.

The state folder holds `state.json` (replaced atomically: written beside, fsync'ed, renamed),
`evaluations.jsonl` (one line per evaluated step boundary) and a lock file: two serve
processes on one folder would hand out the same items, so the second one is refused.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import logging
import os
import random
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clotho.errors import ConfigError, describe_validation_error

if TYPE_CHECKING:
    from clotho.env.base import Environment

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
EVALUATIONS_FILE = "evaluations.jsonl"
LOCK_FILE = ".lock"
_MT_WORDS = 625  # the Mersenne Twister's 624 words and its position


# -- random.Random state as compact JSON ----------------------------------------------------


def rng_state(rng: random.Random) -> dict[str, Any]:
    """`rng.getstate()` as JSON: the 625 words packed and base64'd (2.5 kB, not 7 kB)."""
    version, words, gauss = rng.getstate()
    return {
        "version": version,
        "words": base64.b64encode(struct.pack(f"<{len(words)}I", *words)).decode(),
        "gauss": gauss,
    }


def set_rng_state(rng: random.Random, data: Any) -> None:
    """Restore `rng_state`; anything else (a hand-edited or hostile file) is a ConfigError."""
    try:
        raw = base64.b64decode(data["words"], validate=True)
        if len(raw) != 4 * _MT_WORDS:
            raise ValueError(f"{len(raw)} bytes of words, not {4 * _MT_WORDS}")
        gauss = data["gauss"]
        if gauss is not None and not isinstance(gauss, float):
            raise TypeError("gauss must be a float or null")
        rng.setstate((int(data["version"]), struct.unpack(f"<{_MT_WORDS}I", raw), gauss))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"invalid random state in the serve state: {exc}") from None


# -- the item ledger ------------------------------------------------------------------------


class ItemLedger:
    """Hands out items with a ticket each and knows which ones are unfinished.

    `take` runs `get_next_item` one at a time (under `lock`), so the state recorded before an
    item is exactly the one it came from; `cursor()` must be read under the same lock.
    `replay` are "before" states of items a previous run left unfinished: they are taken
    again first, each from its own state, and the environment's current state is put back.
    """

    def __init__(
        self,
        env: Environment[Any],
        replay: list[dict[str, Any]] | None = None,
        *,
        check_resumable: bool = False,
    ) -> None:
        self.env = env
        self.lock = asyncio.Lock()
        self._replay = list(replay or [])
        self._open: dict[int, dict[str, Any]] = {}
        self._next_ticket = 0
        self._check = check_resumable

    @property
    def in_flight(self) -> int:
        return len(self._open)

    @property
    def replaying(self) -> int:
        """Items of a previous run still to be taken again."""
        return len(self._replay)

    async def take(self) -> tuple[int, Any]:
        async with self.lock:
            env = self.env
            if self._replay:
                before = self._replay[0]
                current = env.state_dict()
                env.load_state_dict(before)
                try:
                    item = await env.get_next_item()
                finally:
                    env.load_state_dict(current)
                self._replay.pop(0)
            else:
                before = env.state_dict()
                item = await env.get_next_item()
                if self._check:
                    self._check = False
                    if env.state_dict() == before:
                        log.warning(
                            "%s: state_dict() did not change when get_next_item ran, so a "
                            "resumed run cannot know where it was (items may repeat); define "
                            "state_dict/load_state_dict for it",
                            type(env).__name__,
                        )
            ticket = self._next_ticket
            self._next_ticket += 1
            self._open[ticket] = before
            return ticket, item

    def finish(self, ticket: int) -> None:
        """The item's group was sent or dropped: it is never produced again."""
        self._open.pop(ticket)

    def cursor(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(state after the last item taken, "before" states of the unfinished items, oldest
        first). Read it under `lock`."""
        unfinished = [self._open[t] for t in sorted(self._open)] + self._replay
        return self.env.state_dict(), unfinished


# -- the state folder -----------------------------------------------------------------------


class ServeState(BaseModel):
    """`state.json`: everything a resumed `clotho serve` needs."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    environment: str = Field(description="the environment's name; another one cannot resume")
    next: dict[str, Any] = Field(description="state_dict() after the last item taken")
    unfinished: list[dict[str, Any]] = Field(
        default_factory=list, description="state_dict() before each item not sent or dropped"
    )
    last_eval_step: int | None = Field(None, description="the last step boundary evaluated")
    groups_sent: int = 0
    groups_dropped: int = 0
    updated_at: float = Field(default_factory=time.time)


class EvaluationRecord(BaseModel):
    """One line of `evaluations.jsonl`: one evaluation at one step boundary."""

    step: int = Field(description="the step boundary (a multiple of steps_per_eval)")
    observed_step: int = Field(description="the trainer's step when the evaluation started")
    skipped: list[int] = Field(
        default_factory=list, description="earlier boundaries passed while another eval ran"
    )
    started_at: float
    duration_s: float
    metrics: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a crash
    finally:
        os.close(fd)


def _append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class StateDir:
    """A serve state folder: locked for one process, `state.json` saved atomically and in
    order (an older snapshot never overwrites a newer one), evaluations appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._write = asyncio.Lock()
        self._taken = 0
        self._written = 0

    @property
    def state_path(self) -> Path:
        return self.path / STATE_FILE

    @property
    def evaluations_path(self) -> Path:
        return self.path / EVALUATIONS_FILE

    def open(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot use {self.path} as the serve state folder: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another clotho serve is using {self.path}: two would hand out the same items; "
                "give each its own --state-dir"
            ) from None
        self._lock_fd = fd

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def load(self) -> ServeState | None:
        if not self.state_path.exists():
            return None
        try:
            return ServeState.model_validate_json(self.state_path.read_bytes())
        except ValidationError as exc:
            raise ConfigError(
                f"{self.state_path} is not a clotho serve state: {describe_validation_error(exc)}"
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.state_path}: {exc}") from exc

    def last_evaluated_step(self) -> int | None:
        """The newest boundary in `evaluations.jsonl` (written before state.json says so)."""
        if not self.evaluations_path.exists():
            return None
        steps = []
        for number, line in enumerate(self.evaluations_path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                steps.append(EvaluationRecord.model_validate_json(line).step)
            except ValidationError:
                log.warning(
                    "%s line %d is not an evaluation; ignored", self.evaluations_path, number
                )
        return max(steps, default=None)

    def snapshot_number(self) -> int:
        """Number a snapshot when it is taken; `save` drops it if a newer one was written."""
        self._taken += 1
        return self._taken

    async def save(self, state: ServeState, number: int) -> None:
        data = state.model_dump_json().encode()
        async with self._write:
            if number <= self._written:
                return
            await asyncio.to_thread(_write_atomic, self.state_path, data)
            self._written = number

    async def append_evaluation(self, record: EvaluationRecord) -> None:
        await asyncio.to_thread(_append_line, self.evaluations_path, record.model_dump_json())
