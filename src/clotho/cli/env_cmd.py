"""`clotho process`, `clotho serve`, `clotho evaluate`: run an RL environment."""

from __future__ import annotations

import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console

from clotho.cli.config_io import apply_sets, load_config_file, merge
from clotho.cli.running import run_async
from clotho.env.base import Environment
from clotho.env.driver import produce_groups
from clotho.env.registry import load_environment
from clotho.env.scored import ScoredGroup
from clotho.errors import ConfigError

console = Console(stderr=True)

EnvArg = Annotated[
    str, typer.Argument(help="registered name (terminal_tasks) or package.module:Class")
]
ConfigOpt = Annotated[Path | None, typer.Option(help="YAML file with the environment's config")]
SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="override a config field: key.path=value")
]
ModelOpt = Annotated[str | None, typer.Option(help="model name (OpenAI-compatible endpoint)")]
BaseUrlOpt = Annotated[list[str] | None, typer.Option(help="endpoint base URL; repeat to balance")]
GroupOpt = Annotated[int | None, typer.Option(help="rollouts per item")]
TokenizerOpt = Annotated[
    str | None, typer.Option(help="tokenizer folder/file with a chat template")
]
WandbOpt = Annotated[
    str | None,
    typer.Option("--wandb", help="log to this Weights & Biases project (extra wandb)"),
]


def build_environment(
    spec: str,
    config_file: Path | None,
    sets: list[str] | None,
    model: str | None,
    base_url: list[str] | None,
    group_size: int | None,
    tokenizer: str | None,
) -> Environment[Any]:
    """The environment from its config; without a model it loads the embedded one on first use."""
    cls = load_environment(spec)
    data = load_config_file(config_file) if config_file else {}
    flags: dict[str, Any] = {"group_size": group_size, "tokenizer": tokenizer}
    if model or base_url:
        flags["model"] = {k: v for k, v in {"model": model, "base_url": base_url}.items() if v}
    data = merge(data, {k: v for k, v in flags.items() if v is not None})
    data = apply_sets(data, sets or [])
    if "sandbox" in data:
        data["sandbox"].setdefault("backend", "local")
    return cls(cls.config_cls.model_validate(data))


def _run(main: Coroutine[Any, Any, None]) -> None:
    run_async(main, console, interrupted="what finished is kept")


def process_command(
    env: EnvArg,
    out: Annotated[
        Path | None,
        typer.Option(help="JSONL file of scored groups (default: runs/process-<env>-<time>.jsonl)"),
    ] = None,
    n_groups: Annotated[int, typer.Option(min=1, help="how many groups to produce")] = 8,
    concurrency: Annotated[int, typer.Option(min=1, help="groups in flight at once")] = 2,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    group_size: GroupOpt = None,
    tokenizer: TokenizerOpt = None,
    sandbox: Annotated[
        Literal["local", "docker"] | None, typer.Option(help="sandbox backend (default: local)")
    ] = None,
    slots_per_container: Annotated[
        int | None, typer.Option(min=1, help="docker: sandboxes per container")
    ] = None,
    instances: Annotated[
        list[str] | None, typer.Option(help="instance files (environments with `instances`)")
    ] = None,
    max_items: Annotated[
        int | None, typer.Option(min=1, help="items used, and groups produced at most")
    ] = None,
    wandb: WandbOpt = None,
) -> None:
    """Produce scored groups without a trainer: JSONL plus a report page (clotho view's export)."""
    from clotho.trainers.jsonl import JsonlSink
    from clotho.view.export import write_groups_report

    sets = list(set_ or [])
    if sandbox:
        sets.append(f"sandbox.backend={sandbox}")
    if slots_per_container:
        sets.append(f"sandbox.slots_per_container={slots_per_container}")
    if instances:
        sets.append(f"instances={json.dumps(instances)}")
    if max_items:
        sets.append(f"max_items={max_items}")
        n_groups = min(n_groups, max_items)
    out = out or Path("runs") / f"process-{Path(env).stem}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"

    async def main() -> None:
        environment = build_environment(env, config, sets, model, base_url, group_size, tokenizer)
        sink = JsonlSink(out)
        written: list[ScoredGroup] = []

        def shown(group: ScoredGroup) -> None:
            written.append(group)
            console.print(f"  group {len(written)}: scores {group.scores}")

        try:
            await environment.setup()
            await produce_groups(
                environment, sink, concurrency=concurrency, n_groups=n_groups, on_group=shown
            )
        finally:
            await sink.aclose()
            await environment.close()
            write_groups_report(out, out.with_suffix(".html"), environment.stats)
            if wandb:
                from clotho.runs.tracking import track_groups

                track_groups(out, wandb, stats=environment.stats, name=f"process-{env}")
            console.print(f"{len(written)} groups in {out} (report {out.with_suffix('.html')})")
            console.print(f"stats: {environment.stats.model_dump()}")

    _run(main())


