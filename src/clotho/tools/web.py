"""The `web` toolset: search and extract through a provider the user names (an HTTP API).

The provider is called from the host with the user's key (the key never enters a sandbox).
Its API, in the shape common search APIs share:

    POST {base_url}/search   {"query": str, "max_results": int}
        -> {"results": [{"title": str, "url": str, "content": str}, ...]}
    POST {base_url}/extract  {"urls": [str, ...]}
        -> {"results": [{"url": str, "raw_content" or "content": str}, ...],
            "failed_results": [{"url": str, "error": str}, ...]}

with `Authorization: Bearer <key>`. A toolset that cannot work is a `ConfigError` at setup,
never a silent empty result: no provider named or no key in the named variable when the tools
are chosen (`check`), the provider's address unreachable (no network) when they are prepared
(`probe`, awaited by `ToolRegistry.prepare`); a provider that fails later is a tool error.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from clotho.chat.http import MalformedResponse
from clotho.errors import ConfigError
from clotho.tools.hosted import HostedApi
from clotho.tools.runtime import ToolFailure, ToolRuntime, truncate_middle
from clotho.tools.tool import Tool, tool


class WebConfig(BaseModel):
    """The search provider of the `web` toolset."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="the provider's API root, e.g. https://host/v1")
    api_key_env: str | None = Field(
        None, description="name of the environment variable holding the provider's key"
    )
    search_path: str = "/search"
    extract_path: str = "/extract"
    max_results: int = Field(5, ge=1, le=50)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(2, ge=0)
    max_reply_bytes: int = Field(8 << 20, ge=1024)
    probe_timeout_s: float = Field(10.0, gt=0, description="the reachability check at setup")


async def reachable(url: str, timeout_s: float) -> str | None:
    """None if a TCP connection to the URL's host and port opens, else why not."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except (OSError, TimeoutError) as exc:
        return f"cannot connect to {parts.hostname}:{port} ({exc or type(exc).__name__})"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


class WebProvider(HostedApi):
    """The configured provider; `check` is the setup-time verdict."""

    config: WebConfig

    def __init__(self, config: WebConfig, environ: dict[str, str] | None = None) -> None:
        super().__init__(config, environ)
        self._reached = False

    def check(self) -> None:
        """Raise `ConfigError` unless a provider is named and its key is set (no I/O)."""
        config = self.config
        if not config.base_url:
            raise ConfigError(
                "the web toolset needs a search provider: set tools.web.base_url (the "
                "provider's HTTP API) and tools.web.api_key_env (the variable holding its key)"
            )
        if not config.api_key_env:
            raise ConfigError(
                "the web toolset needs tools.web.api_key_env: the name of the environment "
                "variable holding the provider's key"
            )
        if self._key() is None:
            raise ConfigError(
                f"the web toolset's key is missing: set the environment variable "
                f"{config.api_key_env} (tools.web.api_key_env)"
            )

    async def probe(self) -> None:
        """Raise `ConfigError` unless the provider's address takes a connection (once)."""
        self.check()
        if self._reached:
            return
        assert self.config.base_url is not None
        why = await reachable(self.config.base_url, self.config.probe_timeout_s)
        if why:
            raise ConfigError(
                f"the web toolset's provider {self.config.base_url} is unreachable ({why}); "
                "web search needs a network from this host"
            )
        self._reached = True

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        config = self.config
        if not config.base_url or self._key() is None:
            raise ToolFailure("the web toolset is not configured (no provider or key)")
        return await self._post(
            path,
            body,
            _object,
            failed="the web provider failed",
            max_reply_bytes=config.max_reply_bytes,
        )


def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise MalformedResponse("the provider's reply has no results list")
    return data


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def web_tools(provider: WebProvider) -> list[Tool]:
    """`web_search` and `web_extract` bound to one provider."""

    @tool(name="web_search")
    async def web_search(rt: ToolRuntime, query: str, max_results: int | None = None) -> str:
        """Search the web; returns titles, URLs and short extracts of the top results.

        Args:
            query: what to search for.
            max_results: how many results at most (default: the configured number).
        """
        if not query.strip():
            raise ToolFailure("query is empty")
        wanted = min(max_results or provider.config.max_results, 50)
        reply = await provider.post(
            provider.config.search_path, {"query": query, "max_results": max(1, wanted)}
        )
        results = [r for r in reply["results"] if isinstance(r, dict)][:wanted]
        if not results:
            return f"the provider found no results for {query!r}"
        blocks = []
        for number, result in enumerate(results, start=1):
            blocks.append(
                f"{number}. {_text(result.get('title')) or '(no title)'}\n"
                f"   {_text(result.get('url'))}\n   {_text(result.get('content')).strip()}"
            )
        return truncate_middle("\n\n".join(blocks), rt.max_output_chars)

    @tool(name="web_extract")
    async def web_extract(rt: ToolRuntime, urls: list[str]) -> str:
        """Fetch web pages through the search provider and return their text.

        Args:
            urls: the pages' addresses (at most 5).
        """
        urls = [u for u in urls if u.strip()]
        if not urls:
            raise ToolFailure("urls is empty")
        if len(urls) > 5:
            raise ToolFailure("at most 5 urls per call")
        reply = await provider.post(provider.config.extract_path, {"urls": urls})
        blocks = []
        for result in reply["results"]:
            if not isinstance(result, dict):
                continue
            text = _text(result.get("raw_content")) or _text(result.get("content"))
            blocks.append(f"# {_text(result.get('url'))}\n{text.strip()}")
        for failed in reply.get("failed_results") or []:
            if isinstance(failed, dict):
                blocks.append(
                    f"# {_text(failed.get('url'))}\n[failed: {_text(failed.get('error'))}]"
                )
        if not blocks:
            raise ToolFailure(f"the provider returned nothing for {urls}")
        return truncate_middle("\n\n".join(blocks), rt.max_output_chars)

    return [web_search, web_extract]
