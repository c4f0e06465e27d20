"""Scheduling an evaluation's sandboxes: each task's environment prepared once, in the order
the attempts need them (image builds run ahead of the trials), sandboxes started early, and
the run's budget of retries for attempts the infrastructure lost."""

from __future__ import annotations

import asyncio
from types import TracebackType

from clotho.rollout.run import RetryBudget
from clotho.runs.records import EvalConfig
from clotho.sandbox import PreparedEnvironment
from clotho.sandbox.pool import SlotPool
from clotho.tasks.base import EvalTask


class EnvironmentScheduler:
    def __init__(self, pool: SlotPool, config: EvalConfig, pending: list[tuple[EvalTask, int]]):
        self.pool = pool
        self.config = config
        self.pending = pending
        self._futures: dict[str, asyncio.Future[PreparedEnvironment]] = {}
        self._worker: asyncio.Task[None] | None = None
        self._again: set[asyncio.Task[PreparedEnvironment]] = set()  # preparations retried

    async def __aenter__(self) -> EnvironmentScheduler:
        loop = asyncio.get_running_loop()
        for task, _ in self.pending:
            self._futures.setdefault(task.name, loop.create_future())
        self._worker = asyncio.create_task(self._prepare_all())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        for again in self._again:
            again.cancel()
        await asyncio.gather(*self._again, return_exceptions=True)
        for future in self._futures.values():
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warnings
            else:
                future.cancel()

    async def prepared(self, task: EvalTask, *, again: bool = False) -> PreparedEnvironment:
        """The task's environment; `again` (a retry) prepares it anew if preparing it failed
        (attempts of the same task retried together share the new preparation)."""
        future = self._futures[task.name]
        if again and future.done() and (future.cancelled() or future.exception() is not None):
            renewed = asyncio.ensure_future(self._prepare(task))
            self._again.add(renewed)
            renewed.add_done_callback(self._again.discard)
            self._futures[task.name] = future = renewed
        return await asyncio.shield(future)

    def prewarm_after(self, index: int) -> None:
        """Start the sandbox of the attempt that will run `concurrency` attempts from now."""
        ahead = index + self.config.concurrency
        if not self.config.prewarm or ahead >= len(self.pending):
            return
        future = self._futures[self.pending[ahead][0].name]
        if future.done() and not future.cancelled() and future.exception() is None:
            self.pool.prewarm(future.result().config)

    async def _prepare_all(self) -> None:
        for task, _ in self.pending:
            future = self._futures[task.name]
            if future.done():
                continue
            try:
                prepared = await self._prepare(task)
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(prepared)

    async def _prepare(self, task: EvalTask) -> PreparedEnvironment:
        return await self.pool.prepare(
            self.config.sandbox, task.environment_spec(), force_build=self.config.force_build
        )


def retry_budget(config: EvalConfig, pending: int) -> RetryBudget:
    """The run's budget: `retries` per attempt, `retry_budget` in all, by default enough for
    every attempt in flight lost twice or a quarter of the run, whichever is more."""
    total = config.retry_budget
    if total is None:
        # A lost node or a daemon hiccup can fail every attempt in flight at once (twice
        # is allowed); more than a quarter of the run lost says the infrastructure is down.
        total = max(2 * config.concurrency, -(-pending // 4))
    return RetryBudget(config.retries, total)
