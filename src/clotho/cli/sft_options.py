"""The `--sft-*` options `clotho eval` and `clotho process` share, and the export's report."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from clotho.errors import ConfigError

if TYPE_CHECKING:
    from clotho.chat.tokenizer import TemplateTokenizer
    from clotho.export.sft import SftOptions
    from clotho.export.writer import SftStats

ERROR_KIND_HELP = "infra, agent, verifier, task, config, limit, tamper, or all"

SftOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--sft-out",
        help="also write the trajectories as SFT training data (JSONL) to this file",
        rich_help_panel="SFT export",
    ),
]
SftFormatOpt = Annotated[
    Literal["chat", "sharegpt"],
    typer.Option(
        "--sft-format",
        help="chat: OpenAI messages with tool calls; sharegpt: LLaMA-Factory's ShareGPT",
        rich_help_panel="SFT export",
    ),
]
SftMinRewardOpt = Annotated[
    float | None,
    typer.Option(
        "--sft-min-reward",
        help="keep trajectories with at least this reward (default: passed ones only)",
        rich_help_panel="SFT export",
    ),
]
SftAllOpt = Annotated[
    bool,
    typer.Option(
        "--sft-all", help="keep every trajectory, whatever its reward", rich_help_panel="SFT export"
    ),
]
SftErrorsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--sft-errors",
        help=f"also keep trajectories that ended in these error kinds ({ERROR_KIND_HELP}; "
        "comma-separated or repeated; default: none)",
        rich_help_panel="SFT export",
    ),
]
SftTokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--sft-tokenizer",
        help="tokenizer folder or tokenizer.json with a chat template: adds tokens and "
        "assistant masks (token-API rollouts carry their exact tokens without it)",
        rich_help_panel="SFT export",
    ),
]
SftDedupOpt = Annotated[
    bool,
    typer.Option(
        "--sft-dedup/--sft-keep-duplicates",
        help="write identical trajectories once",
        rich_help_panel="SFT export",
    ),
]


def sft_options(
    *,
    format: Literal["chat", "sharegpt"],
    min_reward: float | None,
    keep_all: bool,
    errors: list[str] | None,
    tokenizer: str | None,
    dedup: bool,
) -> SftOptions:
    """The options from the flags; a contradiction or an unknown name is a `ConfigError`."""
    from clotho.export.sft import ERROR_KINDS, SftOptions

    if keep_all and min_reward is not None:
        raise ConfigError("--sft-all keeps every reward: drop --sft-min-reward, or --sft-all")
    kinds = {part.strip() for value in errors or [] for part in value.split(",") if part.strip()}
    if "all" in kinds:
        kinds = set(ERROR_KINDS)
    unknown = kinds - set(ERROR_KINDS)
    if unknown:
        raise ConfigError(f"--sft-errors {', '.join(sorted(unknown))}: kinds are {ERROR_KIND_HELP}")
    return SftOptions(
        format=format,
        min_reward=min_reward,
        keep_all=keep_all,
        errors=frozenset(kinds),  # type: ignore[arg-type]
        tokenizer=tokenizer,
        dedup=dedup,
    )


def sft_from_flags(
    out: Path | None,
    *,
    format: Literal["chat", "sharegpt"],
    min_reward: float | None,
    keep_all: bool,
    errors: list[str] | None,
    tokenizer: str | None,
    dedup: bool,
) -> SftOptions | None:
    """The options when --sft-out is given; other --sft-* flags without it are a mistake."""
    if out is None:
        given = format != "chat" or min_reward is not None or keep_all or bool(errors)
        if given or tokenizer is not None or not dedup:
            raise ConfigError("the --sft-* options need --sft-out FILE")
        return None
    return sft_options(
        format=format,
        min_reward=min_reward,
        keep_all=keep_all,
        errors=errors,
        tokenizer=tokenizer,
        dedup=dedup,
    )


def sft_from_params(params: Mapping[str, Any]) -> SftOptions | None:
    """`sft_from_flags` of a command's parameters (the `Sft*Opt` ones, by their names)."""
    return sft_from_flags(
        params["sft_out"],
        format=params["sft_format"],
        min_reward=params["sft_min_reward"],
        keep_all=params["sft_all"],
        errors=params["sft_errors"],
        tokenizer=params["sft_tokenizer"],
        dedup=params["sft_dedup"],
    )


def print_sft(console: Console, path: Path, stats: SftStats) -> None:
    console.print(f"SFT data: {escape(stats.summary())} in {escape(str(path))}")
    if stats.first_failure:
        console.print(f"[yellow]first conversion failure:[/] {escape(stats.first_failure[:300])}")


def load_sft_tokenizer(options: SftOptions | None) -> TemplateTokenizer | None:
    """The tokenizer, loaded before the run so that a bad path fails at once."""
    if options is None or not options.tokenizer:
        return None
    from clotho.chat.template import ChatTemplateError
    from clotho.chat.tokenizer import TemplateTokenizer

    try:
        return TemplateTokenizer.from_path(options.tokenizer)
    except ChatTemplateError as exc:
        raise ConfigError(f"--sft-tokenizer: {exc}") from exc
