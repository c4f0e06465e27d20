"""Token-in / token-out over HTTP: vLLM's `/v1/completions` and SGLang's `/generate`.

Both take the prompt as token ids (nothing is re-tokenized on the server) and return the ids
they sampled with the logprob of each. vLLM: `prompt` is a list of ids, `logprobs: 0` gives
the sampled token's logprob, `return_token_ids` the ids (`return_tokens_as_token_ids` names
tokens `token_id:N` in the logprobs, for servers older than `return_token_ids`). SGLang:
`input_ids`, `return_logprob`, and `meta_info.output_token_logprobs` as
`[logprob, token_id, text]` triples. A stop id is sampled and kept, as the model produced it.

The model's context is read once, at the first turn, when `max_context_tokens` is unset:
`GET /v1/models` gives `max_model_len` per served model on vLLM, on SGLang (whose
`/get_model_info` has no length) and on `clotho serve-model`. With it the conversation ends as
the agent's `token_limit` before the server would refuse it; a server that does not say leaves
the budget unset.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import httpx

from clotho.chat.client import EndpointClient, ModelConfig
from clotho.chat.http import MalformedResponse
from clotho.chat.tokens import FinishReason, Generation, TokenSampling

TokenApi = Literal["vllm", "sglang"]

MODELS_REPLY_BYTES = 1 << 20
"""A model list is a few hundred bytes per model: more is not read."""
CONTEXT_READ_TIMEOUT_S = 30.0


class ContextLength(NamedTuple):
    """The model's context in tokens as its server reports it (None: it does not say), and
    where it was read or why there is none, for the log."""

    tokens: int | None
    source: str


class _HttpTokenClient(EndpointClient):
    path: str
    models_path: str  # the model list, relative to base_url

    def __init__(
        self,
        config: ModelConfig,
        *,
        api_key: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        super().__init__(config, api_key=api_key, environ=environ)
        if api_key is None and config.api_key_env:
            api_key = (environ if environ is not None else os.environ).get(config.api_key_env)
        self._api_key = api_key

    async def read_context_length(self) -> ContextLength:
        """`max_model_len` of the served model from each endpoint's model list (the smallest,
        if they differ). Never raises: a server that cannot say gives `tokens=None`."""
        headers = {"Accept-Encoding": "identity"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        timeout = min(self.config.timeout_s, CONTEXT_READ_TIMEOUT_S)
        # Making a client loads the TLS trust store: in a worker thread, off the loop.
        http = await asyncio.to_thread(httpx.AsyncClient, headers=headers, timeout=timeout)
        async with http:
            readings = await asyncio.gather(
                *(
                    self._read_one(http, f"{url}/{self.models_path}", timeout)
                    for url in self.config.base_urls
                )
            )
        known = [r for r in readings if r.tokens is not None]
        if not known:
            return ContextLength(None, "; ".join(r.source for r in readings))
        least = min(known, key=lambda r: r.tokens or 0)
        unknown = [r.source for r in readings if r.tokens is None]
        return ContextLength(least.tokens, "; ".join([least.source, *unknown]))

    async def _read_one(self, http: httpx.AsyncClient, url: str, timeout: float) -> ContextLength:
        try:
            async with asyncio.timeout(timeout), http.stream("GET", url) as response:
                if response.status_code != 200:
                    return ContextLength(None, f"GET {url}: HTTP {response.status_code}")
                encoding = response.headers.get("content-encoding", "").strip().lower()
                if encoding not in ("", "identity"):
                    return ContextLength(None, f"GET {url}: an encoding not asked for")
                body = bytearray()
                async for chunk in response.aiter_raw():
                    body += chunk
                    if len(body) > MODELS_REPLY_BYTES:
                        return ContextLength(None, f"GET {url}: over {MODELS_REPLY_BYTES} bytes")
        except (httpx.HTTPError, TimeoutError) as exc:
            return ContextLength(None, f"GET {url}: {type(exc).__name__}: {exc}")
        try:
            data = json.loads(bytes(body))
        except ValueError:
            return ContextLength(None, f"GET {url}: not JSON")
        return self._context_in(data, url)

    def _context_in(self, data: Any, url: str) -> ContextLength:
        """The served model's `max_model_len` in an OpenAI-style model list: the entry named
        `config.model`, or the only one (SGLang ignores the name)."""
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return ContextLength(None, f"GET {url}: no model list")
        cards = [e for e in entries if isinstance(e, dict)]
        mine = [c for c in cards if c.get("id") == self.config.model] or (
            cards if len(cards) == 1 else []
        )
        if not mine:
            names = [c.get("id") for c in cards]
            return ContextLength(None, f"GET {url}: no model {self.config.model!r} in {names}")
        value = mine[0].get("max_model_len")
        if not _is_int(value) or value <= 0:
            return ContextLength(
                None, f"GET {url}: model {mine[0].get('id')!r} has no max_model_len"
            )
        return ContextLength(value, f"max_model_len of {mine[0].get('id')!r} from GET {url}")

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
    models_path = "models"

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
    models_path = "v1/models"

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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
