"""`clotho serve`: an environment producing groups for a trainer behind the trajectory API,
until the trainer reaches `total_steps`, evaluating every `steps_per_eval` steps, resumable
from its state folder (see `clotho.env.lifecycle`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from clotho.cli import options as opt
from clotho.cli.env_options import EnvArg, build_environment, console, run_env_command
from clotho.env.config import EnvConfig
from clotho.errors import ConfigError

if TYPE_CHECKING:
    from clotho.env.checkpoint import EvaluationRecord
    from clotho.env.evaluation import EvalSample


def evaluation_metrics(samples: list[EvalSample], agent: str) -> dict[str, Any]:
    """The metrics `clotho eval` computes, over one evaluation's samples."""
    from clotho.runs.metrics import compute_metrics
    from clotho.runs.records import TrialRecord

    records = [
        TrialRecord.from_outcome(
            s.rollout, task=s.name, category=s.category, attempt=s.attempt, agent=agent
        )
        for s in samples
    ]
    metrics = compute_metrics(records)
    return {
        "pass_rate": metrics.pass_rate,
        "mean_reward": metrics.mean_reward,
        "n_tasks": metrics.n_tasks,
        "n_scored": metrics.n_scored,
        "n_passed": metrics.n_passed,
        "errors": dict(metrics.errors),
        "by_category": {k: c.pass_rate for k, c in metrics.by_category.items()},
    }


def eval_line(record: EvaluationRecord) -> str:
    if record.error:
        return f"[red]evaluation at step {record.step} failed:[/] {escape(record.error)}"
    m = record.metrics
    rate = f"{m['pass_rate']:.1%}" if m.get("pass_rate") is not None else "-"
    reward = f"{m['mean_reward']:.3f}" if m.get("mean_reward") is not None else "-"
    errors = ", ".join(f"{k} {v}" for k, v in sorted((m.get("errors") or {}).items()))
    skipped = f" (skipped {record.skipped})" if record.skipped else ""
    return (
        f"[bold]eval @ step {record.step}[/]{skipped}: pass rate {rate} "
        f"({m.get('n_passed')}/{m.get('n_scored')}), mean reward {reward}, "
        f"{record.duration_s:.1f} s" + (f", errors: {errors}" if errors else "")
    )


def serve_command(
    env: EnvArg,
    api_url: Annotated[
        str, typer.Option(help="trajectory API (clotho api or Atropos run-api)")
    ] = "http://localhost:8000",
    max_num_workers: opt.Workers = None,
    total_steps: Annotated[
        int | None,
        opt.field_option(
            EnvConfig,
            "total_steps",
            panel=opt.RUN,
            help="stop once the trainer reaches this step (default: never)",
        ),
        opt.To("total_steps"),
    ] = None,
    steps_per_eval: Annotated[
        int | None,
        opt.field_option(
            EnvConfig,
            "steps_per_eval",
            panel=opt.RUN,
            help="run the environment's evaluation every N trainer steps",
        ),
        opt.To("steps_per_eval"),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="where the item cursor and evaluations are kept; give the same folder to "
            "resume (default: a new runs/serve-<env>-<time>)"
        ),
    ] = None,
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
    config: opt.ConfigFile = None,
    set_: opt.Set = None,
    model: opt.Model = None,
    base_url: opt.BaseUrl = None,
    group_size: opt.GroupSize = None,
    tokenizer: opt.EnvTokenizer = None,
    wandb: opt.Wandb = None,
    ray: opt.Ray = None,
) -> None:
    """Produce groups for a trainer through the trajectory API, until it reaches total-steps."""
    flags = opt.overrides(serve_command, locals())  # the parameters, nothing else yet
    from clotho.env.checkpoint import StateDir
    from clotho.env.lifecycle import ServeLifecycle
    from clotho.trainers.client import ApiClientConfig, AtroposClient
    from clotho.trainers.protocol import RegisterEnv

    folder = state_dir or Path("runs") / f"serve-{Path(env).stem}-{time.strftime('%Y%m%d-%H%M%S')}"

    async def main() -> None:
        environment = build_environment(env, config, set_, ray=ray, flags=flags)
        tracker = None
        if wandb:
            from clotho.runs.tracking import GroupTracker, ToolErrorLog

            settings = environment.config.model_dump(mode="json")
            tracker = GroupTracker(
                wandb,
                name=f"serve-{env}",
                config=settings,
                job_type="serve",
                directory=folder,
                tool_errors=ToolErrorLog().attach(environment),
            )
        client = AtroposClient(ApiClientConfig(url=api_url, token=api_token))
        store = StateDir(folder)

        async def shown(record: EvaluationRecord) -> None:
            console.print(eval_line(record))
            if tracker is not None:
                values = {f"eval/{k}": v for k, v in record.metrics.items() if k != "errors"}
                values.pop("eval/by_category", None)
                errors = record.metrics.get("errors") or {}
                errors = {f"eval/errors/{k}": v for k, v in errors.items()}
                values |= {"eval/trainer_step": record.step, **errors}
                # A row of its own: W&B keeps one log per step, and groups log at theirs.
                tracker.tracker.log(
                    {k: v for k, v in values.items() if v is not None}, tracker.step
                )
                tracker.step += 1

        try:
            reason = environment.untrainable()
            if reason is not None:  # before registering: a trainer never sees this environment
                raise ConfigError(reason)
            store.open()
            lifecycle = ServeLifecycle(
                environment,
                client,
                store,
                metrics=lambda samples: evaluation_metrics(samples, f"env:{env}"),
                on_group=tracker.log_group if tracker else None,
                on_eval=shown,
            )
            await environment.setup()
            await environment.preflight()
            resumed = lifecycle.restore()
            registered = await client.register_env(
                RegisterEnv(
                    max_token_length=environment.config.max_token_length or max_token_length,
                    desired_name=environment.name,
                    weight=weight,
                    group_size=environment.config.group_size,
                )
            )
            cfg = environment.config
            until = f"until trainer step {cfg.total_steps}" if cfg.total_steps else "(Ctrl-C stops)"
            console.print(
                f"registered as env {registered.env_id}; producing groups {until}, "
                f"{cfg.max_num_workers} in flight; state in {folder}"
                + (
                    f" (resumed: {lifecycle.resumed_items} unfinished items first)"
                    if resumed
                    else ""
                )
            )
            summary = await lifecycle.run()
        finally:
            store.close()
            if tracker:
                tracker.finish(environment.stats)
            await client.aclose()
            await environment.close()
            console.print(f"stats: {environment.stats.model_dump()}")
        ended = "reached total_steps" if summary.reached_total else "stopped"
        console.print(
            f"[green]{ended}[/] at trainer step {summary.trainer_step}: "
            f"{summary.groups_sent} groups sent, {summary.groups_dropped} dropped (all runs of "
            f"this state), {len(summary.evaluations)} evaluations, {summary.unfinished} items "
            f"left for a resume; state in {folder}"
        )

    run_env_command(main())
