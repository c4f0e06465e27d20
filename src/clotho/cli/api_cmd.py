"""`clotho api`: serve the Atropos trajectory API (a drop-in for upstream `run-api`).

It never runs open unless told to (`--no-auth`, loopback only): the token comes from
`--token-file`, `--token-env` or `CLOTHO_API_TOKEN` (or, not advised, `--token`, which `ps`
shows every user), and without one it makes a token and writes it to a file only its user can
read. The token is never printed, only where it is. An open server on this machine is open to
every local process, agents' sandboxes included, and to web pages through DNS rebinding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from clotho.cli.signals import Terminated, cancel_on_signals
from clotho.cli.token_source import made_token_file, print_source, resolve_token
from clotho.errors import ClothoError, ConfigError

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
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="read the token from this file; clients must send it (Authorization: Bearer, "
            "or in the URL: http://clotho:TOKEN@host:port). Default: $CLOTHO_API_TOKEN, else "
            "a token is made and written to a private file whose path is printed",
        ),
    ] = None,
    token_env: Annotated[
        str | None,
        typer.Option(help="read the token from this environment variable"),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="the token itself (not advised: every user sees it in ps)"),
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
        from clotho.trainers.server import TOKEN_ENV, ApiServer
        from clotho.trainers.state import ApiSettings
    except ImportError:
        console.print(f"[red]error:[/] {escape(INSTALL_HINT)}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False)],
    )
    try:
        if no_auth and (token is not None or token_file is not None or token_env is not None):
            raise ConfigError("--no-auth serves without a token: give one or the other")
        source = None
        if not no_auth:
            source = resolve_token(
                token=token, token_file=token_file, token_env=token_env, default_env=TOKEN_ENV
            )
    except ClothoError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    made = source is None and not no_auth
    secret = secrets.token_urlsafe(24) if made else source.token if source else None
    kept_token = secret if made else None
    settings = ApiSettings(
        batch_size=batch_size,
        max_token_len=max_token_len,
        env_timeout_s=env_timeout,
        token=secret,
        cors_origins=cors_origin or [],
        max_request_bytes=int(max_request_mb * (1 << 20)),
        vocab_size=vocab_size,
        min_allocation_wait_s=min_allocation_wait,
    )

    async def serve() -> None:
        with contextlib.ExitStack() as stack:
            kept = None
            if kept_token is not None:
                kept = stack.enter_context(made_token_file(kept_token, "clotho-api-"))
            async with ApiServer(settings, host=host, port=port, access_log=access_log) as server:
                console.print(f"trajectory API listening on [bold]{server.url}[/] (Ctrl-C stops)")
                if kept is not None:
                    read = f"$(cat {kept})"
                    console.print(
                        f"no --token-file, --token-env or {TOKEN_ENV} given: made a token, in "
                        f"[bold]{escape(str(kept))}[/] (only you can read it; removed when the "
                        "server stops)\n"
                        f"  clotho serve / AtroposClient: {TOKEN_ENV}={escape(read)}\n"
                        f"  Atropos trainers and environments: "
                        f"{escape(server.url.replace('://', f'://clotho:{read}@'))}",
                        soft_wrap=True,
                    )
                elif source is not None:
                    print_source(console, source)
                else:
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
