"""`clotho eval`: run agents on task directories and report pass rates."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clotho.cli import options as opt
from clotho.cli.resume import resumed_run
from clotho.cli.running import run_async, user_errors
from clotho.cli.sft_options import SftFlags, load_sft_tokenizer, print_sft
from clotho.errors import UNSCORED_KINDS, ConfigError
from clotho.rollout.agents import agent_kinds
from clotho.runs.eval import run_eval
from clotho.runs.records import EvalConfig, RunMetrics, TrialRecord
from clotho.runs.tracking import require_wandb, track_run

if TYPE_CHECKING:
    from clotho.chat.tokenizer import TemplateTokenizer
    from clotho.export.sft import SftOptions

console = Console(stderr=True)


class _Live:
    """Rich progress with the live pass rate."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task_id = progress.add_task("eval", total=0, rate="-")
        self.scored = 0
        self.passed = 0
        self.errors = 0

    def __call__(self, event: str, data: object) -> None:
        if event == "start":
            assert isinstance(data, dict)
            self.progress.update(self.task_id, total=data["pending"])
            skipped = data.get("skipped") or []
            if skipped:
                self.progress.console.print(
                    f"  [yellow]skipped[/] {len(skipped)} task(s) known not to run on this "
                    f"backend: {escape(', '.join(skipped))} (--set default_skips=false runs them)"
                )
        elif event == "trial_end":
            assert isinstance(data, TrialRecord)
            if not data.scored:
                self.errors += 1
            else:
                self.scored += 1
                self.passed += data.passed
            mark = "[green]pass" if data.passed else "[red]fail"
            if data.error is not None:
                mark = f"[yellow]{data.error.kind} error"
            self.progress.console.print(
                f"  {mark}[/] {escape(data.task)} #{data.attempt} "
                f"(reward {data.reward}, {data.duration_s:.1f} s)"
                + (f" — {escape(data.error.message[:200])}" if data.error else "")
            )
            rate = f"{self.passed / self.scored:.1%}" if self.scored else "-"
            self.progress.update(
                self.task_id, advance=1, rate=f"{rate} ({self.errors} unscored errors)"
            )
        elif event == "trial_retry":  # the lost try; its retry ends with trial_end
            assert isinstance(data, TrialRecord)
            message = data.error.message[:200] if data.error else ""
            self.progress.console.print(
                f"  [yellow]retrying[/] {escape(data.task)} #{data.attempt} — {escape(message)}"
            )
        elif event == "task_error":
            assert isinstance(data, TrialRecord)
            if data.attempt == 0 and data.error is not None:
                self.progress.console.print(
                    f"  [yellow]invalid task[/] {escape(data.error.message)}"
                )


def print_report(metrics: RunMetrics, out: Path) -> None:
    table = Table(title="pass rate by category")
    table.add_column("category")
    table.add_column("passed", justify="right")
    table.add_column("n", justify="right")
    table.add_column("pass rate", justify="right")
    for name, cat in metrics.by_category.items():
        rate = f"{cat.pass_rate:.1%}" if cat.pass_rate is not None else "-"
        table.add_row(escape(name), str(cat.n_passed), str(cat.n), rate)
    overall = f"{metrics.pass_rate:.1%}" if metrics.pass_rate is not None else "-"
    table.add_row("[bold]all", str(metrics.n_passed), str(metrics.n_scored), f"[bold]{overall}")
    console.print(table)
    if metrics.pass_rate_ci95:
        lo, hi = metrics.pass_rate_ci95
        console.print(f"95% interval of the pass rate: {lo:.1%} to {hi:.1%}")
    if metrics.pass_at_k:
        console.print("pass@k: " + ", ".join(f"@{k} {v:.1%}" for k, v in metrics.pass_at_k.items()))
    if metrics.errors:
        console.print(
            "errors: "
            + ", ".join(f"{k} {v}" for k, v in sorted(metrics.errors.items()))
            + f" ({' and '.join(sorted(UNSCORED_KINDS))} errors are not counted in the pass rate)"
        )
    if metrics.timings:
        console.print(
            "time per attempt (p50 / p95): "
            + ", ".join(
                f"{phase.removesuffix('_s')} {t.p50_s:.2f} / {t.p95_s:.2f} s"
                for phase, t in metrics.timings.items()
            )
        )
    console.print(f"results in {out}")


def _export_sft(
    run_dir: Path, path: Path, options: SftOptions, tokenizer: TemplateTokenizer | None
) -> None:
    """The run's trajectories as SFT data, read back from the run directory."""
    from clotho.export.sources import trajectories_from_run
    from clotho.export.writer import export_sft

    with user_errors(console):
        stats = export_sft(trajectories_from_run(run_dir), path, options, tokenizer)
    print_sft(console, path, stats)


