"""The `--sft-*` flags as one value (`SftFlags`), what they ask for, and the export's report.

The options themselves are declared in `clotho.cli.options` with the others commands share
(`with_sft_flags` adds them to `eval`, `generate` and `process`); `clotho export sft` names
its own (`--format`, `--min-reward`, ...) and reads them the same way."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rich.console import Console
from rich.markup import escape

from clotho.errors import ConfigError

if TYPE_CHECKING:
    from clotho.chat.tokenizer import TemplateTokenizer
    from clotho.export.sft import SftOptions
    from clotho.export.writer import SftStats

ERROR_KIND_HELP = "infra, agent, verifier, task, config, limit, tamper, or all"


@dataclass(frozen=True)
class SftFlags:
    """The SFT export's flags as given (the defaults: none given): `out` is the file, and
    without it there is no export."""

    out: Path | None = None
    format: Literal["chat", "sharegpt"] = "chat"
    min_reward: float | None = None
    keep_all: bool = False
    errors: list[str] | None = None
    tokenizer: str | None = None
    dedup: bool = True

    def checked(self) -> SftOptions:
        """The options the flags ask for; a contradiction or an unknown name is a
        `ConfigError`."""
        from clotho.export.sft import ERROR_KINDS, SftOptions

        if self.keep_all and self.min_reward is not None:
            raise ConfigError("--sft-all keeps every reward: drop --sft-min-reward, or --sft-all")
        kinds = {p.strip() for value in self.errors or [] for p in value.split(",") if p.strip()}
        if "all" in kinds:
            kinds = set(ERROR_KINDS)
        unknown = kinds - set(ERROR_KINDS)
        if unknown:
            raise ConfigError(
                f"--sft-errors {', '.join(sorted(unknown))}: kinds are {ERROR_KIND_HELP}"
            )
        return SftOptions(
            format=self.format,
            min_reward=self.min_reward,
            keep_all=self.keep_all,
            errors=frozenset(kinds),  # type: ignore[arg-type]
            tokenizer=self.tokenizer,
            dedup=self.dedup,
        )

    def options(self) -> SftOptions | None:
        """The options when --sft-out is given; other --sft-* flags without it are a mistake."""
        if self.out is None:
            if replace(self, errors=None) != SftFlags() or self.errors:  # [] is none given
                raise ConfigError("the --sft-* options need --sft-out FILE")
            return None
        return self.checked()


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
