"""`clotho view`'s web app: one page of vanilla JS over a few JSON endpoints (Starlette).

GET /                                   the page (static/index.html, app.js, app.css)
GET /api/runs                           one summary per source (runs and group files)
GET /api/run/{id}                       a run's summary, metrics and config
GET /api/run/{id}/trials?since=&version=  table rows from `since` on (the page polls this)
GET /api/run/{id}/trial/{n}             a trial's detail, read on demand
GET /api/groups/{id}                    a group file's summary and one row per group
GET /api/groups/{id}/group/{n}          one group: its rollouts, tokens, masks, logprobs

Files are read in a thread so a big results.jsonl never stalls the server's loop. Every
request passes `guard.ViewGuard` first: its Host, its origin, and the token if there is one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from clotho.errors import ConfigError
from clotho.view.guard import HostCheck, ViewGuard
from clotho.view.sources import GroupsSource, RunSource, Source, pieces_for

STATIC = resources.files("clotho.view") / "static"

try:  # the api/dev extras have it: 10,000 table rows serialise in a few ms
    from orjson import dumps
except ImportError:  # pragma: no cover

    def dumps(content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode()


def _starlette() -> Any:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "clotho view needs Starlette and uvicorn: pip install 'clotho-rl[api]'"
        ) from exc


def static_text(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


def page(data: str | None, *, inline: bool, noscript: str = "") -> str:
    """The page: with `inline`, the CSS and JS inside it (the export), else linked;
    `noscript`: HTML shown where JavaScript does not run."""
    if inline:
        style = "<style>\n" + static_text("app.css") + "</style>"
        script = "<script>\n" + static_text("app.js").replace("</", "<\\/") + "</script>"
    else:
        style = '<link rel="stylesheet" href="static/app.css">'
        script = '<script src="static/app.js"></script>'
    html = static_text("index.html")
    fallback = f"<noscript>{noscript}</noscript>" if noscript else ""
    for key, value in (("{{STYLE}}", style), ("{{SCRIPT}}", script), ("{{NOSCRIPT}}", fallback)):
        html = html.replace(key, value)
    return html.replace("{{DATA}}", data if data is not None else "null")


def create_app(
    sources: list[Source], *, hosts: HostCheck | None = None, token: str | None = None
) -> Any:
    """The app over these sources, answering the hosts `hosts` allows (default: loopback
    names only) and, with `token`, only requests that carry it."""
    _starlette()
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response
    from starlette.routing import Route

    class JSONResponse(Response):
        media_type = "application/json"

        def render(self, content: Any) -> bytes:
            return dumps(content)

    by_id = {s.id: s for s in sources}

    def _source(request: Request, kind: type) -> Any:
        source = by_id.get(request.path_params["id"])
        return source if isinstance(source, kind) else None

    def _int(request: Request, name: str) -> int | None:
        raw = request.query_params.get(name)
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None

    async def index(request: Request) -> Response:
        return HTMLResponse(page(None, inline=False))

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        media = {"app.js": "text/javascript", "app.css": "text/css"}.get(name)
        if media is None:
            return Response("not found", status_code=404)
        return Response(static_text(name), media_type=media + "; charset=utf-8")

    async def runs(request: Request) -> Response:
        summaries = await asyncio.to_thread(lambda: [s.summary() for s in sources])
        return JSONResponse(summaries)

    async def run(request: Request) -> Response:
        source = _source(request, RunSource)
        if source is None:
            return JSONResponse({"error": "no such run"}, status_code=404)
        return JSONResponse(await asyncio.to_thread(source.overview))

    async def trials(request: Request) -> Response:
        source = _source(request, RunSource)
        if source is None:
            return JSONResponse({"error": "no such run"}, status_code=404)
        since = max(0, _int(request, "since") or 0)
        version = _int(request, "version")
        return JSONResponse(await asyncio.to_thread(source.trials, since, version))

    async def trial(request: Request) -> Response:
        source = _source(request, RunSource)
        detail = None
        if source is not None:
            detail = await asyncio.to_thread(source.detail, int(request.path_params["n"]))
        if detail is None:
            return JSONResponse({"error": "no such trial"}, status_code=404)
        return JSONResponse(detail)

    async def groups(request: Request) -> Response:
        source = _source(request, GroupsSource)
        if source is None:
            return JSONResponse({"error": "no such group file"}, status_code=404)

        def read() -> dict[str, Any]:
            return {"summary": source.summary(), "rows": source.group_rows()}

        return JSONResponse(await asyncio.to_thread(read))

    async def group(request: Request) -> Response:
        source = _source(request, GroupsSource)
        found = None
        if source is not None:
            found = await asyncio.to_thread(source.group, int(request.path_params["n"]))
        if found is None:
            return JSONResponse({"error": "no such group"}, status_code=404)
        return JSONResponse(found)

    def warm() -> None:
        for source in sources:
            source.summary()
        for source in sources:  # tokenizers load once, before a trial asks for one
            if isinstance(source, RunSource) and source.config().get("agent") in (None, "llm"):
                pieces_for(source.tokenizer_path())  # oracle / nop runs have no tokens
            elif isinstance(source, GroupsSource):
                pieces_for(source.tokenizer)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        # Read every source once in the background: the first page opens on a warm index.
        warming = asyncio.get_running_loop().run_in_executor(None, warm)
        yield
        warming.cancel()

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/", index),
            Route("/static/{name}", asset),
            Route("/api/runs", runs),
            Route("/api/run/{id}", run),
            Route("/api/run/{id}/trials", trials),
            Route("/api/run/{id}/trial/{n:int}", trial),
            Route("/api/groups/{id}", groups),
            Route("/api/groups/{id}/group/{n:int}", group),
        ],
    )
    return ViewGuard(app, hosts or HostCheck.loopback(), token)
