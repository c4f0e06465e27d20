"""`clotho export sft`: SFT training data from an eval run directory or a groups file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

from clotho.cli.running import user_errors
from clotho.cli.sft_options import ERROR_KIND_HELP, SftFlags, load_sft_tokenizer, print_sft

console = Console(stderr=True)
app = typer.Typer(
    help="Write scored trajectories in formats other tools read.", no_args_is_help=True
)


@app.callback()
def export() -> None:
    """Write scored trajectories in formats other tools read."""


@app.command("sft")
def sft_command(
    source: Annotated[
        Path, typer.Argument(help="an eval run directory, or a groups JSONL file (clotho process)")
    ],
    out: Annotated[Path, typer.Option(help="the SFT JSONL file to write (replaced whole)")],
    format: Annotated[
        Literal["chat", "sharegpt"],
        typer.Option(help="chat: OpenAI messages with tool calls; sharegpt: LLaMA-Factory's"),
    ] = "chat",
    min_reward: Annotated[
        float | None,
        typer.Option(help="keep trajectories with at least this reward (default: passed ones)"),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="keep every trajectory, whatever its reward")
    ] = False,
    errors: Annotated[
        list[str] | None,
        typer.Option(
            help=f"also keep trajectories that ended in these error kinds ({ERROR_KIND_HELP})"
        ),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="tokenizer folder or tokenizer.json with a chat template: adds tokens and masks"
        ),
    ] = None,
    dedup: Annotated[
        bool, typer.Option("--dedup/--keep-duplicates", help="write identical trajectories once")
    ] = True,
) -> None:
    """Successful (or all) trajectories as chat-format training data.

    A groups file holds neither tools nor errored rollouts, and its rows pass at score 1.0;
    an eval run directory holds both and its own pass threshold.
    """
    from clotho.export.sources import trajectories_from
    from clotho.export.writer import export_sft

    with user_errors(console):
        flags = SftFlags(out, format, min_reward, all_, errors, tokenizer, dedup)
        options = flags.checked()
        stats = export_sft(trajectories_from(source), out, options, load_sft_tokenizer(options))
    print_sft(console, out, stats)
