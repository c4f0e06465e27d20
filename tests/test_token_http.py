"""Token clients over real HTTP on 127.0.0.1.

vLLM cannot run here, so `ScriptedOpenAIServer` (tests/scripted_openai.py, a TEST DOUBLE)
stands in for its `/v1/completions` endpoint, replying in vLLM's documented shape; the
requests the client sends are checked field by field. SGLang's `/generate` is exercised
against clotho's own token server in tests/test_token_agent.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.scripted_openai import HTTPError, RawBody, ScriptedOpenAIServer, fast_config

from clotho.chat.token_http import SglangTokenClient, VllmTokenClient, token_client_for
from clotho.chat.tokens import TokenSampling
from clotho.errors import ModelError


def vllm_reply(ids: list[int], logprobs: list[float], finish: str = "stop", **extra: Any) -> str:
    choice: dict[str, Any] = {
        "index": 0,
        "text": "ignored",
        "finish_reason": finish,
        "logprobs": {
            "tokens": [f"token_id:{i}" for i in ids],
            "token_logprobs": logprobs,
            "top_logprobs": None,
            "text_offset": list(range(len(ids))),
        },
        **extra,
    }
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})


async def test_vllm_sends_token_ids_and_reads_ids_and_logprobs() -> None:
    sampling = TokenSampling(max_tokens=7, temperature=0.6, top_p=0.9, seed=3, stop_token_ids=[9])
    script = [RawBody(vllm_reply([5, 6, 9], [-0.5, -0.25, -0.125], token_ids=[5, 6, 9]))]
    with ScriptedOpenAIServer(script, path="/v1/completions") as server:
        client = VllmTokenClient(fast_config(server.base_url, extra_body={"min_p": 0.05}))
        try:
            generation = await client.generate([1, 2, 3], sampling)
        finally:
            await client.aclose()
    assert generation.token_ids == [5, 6, 9]
    assert generation.logprobs == [-0.5, -0.25, -0.125]
    assert generation.finish_reason == "stop"
    assert generation.latency_s > 0
    body = server.requests[0]
    assert body["prompt"] == [1, 2, 3], "the prompt goes as ids, never as text"
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["return_tokens_as_token_ids"] is True
    assert body["stop_token_ids"] == [9] and body["skip_special_tokens"] is False
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        7,
        0.6,
        0.9,
        3,
    )
    assert body["min_p"] == 0.05, "extra_body is passed through"


async def test_vllm_without_return_token_ids_reads_ids_from_token_names() -> None:
    script = [RawBody(vllm_reply([11, 12], [-1.0, -2.0], finish="length"))]
    with ScriptedOpenAIServer(script, path="/v1/completions") as server:
        client = token_client_for("vllm", fast_config(server.base_url))
        try:
            generation = await client.generate([1], TokenSampling(max_tokens=2))
        finally:
            await client.aclose()
    assert (generation.token_ids, generation.finish_reason) == ([11, 12], "length")


@pytest.mark.parametrize(
    "bad",
    [
        vllm_reply([1, 2], [-1.0]),  # one logprob short
        vllm_reply([1], [None]),  # type: ignore[list-item]
        vllm_reply([1], [0.5]),  # not a log-probability
        json.dumps({"choices": [{"logprobs": {"tokens": ["hello"], "token_logprobs": [-1]}}]}),
        "not json",
    ],
)
async def test_malformed_replies_are_retried_then_a_model_error(bad: str) -> None:
    with ScriptedOpenAIServer([RawBody(bad)] * 4, path="/v1/completions") as server:
        client = VllmTokenClient(fast_config(server.base_url, max_retries=2))
        try:
            with pytest.raises(ModelError, match="malformed response"):
                await client.generate([1], TokenSampling())
        finally:
            await client.aclose()
    assert len(server.requests) == 3


async def test_server_errors_are_retried_and_client_errors_are_not() -> None:
    good = RawBody(vllm_reply([4], [-0.1]))
    with ScriptedOpenAIServer([HTTPError(503), good], path="/v1/completions") as server:
        client = VllmTokenClient(fast_config(server.base_url))
        try:
            assert (await client.generate([1], TokenSampling())).token_ids == [4]
        finally:
            await client.aclose()
    with ScriptedOpenAIServer([HTTPError(400)], path="/v1/completions") as server:
        client = VllmTokenClient(fast_config(server.base_url))
        try:
            with pytest.raises(ModelError, match="HTTP 400"):
                await client.generate([1], TokenSampling())
        finally:
            await client.aclose()
        assert len(server.requests) == 1


async def test_sglang_request_and_reply_shapes() -> None:
    reply = {
        "text": "x",
        "output_ids": [7, 8],
        "meta_info": {
            "finish_reason": {"type": "length", "length": 2},
            "output_token_logprobs": [[-0.3, 7, None], [-0.7, 8, None]],
            "prompt_tokens": 2,
            "completion_tokens": 2,
        },
    }
    with ScriptedOpenAIServer([RawBody(json.dumps(reply))], path="/generate") as server:
        root = server.base_url.removesuffix("/v1")
        client = SglangTokenClient(fast_config(root))
        try:
            generation = await client.generate(
                [3, 4], TokenSampling(max_tokens=2, top_k=20, stop_token_ids=[2])
            )
        finally:
            await client.aclose()
    assert (generation.token_ids, generation.logprobs) == ([7, 8], [-0.3, -0.7])
    assert generation.finish_reason == "length"
    body = server.requests[0]
    assert body["input_ids"] == [3, 4] and body["return_logprob"] is True
    params = body["sampling_params"]
    assert (params["max_new_tokens"], params["top_k"], params["stop_token_ids"]) == (2, 20, [2])
    assert params["no_stop_trim"] is True and params["skip_special_tokens"] is False
