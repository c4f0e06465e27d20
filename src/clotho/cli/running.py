"""How every command ends: a user's mistake or a typed failure is one line and exit code 2,
an interruption (Ctrl-C, SIGTERM, SIGHUP) is exit code 130 with what was kept."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from clotho.cli.signals import Terminated, cancel_on_signals
from clotho.errors import ClothoError, describe_validation_error

T = TypeVar("T")


@contextlib.contextmanager
def user_errors(console: Console) -> Iterator[None]:
    """Messages print as written: brackets in them are not read as Rich markup."""
    try:
        yield
    except ValidationError as exc:
        console.print(f"[red]invalid configuration:[/] {escape(describe_validation_error(exc))}")
        raise typer.Exit(2) from None
    except ClothoError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None


def run_async(main: Coroutine[Any, Any, T], console: Console, *, interrupted: str) -> T:
    """Run a command's coroutine; SIGTERM and SIGHUP cancel it the way Ctrl-C does."""
    with user_errors(console):
        try:
            return asyncio.run(cancel_on_signals(main))
        except (KeyboardInterrupt, Terminated):
            console.print(f"[yellow]interrupted[/]: {escape(interrupted)}")
            raise typer.Exit(130) from None