def serve_command(
    env: EnvArg,
    api_url: Annotated[
        str, typer.Option(help="trajectory API (clotho api or Atropos run-api)")
    ] = "http://localhost:8000",
    concurrency: Annotated[int, typer.Option(min=1, help="groups in flight at once")] = 2,
    weight: Annotated[float, typer.Option(help="this environment's share of batches")] = 1.0,
    max_token_length: Annotated[int, typer.Option(help="reported to the trainer")] = 32768,
    api_token: Annotated[
        str | None,
        typer.Option(
            envvar="CLOTHO_API_TOKEN",
            show_envvar=True,
            help="the trajectory API's token (the one `clotho api` printed or was given)",
        ),
    ] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    group_size: GroupOpt = None,
    tokenizer: TokenizerOpt = None,
    wandb: WandbOpt = None,
) -> None:
    """Produce groups continuously for a trainer through the trajectory API."""
    from clotho.trainers.client import ApiClientConfig, AtroposClient
    from clotho.trainers.protocol import RegisterEnv

    async def main() -> None:
        environment = build_environment(env, config, set_, model, base_url, group_size, tokenizer)
        tracker = None
        if wandb:
            from clotho.runs.tracking import GroupTracker

            settings = environment.config.model_dump(mode="json")
            tracker = GroupTracker(wandb, name=f"serve-{env}", config=settings, job_type="serve")
        client = AtroposClient(ApiClientConfig(url=api_url, token=api_token))
        try:
            reason = environment.untrainable()
            if reason is not None:  # before registering: a trainer never sees this environment
                raise ConfigError(reason)
            await environment.setup()
            registered = await client.register_env(
                RegisterEnv(
                    max_token_length=environment.config.max_token_length or max_token_length,
                    desired_name=environment.name,
                    weight=weight,
                    group_size=environment.config.group_size,
                )
            )
            console.print(f"registered as env {registered.env_id}; producing groups (Ctrl-C stops)")
            await produce_groups(
                environment,
                client,
                concurrency=concurrency,
                on_group=tracker.log_group if tracker else None,
            )
        finally:
            if tracker:
                tracker.finish(environment.stats)
            await client.aclose()
            await environment.close()
            console.print(f"stats: {environment.stats.model_dump()}")

    _run(main())


def evaluate_command(
    env: EnvArg,
    out: Annotated[Path, typer.Option(help="run directory (same layout as clotho eval)")],
    config: ConfigOpt = None,
    set_: SetOpt = None,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    tokenizer: TokenizerOpt = None,
    wandb: WandbOpt = None,
) -> None:
    """Run the environment's evaluate() and write metrics and samples into a run directory."""
    from clotho.cli.eval_cmd import print_report
    from clotho.runs.env_eval import write_evaluation

    async def main() -> None:
        environment = build_environment(env, config, set_, model, base_url, None, tokenizer)
        try:
            await environment.setup()
            samples = await environment.evaluate()
        finally:
            await environment.close()
        metrics = await write_evaluation(samples, out, agent=f"env:{env}")
        print_report(metrics, out)
        if wandb:
            from clotho.runs.tracking import track_run

            track_run(out, wandb, job_type="evaluate")

    _run(main())
