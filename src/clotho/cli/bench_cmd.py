"""`clotho bench ...`: measured numbers beside baselines from the same run."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from clotho.bench.agents_bench import AgentsBench, run_agents_bench
from clotho.bench.parsers_bench import ParsersBench, run_parsers_bench
from clotho.bench.sandbox_bench import TARGETS, SandboxBench, SlotFigures, run_sandbox_bench
from clotho.bench.scale_bench import ScaleBench, run_scale_bench
from clotho.bench.view_bench import view_bench_command
from clotho.chat.parsers import list_parsers
from clotho.cli.swe_cmd import swe_bench_command

app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
app.command("view")(view_bench_command)
app.command("swe")(swe_bench_command)
console = Console(stderr=True)

_ROWS = [
    ("warm exec p50 (ms)", "warm_exec_p50_ms"),
    ("warm exec p95 (ms)", "warm_exec_p95_ms"),
    ("throughput, 32 callers (cmd/s)", "throughput_32_per_s"),
    ("pool acquire from warm, p50 (ms)", "acquire_p50_ms"),
    ("cold start to first answer (ms)", "cold_start_ms"),
    ("reset 1000-file git workspace (ms)", "reset_ms"),
    ("replace a used sandbox (ms)", "replace_ms"),
    ("memory per idle sandbox (MB)", "idle_memory_mb"),
]


def _table(result: SandboxBench) -> Table:
    table = Table(title=f"sandbox benchmark: {result.backend} backend")
    table.add_column("measure")
    table.add_column("clotho", justify="right")
    table.add_column("target", justify="right")
    names = list(result.baseline)
    for name in names:
        table.add_column(name, justify="right")
    for label, key in _ROWS:
        target = ""
        if key in TARGETS:
            op, limit = TARGETS[key]
            limit = limit[result.backend] if isinstance(limit, dict) else limit
            mark = "[green]ok" if result.targets_met.get(key) else "[red]missed"
            target = f"{op} {limit:g} {mark}"
        cells = [
            f"{getattr(b, key):.4g}" if getattr(b, key, None) is not None else "-"
            for b in result.baseline.values()
        ]
        table.add_row(label, f"{getattr(result, key):.4g}", target, *cells)
    return table


def _slots_table(slots: SlotFigures) -> Table:
    table = Table(
        title=f"{slots.slots_per_container} slots per container (isolation: {slots.isolation})"
    )
    table.add_column("measure")
    table.add_column("clotho", justify="right")
    for label, value in (
        ("a slot in a running container, to first answer (ms)", slots.slot_start_p50_ms),
        ("a slot that needed a new container (ms)", slots.container_start_p50_ms),
        ("warm exec p50 (ms)", slots.warm_exec_p50_ms),
        ("throughput, 32 callers over 32 slots (cmd/s)", slots.throughput_32_per_s),
        ("memory per idle slot (MB, system-wide)", slots.idle_memory_mb),
    ):
        table.add_row(label, f"{value:.4g}")
    return table


@app.command("sandbox")
def sandbox_command(
    backend: Annotated[Literal["local", "docker"], typer.Option(help="sandbox backend")] = "local",
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    quick: Annotated[
        bool, typer.Option(help="fewer samples, sandboxes and files (for smoke tests)")
    ] = False,
    slots: Annotated[
        int, typer.Option(min=1, help="docker: also measure N slots per shared container")
    ] = 1,
) -> None:
    """Exec latency, throughput, acquire, cold start, reset and memory, beside baselines."""
    if slots > 1 and backend != "docker":
        raise typer.BadParameter("slots per container need --backend docker", param_hint="--slots")
    say = (
        (lambda msg: None) if json_ else (lambda msg: console.print(f"[dim]measuring {msg} ...[/]"))
    )
    result = asyncio.run(run_sandbox_bench(backend, quick=quick, slots=slots, progress=say))
    if json_:
        print(result.model_dump_json())
    else:
        console.print(_table(result))
        if result.slots is not None:
            console.print(_slots_table(result.slots))


def _parsers_table(result: ParsersBench) -> Table:
    table = Table(title=f"tool-call parsers: {result.seconds_per_format:.2g} s per format")
    table.add_column("format")
    for label in ("turns/s", "MB/s", "calls/s", "bytes/turn"):
        table.add_column(label, justify="right")
    for row in result.formats.values():
        table.add_row(
            row.format,
            f"{row.turns_per_s:,.0f}",
            f"{row.mb_per_s:.1f}",
            f"{row.calls_per_s:,.0f}",
            f"{row.mean_turn_bytes:.0f}",
        )
    return table


@app.command("parsers")
def parsers_command(
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    seconds: Annotated[
        float, typer.Option(min=0.0, help="total measuring time, shared by the formats")
    ] = 3.0,
    formats: Annotated[
        list[str] | None, typer.Option("--format", help="only this format (repeatable)")
    ] = None,
) -> None:
    """Client-side tool-call parsing throughput per format (turns/s, MB/s, calls/s)."""
    unknown = sorted(set(formats or []) - set(list_parsers()))
    if unknown:
        raise typer.BadParameter(
            f"unknown format(s) {', '.join(unknown)}; known: {', '.join(list_parsers())}",
            param_hint="--format",
        )
    result = run_parsers_bench(seconds, formats)
    if json_:
        print(result.model_dump_json())
    else:
        console.print(_parsers_table(result))


def _scale_table(result: ScaleBench) -> Table:
    table = Table(title="scale benchmark: scripted tool-heavy rollouts, bubblewrap sandboxes")
    for column in ("setup", "rollouts/s", "commands/s", "utilisation", "exec p50 (ms)"):
        table.add_column(column, justify="left" if column == "setup" else "right")
    table.add_column("start p50 (ms)", justify="right")
    table.add_column("driver CPU / rollout (ms)", justify="right")
    for row in result.rows:
        table.add_row(
            row.setup,
            f"{row.rollouts_per_s:.3g}",
            f"{row.commands_per_s:.4g}",
            f"{row.utilisation:.0%}",
            f"{row.exec_p50_ms:.3g}",
            f"{row.start_p50_ms:.3g}",
            f"{row.driver_cpu_ms_per_rollout:.3g}",
        )
    return table


@app.command("scale")
def scale_command(
    nodes: Annotated[
        int | None,
        typer.Option(min=1, max=8, help="local Ray node processes, up to [default: 3]"),
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    quick: Annotated[bool, typer.Option(help="fewer samples (for smoke tests)")] = False,
    address: Annotated[
        str | None,
        typer.Option(help="a running Ray cluster to measure as it is, instead of local nodes"),
    ] = None,
) -> None:
    """Rollouts per second and sandbox utilisation over 1..N local Ray nodes beside the
    single-process pool, and what going through a node's host costs (extra ray)."""
    if address is not None and nodes is not None:
        raise typer.BadParameter(
            "--nodes grows a cluster the benchmark starts; --address measures one as it is",
            param_hint="--nodes",
        )
    result = asyncio.run(run_scale_bench(nodes or 3, quick=quick, address=address))
    if json_:
        print(result.model_dump_json(indent=2))
        return
    console.print(_scale_table(result))
    mark = "[green]ok" if result.target_met else "[red]missed"
    console.print(
        f"added per command through the node's host: {result.command_overhead_ms:.3g} ms "
        f"(target < 1 ms {mark}[/]); per sandbox start: {result.start_overhead_ms:.3g} ms"
    )
    projected = ", ".join(f"{n}: {v:.3g}" for n, v in result.projected_rollouts_per_s.items())
    console.print(
        f"one driver saturates at {result.driver_limit_rollouts_per_s:.3g} rollouts/s: linear "
        f"to ~{result.linear_up_to_nodes:.0f} nodes of this size; projected rollouts/s by "
        f"nodes: {projected}"
    )


