"""`clotho serve`'s lifecycle: produce groups for a trainer, evaluate every `steps_per_eval`
trainer steps, stop at `total_steps`, and save where the item sequence is after every group.

- **Steps.** The trainer's step is `current_step` of `/status-env`, polled every `poll_s` (and
  read on every backpressure check).
- **Stop.** Once the step reaches `total_steps`, production is cancelled: rollouts still
  running are dropped (their items stay unfinished in the state, so a later resume with a
  larger `total_steps` produces them), a group being sent is sent and saved. A due
  evaluation, and one still running, finish first. Groups already queued at the API stay
  there. What is wasted is bounded by `max_num_workers` groups in flight plus the
  backpressure's `max_batches_offpolicy` queued batches.
- **Evaluations** run in a background task next to production, never pausing it: the
  trainer would idle for the evaluation's length otherwise, and an agentic evaluation takes
  minutes. An evaluation runs when a multiple of `steps_per_eval` is crossed (not at step 0,
  not at a boundary passed before this serve first started); one at a time; a boundary
  crossed while one runs is taken when it ends, and the boundaries between are skipped
  (recorded): the policy they measured is gone. A boundary is evaluated once: the state and
  `evaluations.jsonl` say which was last, across restarts.
- **Resume.** See `clotho.env.checkpoint`: the state is saved after every group sent or
  dropped, and on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from clotho.env.base import Environment
from clotho.env.checkpoint import EvaluationRecord, ItemLedger, ServeState, StateDir
from clotho.env.driver import produce_groups
from clotho.env.evaluation import EvalSample
from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError

log = logging.getLogger(__name__)


class TrainerLink(Protocol):
    """The trajectory API as the lifecycle uses it (`AtroposClient` is one)."""

    async def wait_for_room(self) -> Any: ...

    async def send(self, group: ScoredGroup) -> None: ...

    async def status_env(self) -> Any: ...


EvalMetrics = Callable[[list[EvalSample]], dict[str, Any]]
"""Turns an evaluation's samples into the metrics logged (pass rate, mean reward, ...)."""


@dataclass
class ServeSummary:
    reached_total: bool
    trainer_step: int
    groups_sent: int
    groups_dropped: int
    evaluations: list[EvaluationRecord] = field(default_factory=list)
    resumed_items: int = 0
    unfinished: int = 0


