"""`clotho serve`: an environment producing groups for a trainer behind the trajectory API."""

from __future__ import annotations

from typing import Annotated

import typer

from clotho.cli.env_options import (
    BaseUrlOpt,
    ConfigOpt,
    EnvArg,
    GroupOpt,
    ModelOpt,
    SetOpt,
    TokenizerOpt,
    WandbOpt,
    build_environment,
    console,
    run_env_command,
)
from clotho.env.driver import produce_groups
from clotho.errors import ConfigError


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

    run_env_command(main())
