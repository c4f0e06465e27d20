"""`clotho serve-model`: serve a GGUF model (default: the embedded SmolLM2) over SGLang's
`/generate` protocol, so token-level tools and other machines can use it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from clotho.errors import ClothoError

console = Console(stderr=True)
INSTALL_HINT = "`clotho serve-model` needs the extra: pip install 'clotho-rl[local,api]'"


def serve_model_command(
    gguf: Annotated[
        Path | None, typer.Option(help="GGUF model file (default: the embedded SmolLM2-135M)")
    ] = None,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port (SGLang's default)")] = 30000,
    n_ctx: Annotated[int, typer.Option(min=256, help="context length in tokens")] = 8192,
) -> None:
    """Serve a model token-in/token-out: POST /generate with input_ids, as SGLang does.

    Point clotho at it with `--api sglang --base-url http://HOST:PORT --tokenizer ...`.
    """
    try:
        from clotho.chat.local_model import load_embedded_model
        from clotho.chat.token_server import serve
    except ImportError:
        console.print(f"[red]error:[/] {escape(INSTALL_HINT)}")
        raise typer.Exit(2) from None
    try:
        client, _ = load_embedded_model(gguf, n_ctx=n_ctx)
    except ClothoError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from None
    console.print(
        f"serving {client.model_path.name} (context {client.n_ctx}) on http://{host}:{port}"
    )
    serve(
        client,
        host=host,
        port=port,
        stop_token_ids=client.end_of_turn_ids,
        model_path=str(client.model_path),
    )
