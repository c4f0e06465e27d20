"""`clotho serve-model`: serve a GGUF model (default: the embedded SmolLM2) over SGLang's
`/generate` protocol, so token-level tools and other machines can use it.

Access as `clotho api`: with a token (from `--token-file`, `--token-env`, or
`CLOTHO_MODEL_TOKEN`) clients send `Authorization: Bearer <token>`; without one it serves
loopback only. The token is never printed, only where it was read from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from clotho.cli.token_source import print_source, resolve_token
from clotho.errors import ClothoError

console = Console(stderr=True)
INSTALL_HINT = "`clotho serve-model` needs the extra: pip install 'clotho-rl[local,api]'"
TOKEN_ENV = "CLOTHO_MODEL_TOKEN"
"""Where `clotho serve-model` reads its token when no flag names one."""


def serve_model_command(
    gguf: Annotated[
        Path | None, typer.Option(help="GGUF model file (default: the embedded SmolLM2-135M)")
    ] = None,
    host: Annotated[
        str, typer.Option(help="address to listen on (not loopback: a token is required)")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port (SGLang's default)")] = 30000,
    n_ctx: Annotated[int, typer.Option(min=256, help="context length in tokens")] = 8192,
    token_file: Annotated[
        Path | None,
        typer.Option(
            help="read the token clients must send (Authorization: Bearer) from this file. "
            f"Default: ${TOKEN_ENV} if set, else no token (loopback only)"
        ),
    ] = None,
    token_env: Annotated[
        str | None, typer.Option(help="read the token from this environment variable")
    ] = None,
    max_request_mb: Annotated[
        float, typer.Option(min=0.001, help="largest request body: 413 past it")
    ] = 16.0,
) -> None:
    """Serve a model token-in/token-out: POST /generate with input_ids, as SGLang does.

    Point clotho at it with `--api sglang --base-url http://HOST:PORT --tokenizer ...`
    (and `--api-key-env VAR`, VAR holding the token, when it has one).
    """
    try:
        from clotho.chat.local_model import load_embedded_model
        from clotho.chat.token_server import listen_socket, serve
    except ImportError:
        console.print(f"[red]error:[/] {escape(INSTALL_HINT)}")
        raise typer.Exit(2) from None
    try:
        source = resolve_token(
            token=None, token_file=token_file, token_env=token_env, default_env=TOKEN_ENV
        )
        token = source.token if source else None
        # Bound before the model loads: a refused address or a busy port fails at once.
        sock = listen_socket(host, port, token)
    except ClothoError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    try:
        client, _ = load_embedded_model(gguf, n_ctx=n_ctx)
    except ClothoError as exc:
        sock.close()
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    console.print(
        f"serving {client.model_path.name} (context {client.n_ctx}) on http://{shown}:{bound_port}",
        soft_wrap=True,
    )
    if source is not None:
        print_source(console, source)
    else:
        console.print(
            f"no token (--token-file, --token-env or {TOKEN_ENV}): serving loopback clients only"
        )
    serve(
        client,
        sock=sock,
        stop_token_ids=client.end_of_turn_ids,
        model_path=str(client.model_path),
        token=token,
        max_request_bytes=int(max_request_mb * (1 << 20)),
    )
