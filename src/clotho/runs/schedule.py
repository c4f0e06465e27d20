"""Scheduling an evaluation's sandboxes: each task's environment prepared once, in the order
the attempts need them (image builds run ahead of the trials), and sandboxes started early."""

from __future__ import annotations

import asyncio
from types import TracebackType

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
        for future in self._futures.values():
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: no "never retrieved" warnings
            else:
                future.cancel()

    async def prepared(self, task: EvalTask) -> PreparedEnvironment:
        return await asyncio.shield(self._futures[task.name])

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
                prepared = await self.pool.prepare(
                    self.config.sandbox,
                    task.environment_spec(),
                    force_build=self.config.force_build,
                )
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(prepared)
