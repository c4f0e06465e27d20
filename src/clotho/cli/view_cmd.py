"""`clotho view`: a local web app over run directories and group files, or an HTML export."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from clotho.cli.running import user_errors
from clotho.errors import ConfigError

console = Console(stderr=True)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def view_command(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="run directories (eval, evaluate), folders of them, or group files (process); "
            "default: ./runs"
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (default: a free one)")] = 0,
    export: Annotated[
        Path | None,
        typer.Option(help="write one self-contained HTML file here instead of serving"),
    ] = None,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="tokenizer.json or its folder: token ids shown as text"),
    ] = None,
    no_details: Annotated[
        bool, typer.Option("--no-details", help="export: leave trial details out (smaller file)")
    ] = False,
) -> None:
    """See runs in the browser: runs, a run's trials, a trial's conversation, groups, compare."""
    from clotho.view.export import export_html
    from clotho.view.sources import discover

    with user_errors(console):
        chosen = paths or [Path("runs")]
        missing = [str(p) for p in chosen if not p.exists()]
        if missing:
            raise ConfigError(f"no such run directory or file: {', '.join(missing)}")
        if export is not None:
            n = export_html(chosen, export, details=not no_details, tokenizer=tokenizer)
            console.print(f"{n} runs/group files in {export}")
            return
        sources = discover(chosen, tokenizer=tokenizer)
        if not sources:
            raise ConfigError(
                f"no run directories (with results.jsonl) or group files in {', '.join(map(str, chosen))}"
            )
        from clotho.view.app import create_app

        app = create_app(sources)
        chosen_port = port or free_port(host)
    import uvicorn

    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(
            f"[yellow]warning:[/] listening on {host}: anyone who can reach it reads these runs"
        )
    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"clotho view: http://{shown}:{chosen_port}/  ({len(sources)} sources; Ctrl-C stops)"
    )
    uvicorn.run(app, host=host, port=chosen_port, log_level="warning")
