"""Catch event-loop steps slower than a limit, as asyncio's debug mode reports them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing "):  # "Executing <Task ...> took 0.123 seconds"
            self.slow.append(message)


@contextlib.asynccontextmanager
async def slow_callbacks(limit_s: float = 0.05) -> AsyncIterator[list[str]]:
    """Debug mode on the running loop while inside; yields the slow steps it logged."""
    loop = asyncio.get_running_loop()
    debug, limit = loop.get_debug(), loop.slow_callback_duration
    handler = _Collect()
    logger = logging.getLogger("asyncio")
    logger.addHandler(handler)
    loop.set_debug(True)
    loop.slow_callback_duration = limit_s
    try:
        yield handler.slow
    finally:
        loop.set_debug(debug)
        loop.slow_callback_duration = limit
        logger.removeHandler(handler)