# eval's own options (the shared ones are in `clotho.cli.options`).
Paths = Annotated[
    list[Path] | None,
    typer.Argument(help="task directories or folders of them"),
    opt.To("paths", lambda paths: [str(p) for p in paths] or None),
]
Attempts = Annotated[
    int | None,
    opt.field_option(EvalConfig, "attempts", panel=opt.RUN, help="attempts per task, for pass@k"),
    opt.To("attempts"),
]
Filter = Annotated[
    list[str] | None,
    typer.Option(
        help="only these tasks (names or globs, comma-separated)", rich_help_panel=opt.RUN
    ),
    opt.To("filter", opt.split_list),
]
Skip = Annotated[
    list[str] | None,
    typer.Option(
        "--skip-tasks",
        "--skip",
        help="skip these tasks (names or globs, comma-separated; repeat for more), beside "
        "the backend's default skip list",
        rich_help_panel=opt.RUN,
    ),
    opt.To("skip", opt.split_list),
]
ReposDir = Annotated[
    Path | None,
    typer.Option(
        help="SWE instances: folder of git mirrors for owner/name repositories",
        rich_help_panel=opt.RUN,
    ),
    opt.To("swe.repos_dir", lambda path: str(path.resolve())),
]
Out = Annotated[Path | None, typer.Option(help="run directory", rich_help_panel=opt.OUTPUT)]
Resume = Annotated[
    bool,
    typer.Option(
        help="continue the run in --out with its saved configuration", rich_help_panel=opt.OUTPUT
    ),
]


@opt.with_sft_flags
def eval_command(
    paths: Paths = None,
    config: opt.ConfigFile = None,
    set_: opt.Set = None,
    agent: Annotated[
        Literal[tuple(agent_kinds())] | None,  # clotho's own and the registered installed ones
        typer.Option(
            help="who does the task: llm (clotho's agent), oracle, nop, or an installed agent "
            "run in the sandbox behind the model gateway (default: llm)",
            rich_help_panel=opt.RUN,
        ),
        opt.To("agent"),
    ] = None,
    model: opt.Model = None,
    api: opt.Api = None,
    tokenizer: opt.Tokenizer = None,
    tool_parser: opt.ToolParser = None,
    base_url: opt.BaseUrl = None,
    api_key_env: opt.ApiKeyEnv = None,
    temperature: opt.Temperature = None,
    max_tokens: opt.MaxTokens = None,
    max_turns: opt.MaxTurns = None,
    sandbox: opt.Sandbox = None,
    network: opt.Network = None,
    ray: opt.Ray = None,
    create_concurrency: opt.CreateConcurrency = None,
    concurrency: opt.Concurrency = None,
    attempts: Attempts = None,
    retries: opt.Retries = None,
    retry_budget: opt.RetryBudget = None,
    task_timeout: opt.TaskTimeout = None,
    filter: Filter = None,
    skip: Skip = None,
    system_prompt: opt.SystemPrompt = None,
    verifier_timeout: opt.VerifierTimeout = None,
    command_timeout: opt.CommandTimeout = None,
    force_build: opt.ForceBuild = None,
    repos_dir: ReposDir = None,
    out: Out = None,
    resume: Resume = False,
    wandb: opt.Wandb = None,
    sft: SftFlags = SftFlags(),
) -> None:
    """Run an agent on Harbor / Terminal-Bench tasks and report pass rates.

    Settings come from --config, then the flags, then --set overrides; the resolved
    configuration is written to the run directory as config.json. With --sft-out, the
    trajectories are also written as SFT data once the run ends, from the run directory (so a
    resumed run's file holds every attempt; `clotho export sft DIR` writes it any time).
    """
    with user_errors(console):
        flags = opt.overrides(eval_command, locals())  # the parameters, nothing else yet
        if wandb:
            require_wandb()
        sft_options = sft.options()
        sft_tok = load_sft_tokenizer(sft_options)
        data = opt.config_data(config, flags, set_)
        if resume:
            data = resumed_run(out, data, ray)
        if not data.get("paths"):
            raise ConfigError("give at least one task path (argument or `paths:` in --config)")
        data = opt.with_sandbox(data, ray=ray, create_concurrency=create_concurrency)
        eval_config = EvalConfig.model_validate(data)
    out = out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{eval_config.agent}"
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pass rate {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        metrics = run_async(
            run_eval(eval_config, out, resume=resume, listener=_Live(progress)),
            console,
            interrupted=f"finished attempts are kept in {out}; "
            f"continue with: clotho eval --out {out} --resume"
            + (f" (it writes {sft.out} at the end)" if sft.out else ""),
        )
    print_report(metrics, out)
    if sft.out and sft_options:
        _export_sft(out, sft.out, sft_options, sft_tok)
    if wandb:
        with user_errors(console):
            track_run(out, wandb)
