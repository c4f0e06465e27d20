"""`clotho generate PROMPTS.jsonl`: the model agent on plain prompts, as a batch (the seed's
`batch_runner`), into a run directory; trajectories, SFT lines and per-run statistics.

The model, sandbox and limit options are the shared ones (`clotho.cli.options`), as
`clotho eval`'s are."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clotho.cli import options as opt
from clotho.cli.resume import resumed_run
from clotho.cli.running import run_async, user_errors
from clotho.cli.sft_options import SftFlags, load_sft_tokenizer, print_sft
from clotho.errors import ConfigError
from clotho.runs.generate_stats import STATS, TRAJECTORIES, GenerateStats
from clotho.runs.prompts import read_prompts
from clotho.runs.records import EvalConfig, TrialRecord

if TYPE_CHECKING:
    from clotho.chat.tokenizer import TemplateTokenizer
    from clotho.export.sft import SftOptions, Trajectory
    from clotho.export.writer import SftStats

console = Console(stderr=True)


class _Live:
    """Progress, and a line per finished prompt."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task_id = progress.add_task("generate", total=0)

    def __call__(self, event: str, data: object) -> None:
        if event == "start":
            assert isinstance(data, dict)
            self.progress.update(self.task_id, total=data["pending"])
            if data["done"]:
                self.progress.console.print(
                    f"  {data['done']} of {data['total']} prompts already finished in this run"
                )
        elif event == "trial_end":
            assert isinstance(data, TrialRecord)
            if data.error is not None:
                mark = f"[yellow]{data.error.kind} error[/]"
            elif data.reward is None:
                mark = "[cyan]done[/]"
            else:
                mark = "[green]pass[/]" if data.passed else "[red]fail[/]"
            self.progress.console.print(
                f"  {mark} {escape(data.task)} ({data.turns} turns, {data.tool_calls} tool "
                f"calls, {data.duration_s:.1f} s"
                + (f", reward {data.reward:g}" if data.reward is not None else "")
                + ")"
                + (f" — {escape(data.error.message[:200])}" if data.error else "")
            )
            self.progress.update(self.task_id, advance=1)
        elif event == "trial_retry":
            assert isinstance(data, TrialRecord)
            message = data.error.message[:200] if data.error else ""
            self.progress.console.print(
                f"  [yellow]retrying[/] {escape(data.task)} — {escape(message)}"
            )


