"""`clotho api`: serve the Atropos trajectory API (a drop-in for upstream `run-api`).

It never runs open unless told to (`--no-auth`, loopback only): with no `--token` and no
`CLOTHO_API_TOKEN` it makes a token and prints it. An open server on this machine is open to
every local process, agents' sandboxes included, and to web pages through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from clotho.cli.signals import Terminated, cancel_on_signals
from clotho.errors import ClothoError

console = Console(stderr=True)
INSTALL_HINT = "`clotho api` needs the extra: pip install 'clotho-rl[api]'"


def api_command(
    host: Annotated[
        str, typer.Option(help="address to listen on (upstream: 0.0.0.0)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="port (0 picks a free one)")] = 8000,
    batch_size: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="preset the batch size so environments can register before a trainer; "
            "a trainer registering another size is refused",
        ),
    ] = None,
    max_token_len: Annotated[
        int, typer.Option(help="max_token_len reported by /info with --batch-size")
    ] = -1,
    env_timeout: Annotated[
        float,
        typer.Option(
            min=0,
            help="seconds of silence after which an environment's share is released; 0 = never",
        ),
    ] = 120.0,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="CLOTHO_API_TOKEN",
            show_envvar=True,
            help="clients must send it (Authorization: Bearer, or in the URL: "
            "http://clotho:TOKEN@host:port); without one a token is made and printed",
        ),
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="serve without a token (loopback addresses only; not advised)"
        ),
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option(help="a web origin allowed to call the API (with the token); repeatable"),
    ] = None,
    max_request_mb: Annotated[
        float, typer.Option(min=0.001, help="largest request body (also once un-gzipped): 413")
    ] = 256.0,
    vocab_size: Annotated[
        int | None,
        typer.Option(min=1, help="refuse groups with token ids at or above it (422)"),
    ] = None,
    min_allocation_wait: Annotated[
        float,
        typer.Option(
            min=0,
            help="seconds envs' min_batch_allocation may hold back a batch the queue could "
            "fill; then it goes with what they have",
        ),
    ] = 5.0,
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
) -> None:
    """Serve the Atropos trajectory API: trainers pull batches, environments push groups."""
    try:
        from clotho.trainers.server import ApiServer
        from clotho.trainers.state import ApiSettings
    except ImportError:
        console.print(f"[red]error:[/] {escape(INSTALL_HINT)}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    made = not token and not no_auth
    if made:
        token = secrets.token_urlsafe(24)
    elif no_auth:
        token = None
    settings = ApiSettings(
        batch_size=batch_size,
        max_token_len=max_token_len,
        env_timeout_s=env_timeout,
        token=token,
        cors_origins=cors_origin or [],
        max_request_bytes=int(max_request_mb * (1 << 20)),
        vocab_size=vocab_size,
        min_allocation_wait_s=min_allocation_wait,
    )

    async def serve() -> None:
        async with ApiServer(settings, host=host, port=port, access_log=access_log) as server:
            console.print(f"trajectory API listening on [bold]{server.url}[/] (Ctrl-C stops)")
            if made:
                console.print(
                    f"no --token or CLOTHO_API_TOKEN given: made one: [bold]{token}[/]\n"
                    f"  clotho serve / AtroposClient: CLOTHO_API_TOKEN={token}\n"
                    f"  Atropos trainers and environments: "
                    f"{server.url.replace('://', f'://clotho:{token}@')}",
                    soft_wrap=True,
                )
            elif no_auth:
                console.print(
                    "[yellow]warning:[/] --no-auth: any process on this machine can wipe or "
                    "poison the training data"
                )
            await server.wait()

    try:
        asyncio.run(cancel_on_signals(serve()))
    except (KeyboardInterrupt, Terminated):
        console.print("stopped")
    except ClothoError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
