"""What `clotho process`, `serve` and `evaluate` share: building the environment from the
shared options (`clotho.cli.options`), and how the command ends."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clotho.cli import options as opt
from clotho.cli.config_io import merge
from clotho.cli.running import run_async
from clotho.env.base import Environment
from clotho.env.registry import load_environment

console = Console(stderr=True)

EnvArg = Annotated[
    str, typer.Argument(help="registered name (terminal_tasks) or package.module:Class")
]


def build_environment(
    spec: str,
    config_file: Path | None,
    sets: list[str] | None,
    model: opt.Model = None,
    base_url: opt.BaseUrl = None,
    group_size: opt.GroupSize = None,
    tokenizer: opt.EnvTokenizer = None,
    ray: str | None = None,
    *,
    flags: dict[str, Any] | None = None,
) -> Environment[Any]:
    """The environment from its config (--config, then the flags, then --set); without a
    model it loads the embedded one on first use.

    `flags` are a command's (`opt.overrides`); `ray` (an address, or auto) wraps the
    configured sandbox, local by default, in a ray one whose nodes each run it, as
    `clotho eval --ray` does."""
    cls = load_environment(spec)
    given = {"model": model, "base_url": base_url, "group_size": group_size, "tokenizer": tokenizer}
    flags = merge(opt.overrides(build_environment, given), flags or {})
    data = opt.with_sandbox(opt.config_data(config_file, flags, sets), ray=ray)
    return cls(cls.config_cls.model_validate(data))


def run_env_command(main: Coroutine[Any, Any, None]) -> None:
    run_async(main, console, interrupted="what finished is kept")