def print_stats(stats: GenerateStats, out: Path) -> None:
    table = Table(title="tool calls")
    table.add_column("tool")
    table.add_column("calls", justify="right")
    table.add_column("errors", justify="right")
    for name, tool in stats.tools.items():
        table.add_row(escape(name), str(tool.calls), str(tool.errors))
    table.add_row("[bold]all", str(stats.tool_calls), str(stats.tool_errors))
    console.print(table)
    summary = Table(title="run", show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    summary.add_row("prompts finished", f"{stats.finished} of {stats.prompts}")
    turns = f"{stats.turns} ({stats.turns_mean:.1f} a prompt)" if stats.turns_mean else "0"
    summary.add_row("turns", turns)
    reasoning = f"{stats.reasoning_turns} turns, {stats.prompts_with_reasoning} prompts"
    if stats.reasoning_chars_mean is not None:
        reasoning += f", {stats.reasoning_chars_mean:.0f} chars a turn"
    summary.add_row("reasoning", reasoning)
    if stats.stop_reasons:
        summary.add_row(
            "stop reasons", ", ".join(f"{k} {v}" for k, v in stats.stop_reasons.items())
        )
    if stats.errors:
        summary.add_row("errors", ", ".join(f"{k} {v}" for k, v in stats.errors.items()))
    if stats.verified:
        mean = f"{stats.mean_reward:.3f}" if stats.mean_reward is not None else "-"
        summary.add_row(
            "verified",
            f"{stats.passed} passed of {stats.verified_scored} scored "
            f"({stats.verified} verified), mean reward {mean}",
        )
    console.print(summary)
    if not stats.complete:
        console.print(
            f"[yellow]not every prompt finished[/]: clotho generate ... --out {out} --resume"
        )
    console.print(f"trajectories in {out / TRAJECTORIES}, statistics in {out / STATS}")


def generate_trajectories(
    out: Path, options: SftOptions
) -> tuple[Iterator[Trajectory], Counter[str]]:
    """The run's trajectories for the SFT export, filtered the way a batch of prompts needs:
    a prompt without a verify command has no reward to filter on, so it is kept when it ended
    without an error; a verified one is kept as `clotho eval`'s are (passed, or the
    --sft-min-reward / --sft-all rule). Returns them and the count of those left out, by
    reason."""
    from clotho.export.sft import rejection
    from clotho.export.sources import trajectories_from_run

    skipped: Counter[str] = Counter()

    def kept() -> Iterator[Trajectory]:
        for trajectory in trajectories_from_run(out):
            if trajectory.reward is None and trajectory.error is None:  # unverified
                yield trajectory.model_copy(update={"source": "generate"})
                continue
            reason = rejection(trajectory, options)
            if reason is None:
                yield trajectory.model_copy(update={"source": "generate"})
            else:
                skipped[reason] += 1

    return kept(), skipped


def export_generated(
    out: Path, path: Path, options: SftOptions, tokenizer: TemplateTokenizer | None
) -> SftStats:
    from clotho.export.writer import export_sft

    trajectories, skipped = generate_trajectories(out, options)
    convert = options.model_copy(update={"keep_all": True, "min_reward": None})
    stats = export_sft(trajectories, path, convert, tokenizer)
    merged = Counter(stats.skipped) + skipped
    return stats.model_copy(update={"skipped": dict(merged)})


@opt.with_sft_flags
def generate_command(
    prompts: Annotated[
        Path,
        typer.Argument(
            help="JSONL, one prompt a line: prompt (required), id, workdir, verify, image"
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(help="run directory (default: runs/<time>-generate); give it again to resume"),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="continue the run in --out: prompts it finished are skipped"),
    ] = False,
    concurrency: opt.Concurrency = None,
    config: opt.ConfigFile = None,
    set_: opt.Set = None,
    model: opt.Model = None,
    api: opt.Api = None,
    tokenizer: opt.Tokenizer = None,
    tool_parser: opt.ToolParser = None,
    base_url: opt.BaseUrl = None,
    api_key_env: opt.ApiKeyEnv = None,
    temperature: opt.Temperature = None,
    max_tokens: opt.MaxTokens = None,
    max_turns: opt.MaxTurns = None,
    system_prompt: opt.SystemPrompt = None,
    sandbox: opt.Sandbox = None,
    network: opt.Network = None,
    retries: opt.Retries = None,
    task_timeout: opt.TaskTimeout = None,
    verifier_timeout: opt.VerifierTimeout = None,
    command_timeout: opt.CommandTimeout = None,
    wandb: opt.Wandb = None,
    sft: SftFlags = SftFlags(),
) -> None:
    """Run the model agent on each prompt of a JSONL file, in sandboxes, and keep the
    trajectories (trajectories.jsonl, and the run directory `clotho view` and `clotho export
    sft` read), per-run tool and reasoning statistics (generate_stats.json) and, with
    --sft-out, SFT lines.

    A line's `workdir` (a host folder) is copied into the sandbox as the workspace; its
    `verify` (a shell command) runs after the agent under the rules a task's tests run under,
    and its exit code is the reward (0: 1, else 0). Without `verify` a prompt has no reward,
    and its trajectory is kept for SFT when it ended without an error.
    """
    from clotho.runs.generate import run_generate
    from clotho.runs.tracking import require_wandb

    with user_errors(console):
        flags = opt.overrides(generate_command, locals())  # the parameters, nothing else yet
        if wandb:
            require_wandb()
        sft_options = sft.options()
        sft_tok = load_sft_tokenizer(sft_options)
        items = read_prompts(prompts)
        data = opt.config_data(config, {"paths": [], "agent": "llm", **flags}, set_)
        if resume:
            data = resumed_run(out, data)
        if data.get("paths"):
            raise ConfigError(f"{out}: a clotho eval run, not a clotho generate one")
        data = opt.with_sandbox(data)
        run_config = EvalConfig.model_validate(data)
    out = out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-generate"
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        stats = run_async(
            run_generate(
                run_config,
                items,
                out,
                resume=resume,
                verifier_timeout_s=run_config.verifier_timeout_s,
                listener=_Live(progress),
            ),
            console,
            interrupted=f"finished prompts are kept in {out}; continue with: clotho generate "
            f"{prompts} --out {out} --resume",
        )
    print_stats(stats, out)
    if sft.out and sft_options:
        with user_errors(console):
            sft_stats = export_generated(out, sft.out, sft_options, sft_tok)
        print_sft(console, sft.out, sft_stats)
    if wandb:
        from clotho.runs.tracking import track_run

        with user_errors(console):
            track_run(out, wandb, job_type="generate")
