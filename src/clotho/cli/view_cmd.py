"""`clotho view`: a local web app over run directories and group files, or an HTML export.

It answers requests that name its address or localhost (`view/guard.py`). On loopback it
needs no token; on any other address it refuses to start without one, read as `clotho
serve-model` reads its own (`--token-file`, `--token-env`, `CLOTHO_VIEW_TOKEN`) and never
printed: a browser asks for it (any user name, the token as password).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from clotho.cli.running import user_errors
from clotho.cli.token_source import resolve_token
from clotho.errors import ConfigError

console = Console(stderr=True)


def free_port(host: str) -> int:
    """A port free on `host` now (`clotho bench view` serves the app itself)."""
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
    host: Annotated[
        str, typer.Option(help="address to listen on (not loopback: a token is required)")
    ] = "127.0.0.1",
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
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="read the token browsers must give (any user name, the token as password) "
            "from this file. Default: $CLOTHO_VIEW_TOKEN if set, else none (loopback only)"
        ),
    ] = None,
    token_env: Annotated[
        str | None, typer.Option(help="read the token from this environment variable")
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            help="a host name the viewer answers to besides its address and localhost "
            "(a DNS name or proxy in front of it); repeatable"
        ),
    ] = None,
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
        from clotho.view.guard import TOKEN_ENV, HostCheck, listen_socket

        source = resolve_token(
            token=None, token_file=token_file, token_env=token_env, default_env=TOKEN_ENV
        )
        token = source.token if source else None
        sock = listen_socket(host, port, token)  # refused here without a token off loopback
        bound, chosen_port = sock.getsockname()[:2]
        app = create_app(sources, hosts=HostCheck(host, bound, allow_host or ()), token=token)
    import uvicorn

    shown = f"[{host}]" if ":" in host else host
    console.print(
        f"clotho view: http://{escape(shown)}:{chosen_port}/  ({len(sources)} sources; "
        "Ctrl-C stops)",
        soft_wrap=True,
    )
    if source is not None:
        console.print(
            f"token: read from {escape(source.origin)}; a browser asks for it (any user name, "
            "the token as password)",
            soft_wrap=True,
        )
        for warning in source.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    config = uvicorn.Config(app, log_level="warning")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
