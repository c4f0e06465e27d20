"""`clotho sandbox ls|gc`: see the sandboxes clotho made, and remove what dead runs left."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clotho.sandbox.leases import (
    SLOT_ISOLATION,
    SLOTS,
    SandboxRecord,
    docker_records,
    local_records,
    owner_alive,
    remove_docker,
    remove_local,
)

app = typer.Typer(help="List and clean up sandboxes.", no_args_is_help=True)
console = Console()


async def _docker_list() -> tuple[list[SandboxRecord], str | None]:
    try:
        from clotho.sandbox.docker.backend import docker_client

        docker = docker_client()
    except Exception as exc:
        return [], str(exc)
    try:
        return await docker_records(docker), None
    except Exception as exc:
        return [], f"docker: {exc}"
    finally:
        await docker.close()


async def _collect(state_dir: str | None) -> tuple[list[SandboxRecord], str | None]:
    docker, problem = await _docker_list()
    return local_records(state_dir) + docker, problem


def _slots(record: SandboxRecord) -> str:
    """How many sandboxes a shared Docker container hosts, and how they are isolated."""
    slots = record.labels.get(SLOTS)
    if not slots:
        return "-"
    return f"{slots} ({record.labels.get(SLOT_ISOLATION, '?')})"


def _age(created: float | str | None) -> str:
    if isinstance(created, str):  # docker reports RFC 3339 in some versions
        return created[:19]
    if not created:
        return "-"
    return f"{time.time() - created:.0f} s"


@app.command("ls")
def ls_command(
    state_dir: Annotated[
        str | None, typer.Option(help="local sandbox folder (default: TMPDIR)")
    ] = None,
) -> None:
    """List clotho sandboxes (local folders and Docker containers) with their leases."""
    records, problem = asyncio.run(_collect(state_dir))
    table = Table()
    for column in (
        "backend",
        "id",
        "owner",
        "owner alive",
        "run",
        "task",
        "slots",
        "age",
        "lease left",
        "orphan",
    ):
        table.add_column(column)
    now = time.time()
    for r in records:
        alive = owner_alive(r.owner)
        left = f"{r.expires - now:.0f} s" if r.expires else "-"
        table.add_row(
            r.backend, r.id, r.owner or "-", "?" if alive is None else str(alive),
            r.labels.get("clotho.run", "-"), r.labels.get("clotho.task", "-"), _slots(r),
            _age(r.created), left, "yes" if r.orphaned(now) else "",
        )  # fmt: skip
    console.print(table)
    if problem:
        console.print(f"[yellow]docker not listed:[/] {problem}")


async def _gc(state_dir: str | None, everything: bool) -> tuple[int, str | None]:
    records, problem = await _collect(state_dir)
    doomed = [r for r in records if everything or r.orphaned()]
    docker = None
    removed = 0
    try:
        for record in doomed:
            if record.path is not None:  # a folder on this host (a local sandbox, FIFOs)
                await asyncio.to_thread(remove_local, record)
            else:
                if docker is None:
                    from clotho.sandbox.docker.backend import docker_client

                    docker = docker_client()
                await remove_docker(docker, record)
            removed += 1
    finally:
        if docker is not None:
            with contextlib.suppress(Exception):
                await docker.close()
    return removed, problem


@app.command("gc")
def gc_command(
    state_dir: Annotated[
        str | None, typer.Option(help="local sandbox folder (default: TMPDIR)")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="remove every clotho sandbox, live owner or not")
    ] = False,
) -> None:
    """Remove sandboxes whose owner process is dead or whose lease expired."""
    removed, problem = asyncio.run(_gc(state_dir, all_))
    console.print(f"removed {removed} sandbox(es)")
    if problem:
        console.print(f"[yellow]docker not checked:[/] {problem}")
