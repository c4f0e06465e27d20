"""`clotho api`: serve the Atropos trajectory API (a drop-in for upstream `run-api`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

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
    access_log: Annotated[bool, typer.Option(help="log every request")] = False,
) -> None:
    """Serve the Atropos trajectory API: trainers pull batches, environments push groups."""
    try:
        from clotho.trainers.server import ApiServer
        from clotho.trainers.state import ApiSettings
    except ImportError:
        console.print(f"[red]error:[/] {INSTALL_HINT}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    settings = ApiSettings(
        batch_size=batch_size, max_token_len=max_token_len, env_timeout_s=env_timeout
    )

    async def serve() -> None:
        async with ApiServer(settings, host=host, port=port, access_log=access_log) as server:
            console.print(f"trajectory API listening on [bold]{server.url}[/] (Ctrl-C stops)")
            await server.wait()

    try:
        asyncio.run(cancel_on_signals(serve()))
    except (KeyboardInterrupt, Terminated):
        console.print("stopped")
    except ClothoError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
