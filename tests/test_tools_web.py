"""The web toolset against a TEST DOUBLE of a search provider's HTTP API.

A hosted search provider cannot run here, so `ProviderDouble` stands in for it: a real HTTP
server on 127.0.0.1 (the standard library's, in a thread) that answers POST /search and
POST /extract with scripted JSON and records every request with its headers. Everything
else is real: the registry's setup check, the tools, clotho's HTTP client.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import pytest

from clotho.errors import ConfigError
from clotho.sandbox.base import Sandbox
from clotho.tools.builtin import ToolsConfig, default_registry
from clotho.tools.runtime import ToolFailure, ToolRuntime
from clotho.tools.web import WebConfig

KEY_VAR = "CLOTHO_TEST_SEARCH_KEY"
ENV = {KEY_VAR: "sk-test-123"}

Answer = tuple[int, Any]


class ProviderDouble:
    """TEST DOUBLE of a web search provider: scripted answers per path, requests recorded."""

    def __init__(self, answers: dict[str, Answer | Callable[[Any], Answer]]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                owner.requests.append((self.path, dict(self.headers), body))
                answer = owner.answers.get(self.path, (404, {"error": "no such path"}))
                status, payload = answer(body) if callable(answer) else answer
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api"

    def __enter__(self) -> ProviderDouble:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


SEARCH_RESULTS = {
    "results": [
        {"title": "Parcel rules", "url": "https://example.test/rules", "content": "Heavy ones."},
        {"title": "Oslo depot", "url": "https://example.test/oslo", "content": "Opens at 6."},
    ]
}


@pytest.fixture
def provider() -> Iterator[ProviderDouble]:
    answers: dict[str, Answer | Callable[[Any], Answer]] = {
        "/api/search": (200, SEARCH_RESULTS),
        "/api/extract": (
            200,
            {
                "results": [{"url": "https://example.test/oslo", "raw_content": "Depot page"}],
                "failed_results": [{"url": "https://example.test/gone", "error": "404"}],
            },
        ),
    }
    with ProviderDouble(answers) as double:
        yield double


def registry_for(base_url: str | None, key_var: str | None = KEY_VAR, **extra: Any) -> Any:
    config = ToolsConfig(web=WebConfig(base_url=base_url, api_key_env=key_var, **extra))
    return default_registry(config, environ=ENV)


def runtime() -> ToolRuntime:
    # The web tools run on the host and never touch the sandbox.
    return ToolRuntime(sandbox=cast(Sandbox, None), max_output_chars=4000)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- setup: a toolset that cannot work is a ConfigError, never empty answers ----------------


def test_web_without_a_provider_fails_at_setup() -> None:
    with pytest.raises(ConfigError, match=r"needs a search provider: set tools\.web\.base_url"):
        default_registry().resolve(["web"])


def test_web_without_a_key_fails_at_setup(provider: ProviderDouble) -> None:
    with pytest.raises(ConfigError, match=r"needs tools\.web\.api_key_env"):
        registry_for(provider.base_url, key_var=None).resolve(["web"])
    with pytest.raises(ConfigError, match="set the environment variable NOT_SET_ANYWHERE"):
        registry_for(provider.base_url, key_var="NOT_SET_ANYWHERE").resolve(["web"])
    assert provider.requests == []


async def test_web_without_a_network_fails_at_setup() -> None:
    """The reachability probe is I/O: `prepare` awaits it (choosing the tools does not)."""
    registry = registry_for(f"http://127.0.0.1:{free_port()}/api", probe_timeout_s=30)
    assert [t.name for t in registry.resolve(["web"])] == ["web_search", "web_extract"]
    with pytest.raises(ConfigError, match="is unreachable"):
        await registry.prepare(["terminal", "web"])
    with pytest.raises(ConfigError, match="is unreachable"):
        await registry.prepare_distribution("terminal_web")  # web can be drawn: probed
    # A distribution that cannot draw web, or web disabled, is not probed.
    await registry.prepare_distribution("browser_only")
    await registry.prepare(["terminal", "web"], ["web"])


async def test_prepare_probes_a_reachable_provider_once(provider: ProviderDouble) -> None:
    registry = registry_for(provider.base_url)
    tools = await registry.prepare(["coding", "web"])
    assert "web_search" in [t.name for t in tools]
    await registry.prepare(["web"])
    assert provider.requests == []  # a connection, not a request


def test_a_distribution_that_draws_web_checks_it_too() -> None:
    registry = default_registry(environ=ENV)
    with pytest.raises(ConfigError, match="needs a search provider"):
        registry.sample("terminal_web", random.Random(0))  # web at 1.0: always drawn


def test_disabled_or_unchosen_web_is_not_checked() -> None:
    registry = default_registry(environ=ENV)
    assert [t.name for t in registry.resolve(["terminal"])] == ["terminal"]
    everything = [t.name for t in registry.resolve(None, ["web", "vision"])]
    assert "terminal" in everything and "browser_navigate" in everything
    assert "web_search" not in everything and "analyze_image" not in everything
    with pytest.raises(ConfigError, match="search provider"):
        registry.resolve(None)  # every toolset means web too: said, not dropped


# --- the tools against the provider double ------------------------------------------------


async def test_web_search_asks_the_provider_with_the_key(provider: ProviderDouble) -> None:
    tools = {t.name: t for t in registry_for(provider.base_url).resolve(["web"])}
    assert set(tools) == {"web_search", "web_extract"}
    out = await tools["web_search"].fn(runtime(), query="oslo parcels", max_results=2)
    assert "1. Parcel rules\n   https://example.test/rules\n   Heavy ones." in out
    assert "2. Oslo depot" in out
    path, headers, body = provider.requests[-1]
    assert path == "/api/search"
    assert headers["Authorization"] == "Bearer sk-test-123"
    assert body == {"query": "oslo parcels", "max_results": 2}


async def test_web_extract_returns_text_and_failures(provider: ProviderDouble) -> None:
    tools = {t.name: t for t in registry_for(provider.base_url).resolve(["web"])}
    out = await tools["web_extract"].fn(
        runtime(), urls=["https://example.test/oslo", "https://example.test/gone"]
    )
    assert "# https://example.test/oslo\nDepot page" in out
    assert "# https://example.test/gone\n[failed: 404]" in out
    assert provider.requests[-1][2] == {
        "urls": ["https://example.test/oslo", "https://example.test/gone"]
    }
    with pytest.raises(ToolFailure, match="at most 5"):
        await tools["web_extract"].fn(runtime(), urls=[f"https://e.test/{i}" for i in range(6)])


async def test_no_results_are_said_not_silent(provider: ProviderDouble) -> None:
    provider.answers["/api/search"] = (200, {"results": []})
    tools = {t.name: t for t in registry_for(provider.base_url).resolve(["web"])}
    out = await tools["web_search"].fn(runtime(), query="nothing at all")
    assert out == "the provider found no results for 'nothing at all'"


@pytest.mark.parametrize(
    "answer, said",
    [
        ((401, {"error": "bad key"}), "the web provider failed"),
        ((500, {"error": "down"}), "the web provider failed"),
        ((200, {"hits": []}), "the web provider failed"),
        ((200, b"not json"), "the web provider failed"),
    ],
)
async def test_provider_failures_are_tool_errors(
    provider: ProviderDouble, answer: Answer, said: str
) -> None:
    provider.answers["/api/search"] = answer
    registry = registry_for(provider.base_url, max_retries=0)
    tools = {t.name: t for t in registry.resolve(["web"])}
    with pytest.raises(ToolFailure, match=said):
        await tools["web_search"].fn(runtime(), query="q")
    assert len(provider.requests) == 1
