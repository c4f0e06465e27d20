"""`clotho check`: is every task sound (oracle passes, nop fails)?"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.table import Table

from clotho.runs.check import check_tasks
from clotho.sandbox.config import LocalSandboxConfig, UnsafeLocalSandboxConfig

console = Console(stderr=True)


def check_command(
    paths: Annotated[list[Path], typer.Argument(help="task directories or folders of them")],
    sandbox: Annotated[
        Literal["local", "unsafe-local"], typer.Option(help="sandbox backend")
    ] = "local",
    concurrency: Annotated[int, typer.Option(min=1, help="tasks checked at once")] = 4,
) -> None:
    """Run each task's reference solution (must pass) and no agent at all (must fail)."""
    config = LocalSandboxConfig() if sandbox == "local" else UnsafeLocalSandboxConfig()
    checks, errors = asyncio.run(check_tasks(paths, config, concurrency))
    table = Table(title="task check")
    for column in ("task", "oracle", "nop", "verdict"):
        table.add_column(column)
    for check in checks:
        verdict = "[green]ok" if check.ok else "[red]" + "; ".join(check.problems)
        table.add_row(check.task, str(check.oracle_reward), str(check.nop_reward), verdict)
    console.print(table)
    for error in errors:
        console.print(f"[red]invalid task:[/] {error}")
    bad = sum(not c.ok for c in checks) + len(errors)
    console.print(
        f"{len(checks) - sum(not c.ok for c in checks)} of {len(checks) + len(errors)} tasks are sound"
    )
    if bad:
        raise typer.Exit(1)
