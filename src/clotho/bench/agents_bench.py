"""`clotho bench agents`: what running a third-party agent costs beyond the agent itself.

Two figures per registered installed agent, measured in one run beside their baselines:

- the gateway's latency per model call, p50, in the API the agent speaks, against the model
  server alone: a scripted server on 127.0.0.1 answering one short reply at once (so the
  figure is the gateway's own: parsing, forwarding through the run's `ChatClient`, recording
  and rendering), called with the same HTTP client both ways;
- the sandbox's preparation for the agent: the image's python probe, the install (cached; the
  first install's own time comes from its stamp) and its exposure: the read-only bind the
  backend made (a probe), beside the upload the backends that cannot bind fall back to.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.bench.stats import latency_ms

Backend = Literal["local", "docker"]

REPLY = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "bench",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}
    ],
    "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
}
# One short call per API the gateway speaks, as an agent would send it.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai-chat": (
        "/v1/chat/completions",
        {"model": "bench", "messages": [{"role": "user", "content": "hi"}]},
    ),
    "anthropic-messages": (
        "/v1/messages",
        {"model": "bench", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "openai-responses": ("/v1/responses", {"model": "bench", "input": "hi"}),
}


class AgentFigures(BaseModel):
    agent: str
    version: str
    api: str = Field(description="the model API measured (the agent's first)")
    gateway_p50_ms: float | None = Field(None, description="a call through the gateway")
    gateway_overhead_ms: float | None = Field(
        None, description="gateway p50 minus the model server alone's p50"
    )
    python_probe_ms: float | None = None
    install_ms: float | None = Field(None, description="finding the cached install")
    install_once_s: float | None = Field(None, description="the install itself, from its stamp")
    install_mb: float | None = None
    bind_ms: float | None = Field(None, description="checking the read-only bind")
    prepare_s: float | None = Field(
        None, description="what the runner spends before the agent: probe, install, exposure"
    )
    upload_s: float | None = Field(None, description="the fallback exposure: an upload")
    error: str | None = None


class AgentsBench(BaseModel):
    schema_version: Literal[1] = 1
    backend: Backend
    calls: int
    model_alone_p50_ms: float = Field(description="the scripted model server, called directly")
    agents: list[AgentFigures]


class ScriptedModelServer:
    """The model of the benchmark: a chat-completions endpoint on 127.0.0.1 that answers one
    fixed short reply at once (a stand-in for a hosted model, whose time is not measured)."""

    def __init__(self) -> None:
        body = json.dumps(REPLY).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> ScriptedModelServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


async def _post_p50(client: Any, url: str, body: dict[str, Any], headers: dict[str, str],
                    n: int) -> float:  # fmt: skip
    async def call() -> None:
        reply = await client.post(url, json=body, headers=headers)
        if reply.status_code != 200:
            raise RuntimeError(f"{url}: {reply.status_code} {reply.text[:300]}")

    p50, _ = await latency_ms(call, n, warmup=min(20, n))
    return p50


async def _gateway_figures(
    names: list[str], n: int, say: Callable[[str], None]
) -> tuple[float, dict[str, tuple[str, float | None]]]:
    """The model server alone's p50, and per agent (its API, the gateway's p50)."""
    import httpx

    from clotho.chat.client import ChatClient, ModelConfig
    from clotho.gateway import Gateway
    from clotho.installed_agents import installed_agent

    found: dict[str, tuple[str, float | None]] = {}
    with ScriptedModelServer() as server:
        config = ModelConfig(model="bench", base_url=server.base_url, api_key_env=None,
                             max_retries=0)  # fmt: skip
        model = ChatClient(config)
        gateway = Gateway(model, model_name="bench")
        try:
            listener = await gateway.listen_tcp()
            assert listener.url is not None
            async with httpx.AsyncClient(timeout=60) as client:
                say("the model server alone")
                path, body = CALLS["openai-chat"]
                alone = await _post_p50(client, server.base_url + "/chat/completions", body, {}, n)
                for name in names:
                    api = installed_agent(name).apis[0]
                    if api not in CALLS:
                        found[name] = (api, None)
                        continue
                    say(f"the gateway ({api}) for {name}")
                    trial = gateway.open_trial()
                    path, body = CALLS[api]
                    headers = {"authorization": f"Bearer {trial.token}"}
                    p50 = await _post_p50(client, listener.url + path, body, headers, n)
                    gateway.close_trial(trial)
                    found[name] = (api, p50)
        finally:
            await gateway.aclose()
            await model.aclose()
    return alone, found


async def _prepare_figures(
    name: str, backend: Backend, cache_dir: Path, upload: bool, figures: AgentFigures
) -> None:
    from clotho.installed_agents import installed_agent
    from clotho.installed_agents.base import (
        agents_mount,
        bound_install,
        expose_install,
        sandbox_python,
    )
    from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, open_sandbox
    from clotho.sandbox.config import SandboxConfigBase

    agent = installed_agent(name)
    mounts = [agents_mount(cache_dir)]
    config: SandboxConfigBase = (
        LocalSandboxConfig(ro_mounts=mounts)
        if backend == "local"
        else DockerSandboxConfig(ro_mounts=mounts)
    )
    async with await open_sandbox(config, {"clotho.bench": "agents"}) as sandbox:
        started = time.perf_counter()
        python = await sandbox_python(sandbox, name, (3, 10))
        probed = time.perf_counter()
        install = await agent.prepare(python, cache_dir)  # the first time: the real install
        figures.install_once_s = round(install.stamp.seconds, 3)
        figures.install_mb = round(install.stamp.bytes / 1e6, 1)
        cached = time.perf_counter()
        install = await agent.prepare(python, cache_dir)  # what every later trial pays
        found = time.perf_counter()
        inner = await bound_install(sandbox, install, cache_dir)
        bound = time.perf_counter()
        if inner is None:
            raise RuntimeError(f"the {backend} backend did not bind the install read-only")
        figures.python_probe_ms = round((probed - started) * 1000, 2)
        figures.install_ms = round((found - cached) * 1000, 2)
        figures.bind_ms = round((bound - found) * 1000, 2)
        figures.prepare_s = round((probed - started) + (found - cached) + (bound - found), 4)
        if upload:
            begun = time.perf_counter()
            await expose_install(sandbox, install, f"{agent.name}-{agent.version}")
            figures.upload_s = round(time.perf_counter() - begun, 3)


async def run_agents_bench(
    backend: Backend = "local",
    *,
    agents: list[str] | None = None,
    calls: int = 200,
    upload: bool = True,
    cache_dir: Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> AgentsBench:
    """Measure every registered installed agent (or `agents`); an agent whose preparation
    fails keeps its gateway figures and says why."""
    from clotho.errors import ConfigError
    from clotho.installed_agents import agent_names, installed_agent
    from clotho.installed_agents.base import default_cache_dir

    say = progress or (lambda msg: None)
    names = agents or agent_names()
    unknown = sorted(set(names) - set(agent_names()))
    if unknown:
        known = ", ".join(agent_names())
        raise ConfigError(f"unknown installed agent(s) {', '.join(unknown)}; known: {known}")
    cache = cache_dir or default_cache_dir()
    alone, gateway = await _gateway_figures(names, calls, say)
    rows: list[AgentFigures] = []
    for name in names:
        agent = installed_agent(name)
        api, p50 = gateway[name]
        figures = AgentFigures(agent=name, version=agent.version, api=api)
        if p50 is not None:
            figures.gateway_p50_ms = round(p50, 3)
            figures.gateway_overhead_ms = round(p50 - alone, 3)
        say(f"preparing a {backend} sandbox for {name}")
        try:
            await _prepare_figures(name, backend, cache, upload, figures)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            figures.error = f"{type(exc).__name__}: {exc}"[:500]
        rows.append(figures)
    return AgentsBench(backend=backend, calls=calls, model_alone_p50_ms=round(alone, 3),
                       agents=rows)  # fmt: skip
