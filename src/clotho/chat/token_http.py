"""Token-in / token-out over HTTP: vLLM's `/v1/completions` and SGLang's `/generate`.

Both take the prompt as token ids (nothing is re-tokenized on the server) and return the ids
they sampled with the logprob of each. vLLM: `prompt` is a list of ids, `logprobs: 0` gives
the sampled token's logprob, `return_token_ids` the ids (`return_tokens_as_token_ids` names
tokens `token_id:N` in the logprobs, for servers older than `return_token_ids`). SGLang:
`input_ids`, `return_logprob`, and `meta_info.output_token_logprobs` as
`[logprob, token_id, text]` triples. A stop id is sampled and kept, as the model produced it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from clotho.chat.client import EndpointClient, ModelConfig
from clotho.chat.http import MalformedResponse
from clotho.chat.tokens import FinishReason, Generation, TokenSampling

TokenApi = Literal["vllm", "sglang"]


class _HttpTokenClient(EndpointClient):
    path: str

    def build_body(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, data: Any) -> Generation:
        raise NotImplementedError

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation:
        body = self.build_body(prompt_ids, sampling)
        body.update(self.config.extra_body)
        generation, latency = await self._poster.post(self.path, body, self.parse)
        generation.latency_s = latency
        return generation


class VllmTokenClient(_HttpTokenClient):
    """vLLM: `POST {base_url}/completions` with token-id prompts (base_url ends in `/v1`)."""

    path = "completions"

    def build_body(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "prompt": list(prompt_ids),
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": list(sampling.stop_token_ids),
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def parse(self, data: Any) -> Generation:
        choice = data["choices"][0]
        logprobs = choice.get("logprobs") or {}
        values = [_logprob(v) for v in logprobs.get("token_logprobs") or []]
        ids = choice.get("token_ids")
        if ids is None:  # older servers: the ids only as `token_id:N` names
            ids = [_id_from_name(t) for t in logprobs.get("tokens") or []]
        return _generation(ids, values, choice.get("finish_reason"))


class SglangTokenClient(_HttpTokenClient):
    """SGLang: `POST {base_url}/generate` with `input_ids` (base_url is the server root)."""

    path = "generate"

    def build_body(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True}

    def parse(self, data: Any) -> Generation:
        if isinstance(data, list):  # a batch of one
            data = data[0]
        meta = data["meta_info"]
        triples = meta.get("output_token_logprobs") or []
        values = [_logprob(t[0]) for t in triples]
        ids = data.get("output_ids")
        if ids is None:
            ids = [int(t[1]) for t in triples]
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type") if isinstance(finish, dict) else finish
        return _generation(ids, values, reason)


def token_client_for(
    api: TokenApi,
    config: ModelConfig,
    *,
    api_key: str | None = None,
    environ: dict[str, str] | None = None,
) -> VllmTokenClient | SglangTokenClient:
    cls = {"vllm": VllmTokenClient, "sglang": SglangTokenClient}[api]
    return cls(config, api_key=api_key, environ=environ)


def _generation(ids: Any, logprobs: list[float], reason: Any) -> Generation:
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise MalformedResponse("no list of sampled token ids")
    if len(ids) != len(logprobs):
        raise MalformedResponse(f"{len(ids)} token ids but {len(logprobs)} logprobs")
    finish: FinishReason = "length" if reason == "length" else "stop"
    if reason not in ("stop", "length", "eos", None):
        raise MalformedResponse(f"unknown finish reason {reason!r}")
    return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)


def _logprob(value: Any) -> float:
    if value is None:
        raise MalformedResponse("a sampled token has no logprob")
    number = float(value)
    if math.isnan(number) or number > 1e-6:
        raise MalformedResponse(f"{number} is not a log-probability")
    return number


def _id_from_name(name: Any) -> int:
    if isinstance(name, str) and name.startswith("token_id:"):
        return int(name.removeprefix("token_id:"))
    raise MalformedResponse(f"token {name!r} is not named by id (return_tokens_as_token_ids)")
