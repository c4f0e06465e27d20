"""`clotho eval`: run agents on task directories and report pass rates."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Literal

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clotho.chat.client import ModelConfig, SamplingParams
from clotho.errors import ClothoError
from clotho.runs.eval import run_eval
from clotho.runs.records import EvalConfig, RunMetrics, TrialRecord
from clotho.sandbox.config import LocalSandboxConfig, UnsafeLocalSandboxConfig

console = Console(stderr=True)


def _split(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


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
        elif event == "trial_end":
            assert isinstance(data, TrialRecord)
            if data.error is not None and data.error.kind in ("infra", "task"):
                self.errors += 1
            else:
                self.scored += 1
                self.passed += data.passed
            mark = "[green]pass" if data.passed else "[red]fail"
            if data.error is not None:
                mark = f"[yellow]{data.error.kind} error"
            self.progress.console.print(
                f"  {mark}[/] {data.task} #{data.attempt} "
                f"(reward {data.reward}, {data.duration_s:.1f} s)"
                + (f" — {data.error.message[:200]}" if data.error else "")
            )
            rate = f"{self.passed / self.scored:.1%}" if self.scored else "-"
            self.progress.update(
                self.task_id, advance=1, rate=f"{rate} ({self.errors} infra/task errors)"
            )
        elif event == "task_error":
            assert isinstance(data, TrialRecord)
            if data.attempt == 0 and data.error is not None:
                self.progress.console.print(f"  [yellow]invalid task[/] {data.error.message}")


def print_report(metrics: RunMetrics, out: Path) -> None:
    table = Table(title="pass rate by category")
    table.add_column("category")
    table.add_column("passed", justify="right")
    table.add_column("n", justify="right")
    table.add_column("pass rate", justify="right")
    for name, cat in metrics.by_category.items():
        rate = f"{cat.pass_rate:.1%}" if cat.pass_rate is not None else "-"
        table.add_row(name, str(cat.n_passed), str(cat.n), rate)
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
            + " (infra and task errors are not counted in the pass rate)"
        )
    console.print(f"results in {out}")


def eval_command(
    paths: Annotated[list[Path], typer.Argument(help="task directories or folders of them")],
    agent: Annotated[
        Literal["llm", "oracle", "nop"], typer.Option(help="who does the task")
    ] = "llm",
    model: Annotated[str | None, typer.Option(help="model name for --agent llm")] = None,
    base_url: Annotated[
        list[str] | None, typer.Option(help="OpenAI-compatible base URL; repeat to balance")
    ] = None,
    api_key_env: Annotated[
        str, typer.Option(help="environment variable with the API key")
    ] = "OPENAI_API_KEY",
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max tokens per model reply")] = None,
    max_turns: Annotated[int, typer.Option(help="max model turns per attempt")] = 30,
    sandbox: Annotated[
        Literal["local", "unsafe-local"], typer.Option(help="sandbox backend")
    ] = "local",
    network: Annotated[bool, typer.Option(help="give local sandboxes network access")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="attempts running at once")] = 4,
    attempts: Annotated[int, typer.Option(min=1, help="attempts per task (pass@k)")] = 1,
    task_timeout: Annotated[
        float | None, typer.Option(help="wall-clock seconds per attempt, agent + verification")
    ] = None,
    filter: Annotated[
        list[str] | None, typer.Option(help="only these tasks (names or globs, comma-separated)")
    ] = None,
    skip: Annotated[
        list[str] | None, typer.Option(help="skip these tasks (names or globs)")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="run directory")] = None,
    resume: Annotated[bool, typer.Option(help="continue the run in --out")] = False,
) -> None:
    """Run an agent on Harbor / Terminal-Bench tasks and report pass rates."""
    out = out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{agent}"
    try:
        model_config = None
        if agent == "llm":
            if not model:
                raise typer.BadParameter("--agent llm needs --model (and usually --base-url)")
            sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)
            model_config = ModelConfig(
                model=model,
                base_url=base_url or ["http://127.0.0.1:8000/v1"],
                api_key_env=api_key_env,
                sampling=sampling,
            )
        sandbox_config = (
            LocalSandboxConfig(network=network)
            if sandbox == "local"
            else UnsafeLocalSandboxConfig()
        )
        config = EvalConfig(
            paths=[str(p) for p in paths],
            agent=agent,
            model=model_config,
            sandbox=sandbox_config,
            concurrency=concurrency,
            attempts=attempts,
            task_timeout_s=task_timeout,
            max_turns=max_turns,
            filter=_split(filter),
            skip=_split(skip),
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from exc
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pass rate {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            metrics = asyncio.run(run_eval(config, out, resume=resume, listener=_Live(progress)))
    except KeyboardInterrupt:
        console.print(
            f"[yellow]interrupted[/]: finished attempts are kept in {out}; "
            f"continue with: clotho eval {' '.join(map(str, paths))} --out {out} --resume"
        )
        raise typer.Exit(130) from None
    except ClothoError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    print_report(metrics, out)
