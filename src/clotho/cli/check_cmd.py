"""`clotho check`: is every task sound (oracle passes, nop fails)?"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clotho.cli import options as opt
from clotho.cli.running import run_async
from clotho.runs.check import check_tasks
from clotho.sandbox.config import config_type

console = Console(stderr=True)


def check_command(
    paths: Annotated[list[Path], typer.Argument(help="task directories or folders of them")],
    sandbox: opt.SandboxKind = "local",
    concurrency: Annotated[int, typer.Option(min=1, help="tasks checked at once")] = 4,
) -> None:
    """Run each task's reference solution (must pass) and no agent at all (must fail)."""
    checks, errors = run_async(
        check_tasks(paths, config_type(sandbox)(), concurrency), console, interrupted="nothing kept"
    )
    table = Table(title="task check")
    for column in ("task", "oracle", "nop", "verdict"):
        table.add_column(column)
    for check in checks:
        verdict = "[green]ok" if check.ok else "[red]" + escape("; ".join(check.problems))
        table.add_row(escape(check.task), str(check.oracle_reward), str(check.nop_reward), verdict)
    console.print(table)
    for error in errors:
        console.print(f"[red]invalid task:[/] {escape(error)}")
    bad = sum(not c.ok for c in checks) + len(errors)
    console.print(
        f"{len(checks) - sum(not c.ok for c in checks)} of {len(checks) + len(errors)} tasks are sound"
    )
    if bad:
        raise typer.Exit(1)
