"""SIGTERM and SIGHUP end a command the way Ctrl-C does: cancel, clean up, keep results."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(Exception):
    """The command was stopped by a signal other than SIGINT."""


async def cancel_on_signals(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def stop(sig: int) -> None:
        received.append(sig)
        task.cancel()

    sigs = (signal.SIGTERM, signal.SIGHUP)
    for sig in sigs:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await coro
    except asyncio.CancelledError:
        if received:
            raise Terminated(signal.Signals(received[0]).name) from None
        raise
    finally:
        for sig in sigs:
            loop.remove_signal_handler(sig)