def _agents_table(result: AgentsBench) -> Table:
    table = Table(
        title=f"installed agents ({result.backend} sandboxes): the model server alone "
        f"{result.model_alone_p50_ms:.3g} ms p50 per call ({result.calls} calls)"
    )
    for column in ("agent", "API", "gateway p50 ms", "added ms", "prepare s", "bind ms",
                   "upload instead s", "install once s", "MB"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("agent", "API") else "right")

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.3g}"

    for row in result.agents:
        table.add_row(
            f"{row.agent} {row.version}",
            row.api,
            cell(row.gateway_p50_ms),
            cell(row.gateway_overhead_ms),
            cell(row.prepare_s),
            cell(row.bind_ms),
            cell(row.upload_s),
            cell(row.install_once_s),
            cell(row.install_mb),
        )
    return table


@app.command("agents")
def agents_command(
    backend: Annotated[Literal["local", "docker"], typer.Option(help="sandbox backend")] = "local",
    agent: Annotated[
        list[str] | None, typer.Option("--agent", help="only this agent (repeatable)")
    ] = None,
    calls: Annotated[int, typer.Option(min=1, help="model calls timed per path")] = 200,
    upload: Annotated[
        bool, typer.Option("--upload/--no-upload", help="also time the upload fallback")
    ] = True,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Per installed agent: the gateway's latency per model call against the model server
    alone, and the sandbox's preparation (python probe, cached install, read-only bind)."""
    from clotho.cli.running import user_errors

    say = (
        (lambda msg: None) if json_ else (lambda msg: console.print(f"[dim]measuring {msg} ...[/]"))
    )
    with user_errors(console):
        result = asyncio.run(
            run_agents_bench(backend, agents=agent, calls=calls, upload=upload, progress=say)
        )
    if json_:
        print(result.model_dump_json())
        return
    console.print(_agents_table(result))
    console.print(
        "prepare: the image's python probe, the cached install and the read-only bind "
        "(--json has each); upload: the copy a backend that cannot bind makes instead"
    )
    for row in result.agents:
        if row.error:
            console.print(f"[yellow]{escape(row.agent)}[/]: {escape(row.error)}")
