"""`clotho sandbox ls|gc`: see the sandboxes clotho made, and remove what dead runs left."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.backends import SandboxBackend, make_backend
from clotho.sandbox.config import config_type, sandbox_kinds
from clotho.sandbox.host.leases import SLOT_ISOLATION, SLOTS, SandboxRecord, owner_alive

app = typer.Typer(help="List and clean up sandboxes.", no_args_is_help=True)
console = Console()

DockerUrl = Annotated[
    str | None,
    typer.Option(help="Docker Engine API address (default: DOCKER_HOST or the unix socket)"),
]
StateDir = Annotated[str | None, typer.Option(help="local sandbox folder (default: TMPDIR)")]
RayAddress = Annotated[
    str | None,
    typer.Option("--ray", help="also every node of this Ray cluster (address or auto)"),
]


def _backends(
    state_dir: str | None, docker_url: str | None, ray: str | None = None
) -> tuple[list[SandboxBackend], str | None]:
    """The backends to ask: one for each registered kind that lists its own leftovers on
    this host (`listing`: local folders, bubblewrap and unsafe-local alike, and Docker), and
    with `ray` the local folders on every node of that cluster."""
    backends: list[SandboxBackend] = []
    problems = []
    for kind in sandbox_kinds():
        config = config_type(kind).listing(state_dir)
        if config is None:
            continue
        try:
            backends.append(make_backend(config, docker_url=docker_url))
        except ImportError as exc:  # its SDK (an extra) is not installed
            problems.append(f"{kind}: {exc}")
    if ray:
        from clotho.sandbox.remote_config import RaySandboxConfig

        inner = LocalSandboxConfig(state_dir=state_dir)
        backends.append(make_backend(RaySandboxConfig(address=ray, inner=inner)))
    return backends, "; ".join(problems) or None


async def _collect(
    backends: list[SandboxBackend],
) -> tuple[list[tuple[SandboxBackend, SandboxRecord]], list[str]]:
    found: list[tuple[SandboxBackend, SandboxRecord]] = []
    problems = []
    for backend in backends:
        try:
            found += [(backend, r) for r in await backend.records()]
        except Exception as exc:
            problems.append(f"{backend.kind}: {exc}")
    return found, problems


async def _list(
    state_dir: str | None, docker_url: str | None, ray: str | None = None
) -> tuple[list[SandboxRecord], list[str]]:
    backends, problem = _backends(state_dir, docker_url, ray)
    try:
        found, problems = await _collect(backends)
    finally:
        for backend in backends:
            await backend.aclose()
    return [r for _, r in found], problems + ([problem] if problem else [])


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
    state_dir: StateDir = None, docker_url: DockerUrl = None, ray: RayAddress = None
) -> None:
    """List clotho sandboxes (local folders, Docker containers: every kind on this host)
    with their leases."""
    records, problems = asyncio.run(_list(state_dir, docker_url, ray))
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
    for problem in problems:
        console.print(f"[yellow]not listed:[/] {escape(problem)}")


async def _gc(
    state_dir: str | None, docker_url: str | None, everything: bool, ray: str | None = None
) -> tuple[int, list[str]]:
    backends, problem = _backends(state_dir, docker_url, ray)
    problems = [problem] if problem else []
    removed = 0
    try:
        found, failed = await _collect(backends)
        problems += failed
        for backend, record in found:
            if everything or record.orphaned():
                try:
                    await backend.remove(record)
                except Exception as exc:
                    problems.append(f"removing {record.backend} {record.id}: {exc}")
                    continue
                removed += 1
    finally:
        for backend in backends:
            await backend.aclose()
    return removed, problems


@app.command("gc")
def gc_command(
    state_dir: StateDir = None,
    docker_url: DockerUrl = None,
    all_: Annotated[
        bool, typer.Option("--all", help="remove every clotho sandbox, live owner or not")
    ] = False,
    ray: RayAddress = None,
) -> None:
    """Remove sandboxes whose owner process is dead or whose lease expired."""
    removed, problems = asyncio.run(_gc(state_dir, docker_url, all_, ray))
    console.print(f"removed {removed} sandbox(es)")
    for problem in problems:
        console.print(f"[yellow]not checked:[/] {escape(problem)}")
