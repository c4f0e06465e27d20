"""Driving an environment: groups produced by concurrent workers and handed to a sink.

`clotho process` (a JSONL file) and `clotho serve` (a trainer behind the trajectory API) are
the same loop with a different sink; only groups a trainer can train on ever leave it.

Items come from an `ItemLedger`, which knows which items are unfinished. A group being sent
is sent to the end even when the run is cancelled (Ctrl-C, `total_steps` reached): a group
the trainer got must be finished in the ledger (and saved), or a resumed run would produce
its item again. Rollouts still running when the run is cancelled are dropped; their items
stay unfinished and a resumed run produces them again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from clotho.env.base import Environment
from clotho.env.checkpoint import ItemLedger
from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError

log = logging.getLogger(__name__)


class GroupSink(Protocol):
    """Where scored groups go. `wait_for_room` is the trainer's backpressure."""

    async def wait_for_room(self) -> object: ...

    async def send(self, group: ScoredGroup) -> None: ...


async def produce_groups(
    env: Environment[Any],
    sink: GroupSink,
    *,
    concurrency: int | None = None,
    n_groups: int | None = None,
    on_group: Callable[[ScoredGroup], None] | None = None,
    ledger: ItemLedger | None = None,
    on_finished: Callable[[bool], Awaitable[None]] | None = None,
) -> None:
    """Run `concurrency` workers (default: the config's `max_num_workers`), each with one
    group in flight, until `n_groups` groups were attempted (None: until cancelled). A
    dropped group counts as attempted: a bad environment cannot spin forever.

    `on_finished(sent)` runs after each item is finished (its group sent or dropped), with
    the ledger updated: `clotho serve` saves its state there."""
    reason = env.untrainable()
    if reason is not None:
        raise ConfigError(reason)
    workers_n = concurrency if concurrency is not None else env.config.max_num_workers
    if workers_n < 1:
        raise ConfigError(f"concurrency must be at least 1, not {workers_n}")
    ledger = ledger or ItemLedger(env)
    remaining = n_groups
    counting = asyncio.Lock()

    async def finish(ticket: int, group: ScoredGroup | None) -> None:
        if group is not None:
            await sink.send(group)
            env.stats.groups_sent += 1
        ledger.finish(ticket)
        if on_finished is not None:
            await on_finished(group is not None)
        if group is not None and on_group is not None:
            on_group(group)

    async def worker() -> None:
        nonlocal remaining
        while True:
            await sink.wait_for_room()
            async with counting:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                ticket, item = await ledger.take()
            group, _ = await env.collect_group(item)
            delivery = asyncio.ensure_future(finish(ticket, group))
            try:
                await asyncio.shield(delivery)
            except asyncio.CancelledError:
                if not delivery.done():
                    await delivery  # a second cancellation abandons it
                raise

    try:
        async with asyncio.TaskGroup() as workers:
            for _ in range(workers_n):
                workers.create_task(worker())
    except ExceptionGroup as failed:
        # One failure stops the run; the caller gets it as itself (a typed error is a
        # one-line message), the others are logged.
        for other in failed.exceptions[1:]:
            log.error("another worker failed too: %r", other)
        raise failed.exceptions[0] from None
