"""Driving an environment: groups produced by concurrent workers and handed to a sink.

`clotho process` (a JSONL file) and `clotho serve` (a trainer behind the trajectory API) are
the same loop with a different sink; only groups a trainer can train on ever leave it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from clotho.env.base import Environment
from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError


class GroupSink(Protocol):
    """Where scored groups go. `wait_for_room` is the trainer's backpressure."""

    async def wait_for_room(self) -> object: ...

    async def send(self, group: ScoredGroup) -> None: ...


async def produce_groups(
    env: Environment[Any],
    sink: GroupSink,
    *,
    concurrency: int,
    n_groups: int | None = None,
    on_group: Callable[[ScoredGroup], None] | None = None,
) -> None:
    """Run `concurrency` workers until `n_groups` groups were attempted (None: until
    cancelled). A dropped group counts as attempted: a bad environment cannot spin forever."""
    reason = env.untrainable()
    if reason is not None:
        raise ConfigError(reason)
    remaining = n_groups
    next_item = asyncio.Lock()

    async def worker() -> None:
        nonlocal remaining
        while True:
            await sink.wait_for_room()
            async with next_item:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                item = await env.get_next_item()
            group, _ = await env.collect_group(item)
            if group is None:
                continue
            await sink.send(group)
            env.stats.groups_sent += 1
            if on_group is not None:
                on_group(group)

    async with asyncio.TaskGroup() as workers:
        for _ in range(concurrency):
            workers.create_task(worker())
