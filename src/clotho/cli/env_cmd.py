"""`clotho process` and `clotho evaluate`: run an RL environment without a trainer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from clotho.cli import options as opt
from clotho.cli.env_options import EnvArg, build_environment, console, run_env_command
from clotho.cli.running import user_errors
from clotho.cli.sft_options import SftFlags, load_sft_tokenizer, print_sft
from clotho.env.driver import produce_groups
from clotho.env.scored import ScoredGroup

if TYPE_CHECKING:
    from clotho.env.base import Environment
    from clotho.export.sft import SftOptions
    from clotho.export.writer import SftExporter
    from clotho.rollout import RolloutOutcome
    from clotho.tools.tool import Tool


@opt.with_sft_flags
def process_command(
    env: EnvArg,
    out: Annotated[
        Path | None,
        typer.Option(help="JSONL file of scored groups (default: runs/process-<env>-<time>.jsonl)"),
    ] = None,
    n_groups: Annotated[int, typer.Option(min=1, help="how many groups to produce")] = 8,
    concurrency: opt.Workers = None,
    config: opt.ConfigFile = None,
    set_: opt.Set = None,
    model: opt.Model = None,
    base_url: opt.BaseUrl = None,
    group_size: opt.GroupSize = None,
    tokenizer: opt.EnvTokenizer = None,
    sandbox: opt.Sandbox = None,
    slots_per_container: opt.SlotsPerContainer = None,
    instances: Annotated[
        list[str] | None,
        typer.Option(
            help="instance files (environments with `instances`)", rich_help_panel=opt.RUN
        ),
        opt.To("instances"),
    ] = None,
    generate: Annotated[
        Path | None,
        typer.Option(
            help="swe: generate instances from this git repository instead of files",
            rich_help_panel=opt.RUN,
        ),
        opt.To("generate", str),
    ] = None,
    save_tasks: Annotated[
        Path | None,
        typer.Option(
            help="environments that generate tasks (endless): keep them here as Harbor tasks",
            rich_help_panel=opt.OUTPUT,
        ),
        opt.To("save_tasks", str),
    ] = None,
    max_items: Annotated[
        int | None,
        typer.Option(
            min=1, help="items used, and groups produced at most", rich_help_panel=opt.RUN
        ),
        opt.To("max_items"),
    ] = None,
    wandb: opt.Wandb = None,
    ray: opt.Ray = None,
    sft: SftFlags = SftFlags(),
) -> None:
    """Produce scored groups without a trainer: JSONL plus a report page (clotho view's export).

    With --sft-out, every rollout (those of dropped groups and, with --sft-errors, errored
    ones too) is also filtered into SFT data as it ends; the file appears, complete, when the
    run ends or is interrupted. Its tokens come from --sft-tokenizer, else --tokenizer.
    """
    from clotho.trainers.jsonl import JsonlSink
    from clotho.view.export import write_groups_report

    with user_errors(console):
        flags = opt.overrides(process_command, locals())  # the parameters, nothing else yet
        sft_options = sft.options()

    if max_items:
        n_groups = min(n_groups, max_items)
    out = out or Path("runs") / f"process-{Path(env).stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"

    async def main() -> None:
        environment = build_environment(env, config, set_, ray=ray, flags=flags)
        exporter = await _sft_exporter(environment, sft.out, sft_options)
        tool_errors = None
        if wandb:  # the groups file has no tool errors: watched as the rollouts end
            from clotho.runs.tracking import ToolErrorLog

            tool_errors = ToolErrorLog().attach(environment)
        sink = JsonlSink(out)
        written: list[ScoredGroup] = []

        def shown(group: ScoredGroup) -> None:
            written.append(group)
            console.print(f"  group {len(written)}: scores {group.scores}")

        started = False  # a run that never produced leaves an earlier SFT file alone
        try:
            await environment.setup()
            await environment.preflight()
            started = True
            await produce_groups(environment, sink, n_groups=n_groups, on_group=shown)
        finally:
            await sink.aclose()
            await environment.close()
            if exporter is not None and sft.out is not None:
                if started:
                    print_sft(console, sft.out, await asyncio.to_thread(exporter.commit))
                else:
                    exporter.abort()
            # Rendering long groups takes a tenth of a second of CPU and more: in a thread.
            await asyncio.to_thread(
                write_groups_report, out, out.with_suffix(".html"), environment.stats
            )
            if wandb:
                from clotho.runs.tracking import track_groups

                track_groups(
                    out,
                    wandb,
                    stats=environment.stats,
                    name=f"process-{env}",
                    config=environment.config.model_dump(mode="json"),
                    tool_errors=tool_errors,
                )
            console.print(f"{len(written)} groups in {out} (report {out.with_suffix('.html')})")
            console.print(f"stats: {environment.stats.model_dump()}")

    run_env_command(main())


async def _sft_exporter(
    environment: Environment[Any], path: Path | None, options: SftOptions | None
) -> SftExporter | None:
    """An exporter fed by every rollout of `environment` as it ends (conversion in a thread)."""
    if path is None or options is None:
        return None
    from clotho.export.sources import item_name, tool_schemas
    from clotho.export.sources import trajectory_of_outcome as of_outcome
    from clotho.export.writer import SftExporter

    if options.tokenizer is None and environment.config.tokenizer:
        options = options.model_copy(update={"tokenizer": environment.config.tokenizer})
    tok = await asyncio.to_thread(load_sft_tokenizer, options)
    exporter = SftExporter(path, options, tok)

    async def on_rollout(item: Any, tools: Sequence[Tool], outcome: RolloutOutcome) -> None:
        trajectory = of_outcome(
            outcome, tool_schemas(tools), source=f"process:{environment.name}", task=item_name(item)
        )
        await asyncio.to_thread(exporter.add, trajectory)

    environment.on_rollout(on_rollout)
    return exporter


def evaluate_command(
    env: EnvArg,
    out: Annotated[Path, typer.Option(help="run directory (same layout as clotho eval)")],
    config: opt.ConfigFile = None,
    set_: opt.Set = None,
    model: opt.Model = None,
    base_url: opt.BaseUrl = None,
    tokenizer: opt.EnvTokenizer = None,
    wandb: opt.Wandb = None,
    ray: opt.Ray = None,
) -> None:
    """Run the environment's evaluate() and write metrics and samples into a run directory."""
    flags = opt.overrides(evaluate_command, locals())  # the parameters, nothing else yet
    from clotho.cli.eval_cmd import print_report
    from clotho.runs.env_eval import write_evaluation

    async def main() -> None:
        environment = build_environment(env, config, set_, ray=ray, flags=flags)
        try:
            await environment.setup()
            await environment.preflight()
            samples = await environment.evaluate()
        finally:
            await environment.close()
        metrics = await write_evaluation(samples, out, agent=f"env:{env}")
        print_report(metrics, out)
        if wandb:
            from clotho.runs.tracking import track_run

            track_run(out, wandb, job_type="evaluate")

    run_env_command(main())
