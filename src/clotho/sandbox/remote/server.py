"""The sandbox server a Nomad allocation runs: one endpoint that runs a script with bash.

`POST /run` takes the script and its limit in the `X-Clotho-Run` header (JSON) and the
script's stdin as the raw body; it answers the exit code and stdout length in headers and
stdout then stderr as the raw body (no base64 anywhere). `GET /health` says it is up. Every
request must carry `Authorization: Bearer <token>` (the token is the job's, from the
environment variable named by `--token-env`). The slots are the backend's business
(`slot_sandbox.py`): the server knows none.

    python -m clotho.sandbox.remote.server --port 8080 --token-env CLOTHO_SERVER_TOKEN
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


async def run_script(
    script: str, stdin: bytes | None, timeout: float | None
) -> tuple[int, bytes, bytes]:
    """`bash -c script` in its own process group, killed whole at `timeout`."""
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    return int(proc.returncode or 0), out, err


def make_app(token: str) -> Starlette:
    def allowed(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given, f"Bearer {token}")

    async def health(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        return JSONResponse({"status": "ok"})

    async def run(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"error": "unauthorized"}, status_code=401)
        spec: dict[str, Any] = json.loads(request.headers.get("x-clotho-run", "{}"))
        body = await request.body()
        try:
            code, out, err = await run_script(
                str(spec["script"]), body if spec.get("stdin") else None, spec.get("timeout")
            )
        except TimeoutError:
            return JSONResponse({"error": "timeout"}, status_code=504)
        return Response(
            out + err,
            media_type="application/octet-stream",
            headers={"x-clotho-exit": str(code), "x-clotho-stdout": str(len(out))},
        )

    return Starlette(routes=[Route("/health", health), Route("/run", run, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--token-env", default="CLOTHO_SERVER_TOKEN")
    args = parser.parse_args()
    token = os.environ.get(args.token_env)
    if not token:
        raise SystemExit(f"set {args.token_env}: the server answers only requests with it")
    import uvicorn

    uvicorn.run(make_app(token), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