def steps_boundary(step: int, every: int) -> int:
    """The last multiple of `every` at or below `step`."""
    return (step // every) * every


class ServeLifecycle:
    def __init__(
        self,
        env: Environment[Any],
        link: TrainerLink,
        state_dir: StateDir,
        *,
        metrics: EvalMetrics,
        on_group: Callable[[ScoredGroup], None] | None = None,
        on_eval: Callable[[EvaluationRecord], Awaitable[None] | None] | None = None,
        poll_s: float = 0.5,
    ) -> None:
        self.env = env
        self.link = link
        self.state_dir = state_dir
        self.metrics = metrics
        self.on_group = on_group
        self.on_eval = on_eval
        self.poll_s = poll_s
        config = env.config
        self.total_steps = config.total_steps
        self.steps_per_eval = config.steps_per_eval or None
        if self.steps_per_eval and not env.has_evaluation():
            raise ConfigError(f"{env.name} has no evaluation set: drop steps_per_eval")
        self.ledger = ItemLedger(env, check_resumable=True)
        self.step = 0
        self.last_eval: int | None = None
        self.groups_sent = 0
        self.groups_dropped = 0
        self.evaluations: list[EvaluationRecord] = []
        self.resumed_items = 0
        self._eval_task: asyncio.Task[None] | None = None
        self._eval_target: int | None = None

    # -- state ------------------------------------------------------------------------------

    def restore(self) -> ServeState | None:
        """Load the state folder's state into the environment (after `env.setup()`)."""
        state = self.state_dir.load()
        last_logged = self.state_dir.last_evaluated_step()
        if state is not None:
            if state.environment != self.env.name:
                raise ConfigError(
                    f"{self.state_dir.path} holds the state of environment "
                    f"{state.environment!r}, not {self.env.name!r}; use another --state-dir"
                )
            self.env.load_state_dict(state.next)
            self.ledger = ItemLedger(self.env, state.unfinished, check_resumable=True)
            self.resumed_items = len(state.unfinished)
            self.groups_sent, self.groups_dropped = state.groups_sent, state.groups_dropped
        known = [s for s in (state.last_eval_step if state else None, last_logged) if s is not None]
        self.last_eval = max(known) if known else None
        return state

    async def save(self) -> None:
        async with self.ledger.lock:  # no item is half-taken while the cursor is read
            after, unfinished = self.ledger.cursor()
            state = ServeState(
                environment=self.env.name,
                next=after,
                unfinished=unfinished,
                last_eval_step=self.last_eval,
                groups_sent=self.groups_sent,
                groups_dropped=self.groups_dropped,
            )
            number = self.state_dir.snapshot_number()
        await self.state_dir.save(state, number)

    async def _finished_item(self, sent: bool) -> None:
        if sent:
            self.groups_sent += 1
        else:
            self.groups_dropped += 1
        await self.save()

    # -- the trainer's progress ---------------------------------------------------------------

    def _observe(self, status: Any) -> None:
        step = getattr(status, "current_step", None)
        if isinstance(step, int):
            self.step = max(self.step, step)

    @property
    def reached_total(self) -> bool:
        return self.total_steps is not None and self.step >= self.total_steps

    async def wait_for_room(self) -> Any:
        """The trainer's backpressure, noting its step on the way (the `GroupSink` side)."""
        status = await self.link.wait_for_room()
        self._observe(status)
        return status

    async def send(self, group: ScoredGroup) -> None:
        await self.link.send(group)

    # -- evaluations ------------------------------------------------------------------------

    def _due(self) -> int | None:
        if not self.steps_per_eval:
            return None
        step = self.step
        if self.total_steps is not None:
            step = min(step, self.total_steps)
        boundary = steps_boundary(step, self.steps_per_eval)
        if boundary <= 0 or boundary <= (self.last_eval or 0):
            return None
        return boundary

    def _start_due_eval(self) -> None:
        if self._eval_task is not None:
            return
        boundary = self._due()
        if boundary is None:
            return
        assert self.steps_per_eval
        since = (self.last_eval or 0) + self.steps_per_eval
        skipped = list(range(since, boundary, self.steps_per_eval))
        self._eval_target = boundary
        self._eval_task = asyncio.create_task(
            self._evaluate(boundary, self.step, skipped), name=f"evaluate-step-{boundary}"
        )

    async def _evaluate(self, boundary: int, observed: int, skipped: list[int]) -> None:
        started, clock = time.time(), time.monotonic()
        metrics: dict[str, Any] = {}
        error = None
        try:
            samples = await self.env.evaluate()
            metrics = self.metrics(samples)
        except Exception as exc:  # an evaluation's failure must not stop training
            log.exception("evaluation at step %d failed", boundary)
            error = f"{type(exc).__name__}: {exc}"
        record = EvaluationRecord(
            step=boundary,
            observed_step=observed,
            skipped=skipped,
            started_at=started,
            duration_s=round(time.monotonic() - clock, 3),
            metrics=metrics,
            error=error,
        )
        await self.state_dir.append_evaluation(record)
        self.last_eval = boundary
        self.evaluations.append(record)
        await self.save()
        if self.on_eval is not None:
            try:
                shown = self.on_eval(record)
                if shown is not None:
                    await shown
            except Exception:  # logging it (wandb) failed; the record is on disk
                log.exception("logging the evaluation at step %d failed", boundary)

    def _reap_eval(self) -> None:
        task = self._eval_task
        if task is not None and task.done():
            self._eval_task = self._eval_target = None
            task.result()  # _evaluate catches the evaluation's own failures; this is a bug

    async def _drain_evals(self) -> None:
        """Finish the running evaluation and any now due (the final boundary)."""
        while True:
            if self._eval_task is not None:
                await asyncio.wait({self._eval_task})
                self._reap_eval()
            self._start_due_eval()
            if self._eval_task is None:
                return

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> ServeSummary:
        """Serve until `total_steps` (or cancellation); the state is saved either way."""
        status = await self.link.status_env()
        self._observe(status)
        if self.last_eval is None and self.steps_per_eval:
            # Not a boundary passed before this serve first started.
            self.last_eval = steps_boundary(self.step, self.steps_per_eval)
        await self.save()
        producer: asyncio.Task[None] | None = None
        try:
            if not self.reached_total:
                producer = asyncio.create_task(
                    produce_groups(
                        self.env,
                        self,
                        ledger=self.ledger,
                        on_group=self.on_group,
                        on_finished=self._finished_item,
                    ),
                    name="produce-groups",
                )
            while not self.reached_total:
                self._start_due_eval()
                waits: set[asyncio.Task[Any]] = {t for t in (producer, self._eval_task) if t}
                await asyncio.wait(waits, timeout=self.poll_s, return_when="FIRST_COMPLETED")
                if producer is not None and producer.done():
                    producer.result()  # a failure ends the run as itself
                    raise RuntimeError("production ended before total_steps")  # pragma: no cover
                self._reap_eval()
                self._observe(await self.link.status_env())
            await self._stop(producer)
            producer = None
            await self._drain_evals()
        finally:
            if producer is not None:  # cancelled or failed: in-flight rollouts are dropped
                await self._stop(producer)
            if self._eval_task is not None:
                self._eval_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._eval_task
            await self.save()
        return ServeSummary(
            reached_total=self.reached_total,
            trainer_step=self.step,
            groups_sent=self.groups_sent,
            groups_dropped=self.groups_dropped,
            evaluations=self.evaluations,
            resumed_items=self.resumed_items,
            unfinished=self.ledger.in_flight + self.ledger.replaying,
        )

    async def _stop(self, producer: asyncio.Task[None] | None) -> None:
        if producer is None or producer.done():
            return
        producer.cancel()
        try:
            await producer
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("production failed while stopping")
