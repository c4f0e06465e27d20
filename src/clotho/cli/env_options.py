"""What `clotho process`, `serve` and `evaluate` share: the options that build an environment."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clotho.cli.config_io import apply_sets, load_config_file, merge
from clotho.cli.running import run_async
from clotho.env.base import Environment
from clotho.env.registry import load_environment

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
RayOpt = Annotated[
    str | None,
    typer.Option(
        help="spread the sandboxes over a Ray cluster: its address, or auto (extra ray); "
        "the config's sandbox says what each node runs"
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--max-num-workers",
        "--concurrency",
        min=1,
        help="groups in flight at once, each of group-size rollouts (default: the config's "
        "max_num_workers, 2)",
    ),
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
    ray: str | None = None,
) -> Environment[Any]:
    """The environment from its config; without a model it loads the embedded one on first use.

    `ray` (an address, or auto) wraps the configured sandbox, local by default, in a ray one
    whose nodes each run it, as `clotho eval --ray` does."""
    cls = load_environment(spec)
    data = load_config_file(config_file) if config_file else {}
    flags: dict[str, Any] = {"group_size": group_size, "tokenizer": tokenizer}
    if model or base_url:
        flags["model"] = {k: v for k, v in {"model": model, "base_url": base_url}.items() if v}
    data = merge(data, {k: v for k, v in flags.items() if v is not None})
    data = apply_sets(data, sets or [])
    if "sandbox" in data:
        data["sandbox"].setdefault("backend", "local")
    if ray:
        inner = data.get("sandbox") or {"backend": "local"}
        if inner.get("backend") != "ray":
            data["sandbox"] = {"backend": "ray", "address": ray, "inner": inner}
    return cls(cls.config_cls.model_validate(data))


def run_env_command(main: Coroutine[Any, Any, None]) -> None:
    run_async(main, console, interrupted="what finished is kept")
