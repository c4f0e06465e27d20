# ruff: noqa: RUF001 -- DeepSeek's special tokens are spelled with U+FF5C and U+2581.
"""Tool-call parsers: realistic turns in every format, and the seed parsers' faults fixed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from clotho.chat.parsers import ParseResult, get_parser, list_parsers

FORMATS = [
    "deepseek_v3",
    "deepseek_v3_1",
    "glm45",
    "glm47",
    "hermes",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "longcat",
    "mistral",
    "mistral_v11",
    "qwen",
    "qwen3_coder",
]
XML_FORMATS = ["glm45", "glm47", "qwen3_coder"]
JSON_FORMATS = [f for f in FORMATS if f not in XML_FORMATS]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            },
        },
    },
]

BASH_LS = ("bash", {"command": "ls -la"})
READ = ("read_file", {"path": "src/app.py"})
LS_JSON = json.dumps(BASH_LS[1])
READ_JSON = json.dumps(READ[1])

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
K_BEGIN, K_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
K_CALL, K_ARGS, K_CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)


def ds3(name: str, args: str) -> str:
    return f"{DS_CALL}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


def ds31(name: str, args: str) -> str:
    return f"{DS_CALL}{name}{DS_SEP}{args}{DS_CALL_END}"


def kimi(call_id: str, args: str) -> str:
    return f"{K_CALL}{call_id}{K_ARGS}{args}{K_CALL_END}"


# What each model writes for: one call; two calls; prose then a call. Written out by hand (not
# with `render`) so the parsers are checked against the formats, not against themselves.
EXAMPLES: dict[str, tuple[str, str, str]] = {
    "hermes": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>',
        'Let me look around.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
        "\n</tool_call>",
    ),
    "qwen": (
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>',
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>',
        'Let me look around.\n\n<tool_call>\n{"name": "bash", "arguments": {"command": '
        '"ls -la"}}\n</tool_call>',
    ),
    "longcat": (
        '<longcat_tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}'
        "</longcat_tool_call>",
        '<longcat_tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}'
        '</longcat_tool_call>\n<longcat_tool_call>{"name": "read_file", "arguments": '
        '{"path": "src/app.py"}}</longcat_tool_call>',
        'Let me look around.\n<longcat_tool_call>{"name": "bash", "arguments": {"command": '
        '"ls -la"}}</longcat_tool_call>',
    ),
    "mistral": (
        '[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls -la"}}]',
        '[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls -la"}}, '
        '{"name": "read_file", "arguments": {"path": "src/app.py"}}]',
        'Let me look around.[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls -la"}}]',
    ),
    "mistral_v11": (
        '[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}',
        '[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}[TOOL_CALLS]read_file[ARGS]'
        '{"path": "src/app.py"}',
        'Let me look around.[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}',
    ),
    "llama3_json": (
        '{"name": "bash", "parameters": {"command": "ls -la"}}',
        '{"name": "bash", "parameters": {"command": "ls -la"}}; '
        '{"name": "read_file", "parameters": {"path": "src/app.py"}}',
        'Let me look around.<|python_tag|>{"name": "bash", "parameters": {"command": "ls -la"}}',
    ),
    "llama4_json": (
        '<|python_tag|>{"name": "bash", "parameters": {"command": "ls -la"}}',
        '{"name": "bash", "parameters": {"command": "ls -la"}}'
        '{"name": "read_file", "parameters": {"path": "src/app.py"}}',
        'Let me look around.\n<|python_tag|>{"name": "bash", "arguments": {"command": "ls -la"}}',
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n"
        "</tool_call>",
        "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=read_file>\n<parameter=path>\nsrc/app.py\n"
        "</parameter>\n</function>\n</tool_call>",
        "Let me look around.\n<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n"
        "</parameter>\n</function>\n</tool_call>",
    ),
    "deepseek_v3": (
        f"{DS_BEGIN}{ds3('bash', LS_JSON)}{DS_END}",
        f"{DS_BEGIN}{ds3('bash', LS_JSON)}\n{ds3('read_file', READ_JSON)}{DS_END}",
        f"Let me look around.{DS_BEGIN}{ds3('bash', LS_JSON)}{DS_END}",
    ),
    "deepseek_v3_1": (
        f"{DS_BEGIN}{ds31('bash', LS_JSON)}{DS_END}",
        f"{DS_BEGIN}{ds31('bash', LS_JSON)}{ds31('read_file', READ_JSON)}{DS_END}",
        f"Let me look around.{DS_BEGIN}{ds31('bash', LS_JSON)}{DS_END}",
    ),
    "kimi_k2": (
        f"{K_BEGIN}{kimi('functions.bash:0', LS_JSON)}{K_END}",
        f"{K_BEGIN}{kimi('functions.bash:0', LS_JSON)}"
        f"{kimi('functions.read_file:1', READ_JSON)}{K_END}",
        f"Let me look around.{K_BEGIN}{kimi('functions.bash:0', LS_JSON)}{K_END}",
    ),
    "glm45": (
        "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n</tool_call>",
        "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n</tool_call>"
        "\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>src/app.py</arg_value>\n"
        "</tool_call>",
        "Let me look around.\n<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la"
        "</arg_value>\n</tool_call>",
    ),
    "glm47": (
        "<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value></tool_call>",
        "<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value></tool_call>"
        "<tool_call>read_file<arg_key>path</arg_key><arg_value>src/app.py</arg_value></tool_call>",
        "Let me look around.<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la"
        "</arg_value></tool_call>",
    ),
}


def pairs(result: ParseResult) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in result.calls]


# registry ---------------------------------------------------------------------------------


def test_every_format_is_registered_and_listed_sorted() -> None:
    assert list_parsers() == sorted(FORMATS)
    assert sorted(EXAMPLES) == sorted(FORMATS)


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no tool-call parser named 'nope'") as info:
        get_parser("nope")
    assert "hermes" in str(info.value) and "kimi_k2" in str(info.value)


def test_each_get_parser_is_a_fresh_trajectory() -> None:
    text = EXAMPLES["hermes"][0]
    assert (
        get_parser("hermes").parse(text).calls[0].id == get_parser("hermes").parse(text).calls[0].id
    )


# realistic turns --------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_single_call(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(EXAMPLES[fmt][0])
    assert pairs(result) == [BASH_LS]
    assert result.content is None and result.errors == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_several_calls(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(EXAMPLES[fmt][1])
    assert pairs(result) == [BASH_LS, READ]
    assert result.content is None and result.errors == []
    assert len({c.id for c in result.calls}) == 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_content_before_calls(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(EXAMPLES[fmt][2])
    assert pairs(result) == [BASH_LS]
    assert result.content == "Let me look around."
    assert result.errors == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_calls_is_content_only(fmt: str) -> None:
    text = "  The tests pass now: 3 passed in 0.2s.\n\nNothing else to do.  "
    result = get_parser(fmt, TOOLS).parse(text)
    assert result.content == text.strip()
    assert result.calls == [] and result.errors == []
    assert get_parser(fmt).parse("").content is None


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm45", "kimi_k2", "deepseek_v3_1"])
def test_text_after_the_calls_is_content_too(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(EXAMPLES[fmt][2] + "\nI'll wait for the output.")
    assert pairs(result) == [BASH_LS]
    assert result.content == "Let me look around.\nI'll wait for the output."


def test_mistral_reads_both_forms_and_keeps_ids() -> None:
    parser = get_parser("mistral")
    old = parser.parse('[TOOL_CALLS] [{"name": "bash", "arguments": {"a": 1}, "id": "a1b2c3d4e"}]')
    new = parser.parse('[TOOL_CALLS]bash[CALL_ID]f9e8d7c6b[ARGS]{"a": 2}')
    v13 = parser.parse('[TOOL_CALLS]bash[ARGS]{"a": 3}')
    assert [(c.id, c.arguments) for c in old.calls + new.calls] == [
        ("a1b2c3d4e", {"a": 1}),
        ("f9e8d7c6b", {"a": 2}),
    ]
    (made,) = v13.calls
    assert made.arguments == {"a": 3} and made.id.isalnum() and len(made.id) == 9


def test_kimi_takes_the_name_from_the_id() -> None:
    parser = get_parser("kimi_k2")
    text = f"{K_BEGIN}{kimi('functions.mcp.search:3', '{}')}{kimi('bash', '{}')}{K_END}"
    result = parser.parse(text)
    assert [(c.id, c.name) for c in result.calls] == [
        ("functions.mcp.search:3", "mcp.search"),
        ("bash", "bash"),
    ]


def test_kimi_accepts_the_singular_section_markers() -> None:
    text = (
        "<|tool_call_section_begin|>"
        + kimi("functions.bash:0", '{"command": "ls -la"}')
        + "<|tool_call_section_end|>"
    )
    assert pairs(get_parser("kimi_k2").parse(text)) == [BASH_LS]


def test_deepseek_v3_calls_without_arguments_and_without_fence() -> None:
    text = (
        f"{DS_BEGIN}{DS_CALL}function{DS_SEP}list_tasks\n```json\n{{}}\n```{DS_CALL_END}\n"
        f'{DS_CALL}function{DS_SEP}bash\n{{"command": "ls -la"}}{DS_CALL_END}{DS_END}'
    )
    assert pairs(get_parser("deepseek_v3").parse(text)) == [("list_tasks", {}), BASH_LS]


def test_glm_call_without_arguments() -> None:
    # vLLM's GLM-4.5 regex needs a newline after the name and drops the whole turn here.
    for fmt in ("glm45", "glm47"):
        result = get_parser(fmt).parse("<tool_call>list_tasks</tool_call>")
        assert pairs(result) == [("list_tasks", {})]


def test_markers_inside_json_strings_do_not_end_the_call() -> None:
    args = {"content": "write </tool_call> and <tool_call> and <|tool_call_end|> literally"}
    for fmt in ("hermes", "kimi_k2"):
        parser = get_parser(fmt)
        assert pairs(parser.parse(parser.render([("write", args)]))) == [("write", args)]


# fault: one malformed call drops the other calls of the turn -------------------------------

BROKEN: dict[str, str] = {
    "hermes": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "bash", "arguments": {"command": "rm -rf build"\n</tool_call>\n'
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>',
    "qwen": '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>\n'
    "<tool_call>\n{'name': 'bash', 'arguments': {'command': 'rm -rf build'}}\n</tool_call>\n"
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>',
    "longcat": '<longcat_tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}'
    '</longcat_tool_call><longcat_tool_call>{"name": "bash", "arguments": {"command": '
    '"rm -rf build"}}}</longcat_tool_call><longcat_tool_call>{"name": "read_file", '
    '"arguments": {"path": "src/app.py"}}</longcat_tool_call>',
    "mistral": '[TOOL_CALLS] [{"name": "bash", "arguments": {"command": "ls -la"}}, '
    '{"name": "bash", "arguments": ["rm -rf build"]}, '
    '{"name": "read_file", "arguments": {"path": "src/app.py"}}]',
    "mistral_v11": '[TOOL_CALLS]bash[ARGS]{"command": "ls -la"}[TOOL_CALLS]bash[ARGS]'
    '{"command": "rm -rf build"[TOOL_CALLS]read_file[ARGS]{"path": "src/app.py"}',
    "llama3_json": '{"name": "bash", "parameters": {"command": "ls -la"}}; '
    '{"name": "bash", "parameters": "rm -rf build"}; '
    '{"name": "read_file", "parameters": {"path": "src/app.py"}}',
    "llama4_json": '<|python_tag|>{"name": "bash", "parameters": {"command": "ls -la"}}'
    '{"parameters": {"command": "rm -rf build"}}'
    '{"name": "read_file", "parameters": {"path": "src/app.py"}}',
    "qwen3_coder": "<tool_call>\n<function=bash>\n<parameter=command>\nls -la\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=bash>\n<parameter=timeout>\nsoon\n"
    "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=read_file>\n"
    "<parameter=path>\nsrc/app.py\n</parameter>\n</function>\n</tool_call>",
    "deepseek_v3": f"{DS_BEGIN}{ds3('bash', LS_JSON)}\n"
    f"{ds3('bash', '{command: rm -rf build}')}\n"
    f"{ds3('read_file', READ_JSON)}{DS_END}",
    "deepseek_v3_1": f"{DS_BEGIN}{ds31('bash', LS_JSON)}"
    f"{DS_CALL}bash{{'command': 'rm -rf build'}}{DS_CALL_END}"
    f"{ds31('read_file', READ_JSON)}{DS_END}",
    "kimi_k2": K_BEGIN
    + kimi("functions.bash:0", LS_JSON)
    + kimi("functions.bash:1", '["rm -rf build"]')
    + kimi("functions.read_file:2", READ_JSON)
    + K_END,
    "glm45": "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls -la</arg_value>\n"
    "</tool_call>\n<tool_call>bash\n<arg_key>command</arg_key>\nrm -rf build\n</tool_call>\n"
    "<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>src/app.py</arg_value>\n"
    "</tool_call>",
    "glm47": "<tool_call>bash<arg_key>command</arg_key><arg_value>ls -la</arg_value>"
    "</tool_call><tool_call>bash<arg_key>timeout</arg_key><arg_value>1.5</arg_value>"
    "</tool_call><tool_call>read_file<arg_key>path</arg_key><arg_value>src/app.py"
    "</arg_value></tool_call>",
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_malformed_call_is_reported_and_the_others_stand(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(BROKEN[fmt])
    assert pairs(result) == [BASH_LS, READ]
    (error,) = result.errors
    assert error.raw and error.raw in BROKEN[fmt]
    assert "rm -rf build" in error.raw or "soon" in error.raw or "1.5" in error.raw
    assert error.name in ("bash", None)
    assert error.message.startswith("Tool call not run: ")
    assert get_parser(fmt).format_hint in error.message
    # removed from the content, not left there as if it were prose
    assert result.content is None


def test_error_names_the_tool_when_the_json_is_broken() -> None:
    result = get_parser("hermes").parse(BROKEN["hermes"])
    assert result.errors[0].name == "bash"
    assert "JSON is not valid" in result.errors[0].message
    assert "<tool_call>" in result.errors[0].message


# fault: arguments as a JSON string were encoded twice; non-objects were accepted ------------

STRING_ARGS: dict[str, str] = {
    "hermes": '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}</tool_call>',
    "qwen": '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}</tool_call>',
    "longcat": '<longcat_tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}'
    "</longcat_tool_call>",
    "mistral": '[TOOL_CALLS] [{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}]',
    "llama3_json": '{"name": "bash", "parameters": "{\\"command\\": \\"ls -la\\"}"}',
    "llama4_json": '{"name": "bash", "arguments": "{\\"command\\": \\"ls -la\\"}"}',
    "deepseek_v3": f"{DS_BEGIN}{ds3('bash', json.dumps(json.dumps(BASH_LS[1])))}{DS_END}",
    "deepseek_v3_1": f"{DS_BEGIN}{ds31('bash', json.dumps(json.dumps(BASH_LS[1])))}{DS_END}",
    "kimi_k2": f"{K_BEGIN}{kimi('functions.bash:0', json.dumps(json.dumps(BASH_LS[1])))}{K_END}",
}


@pytest.mark.parametrize("fmt", sorted(STRING_ARGS))
def test_string_arguments_are_decoded_once(fmt: str) -> None:
    result = get_parser(fmt).parse(STRING_ARGS[fmt])
    assert pairs(result) == [BASH_LS]
    assert result.errors == []


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ("[1, 2]", "not an array"),
        ('"ls -la"', "does not hold a JSON object"),
        ("5", "not a number"),
        ("null", "not null"),
        ('"\\"{\\\\\\"a\\\\\\": 1}\\""', "holding a string"),  # encoded twice: decoded once only
    ],
)
def test_arguments_that_are_not_an_object_are_an_error(arguments: str, says: str) -> None:
    text = f'<tool_call>{{"name": "bash", "arguments": {arguments}}}</tool_call>'
    result = get_parser("hermes").parse(text)
    assert result.calls == []
    (error,) = result.errors
    assert error.name == "bash" and says in error.message


# fault: ids repeated across the turns of a trajectory --------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_ids_are_unique_across_the_trajectory(fmt: str) -> None:
    parser = get_parser(fmt, TOOLS)
    ids = [c.id for _ in range(3) for c in parser.parse(EXAMPLES[fmt][1]).calls]
    assert len(ids) == 6 and len(set(ids)) == 6


def test_kimi_renumbers_a_repeated_id_in_its_own_shape() -> None:
    parser = get_parser("kimi_k2")
    turn = f"{K_BEGIN}{kimi('functions.bash:0', '{}')}{K_END}"
    ids = [parser.parse(turn).calls[0].id for _ in range(3)]
    assert ids[0] == "functions.bash:0"
    assert len(set(ids)) == 3
    assert all(i.startswith("functions.bash:") and i.split(":")[1].isdigit() for i in ids)


def test_mistral_replaces_a_repeated_id_with_a_valid_one() -> None:
    parser = get_parser("mistral_v11")
    turn = '[TOOL_CALLS]bash[CALL_ID]a1b2c3d4e[ARGS]{"command": "ls"}'
    first, second = (parser.parse(turn).calls[0].id for _ in range(2))
    assert first == "a1b2c3d4e"
    assert second != first and second.isalnum() and len(second) == 9


# fault: multi-line arguments were dropped (DeepSeek regexes without DOTALL) ----------------

MULTILINE = {"path": "src/app.py", "content": "def main():\n    print('hi')\n"}


@pytest.mark.parametrize(
    "fmt", ["deepseek_v3", "deepseek_v3_1", "kimi_k2", "hermes", "mistral_v11"]
)
def test_multi_line_arguments_parse(fmt: str) -> None:
    pretty = json.dumps(MULTILINE, indent=2)
    raw_newlines = '{"path": "src/app.py", "content": "def main():\n    print(\'hi\')\n"}'
    texts = {
        "deepseek_v3": lambda a: f"{DS_BEGIN}{ds3('write_file', a)}{DS_END}",
        "deepseek_v3_1": lambda a: f"{DS_BEGIN}{ds31('write_file', a)}{DS_END}",
        "kimi_k2": lambda a: f"{K_BEGIN}{kimi('functions.write_file:0', a)}{K_END}",
        "hermes": lambda a: f'<tool_call>{{"name": "write_file", "arguments": {a}}}</tool_call>',
        "mistral_v11": lambda a: f"[TOOL_CALLS]write_file[ARGS]{a}",
    }
    parser = get_parser(fmt)
    for args in (pretty, raw_newlines):
        result = parser.parse(texts[fmt](args))
        assert pairs(result) == [("write_file", MULTILINE)], args
        assert result.errors == []


# fault: JSON quoted in prose was taken as a call (llama3_json) -----------------------------


@pytest.mark.parametrize("fmt", ["llama3_json", "llama4_json"])
@pytest.mark.parametrize(
    "text",
    [
        'To run it, the call looks like {"name": "bash", "parameters": {"command": "ls"}}.',
        'Example:\n```json\n{"name": "bash", "parameters": {"command": "ls"}}\n```',
        '{"name": "Ada Lovelace", "born": 1815}',  # an answer in JSON, not a call
        "{not json at all, just braces}",
    ],
)
def test_llama_json_in_prose_is_content(fmt: str, text: str) -> None:
    result = get_parser(fmt).parse(text)
    assert result.calls == [] and result.errors == []
    assert result.content == text


def test_llama_calls_only_at_the_start_or_after_the_python_tag() -> None:
    parser = get_parser("llama3_json")
    quoted_then_tag = (
        'I will call {"name": "x", "parameters": {}} now.<|python_tag|>'
        '{"name": "bash", "parameters": {"command": "ls -la"}}'
    )
    result = parser.parse(quoted_then_tag)
    assert pairs(result) == [BASH_LS]
    assert result.content == 'I will call {"name": "x", "parameters": {}} now.'
    after_tag = parser.parse('<|python_tag|>{"name": "Ada", "born": 1815}')
    assert after_tag.calls == [] and len(after_tag.errors) == 1


# fault: XML values were guessed instead of typed by the schema -----------------------------

TYPED_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "edit",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "line": {"type": "integer"},
                    "scale": {"type": "number"},
                    "force": {"type": "boolean"},
                    "options": {"type": "object"},
                    "tags": {"type": "array"},
                    "note": {"type": ["string", "null"]},
                },
            },
        },
    }
]
RAW_VALUES = {
    "text": "123",
    "line": "42",
    "scale": "1.5",
    "force": "true",
    "options": '{"dry_run": true}',
    "tags": '["a", "b"]',
    "note": "null",
    "extra": "7",  # not in the schema: stays a string
}
TYPED = {
    "text": "123",
    "line": 42,
    "scale": 1.5,
    "force": True,
    "options": {"dry_run": True},
    "tags": ["a", "b"],
    "note": None,
    "extra": "7",
}


def xml_call(fmt: str, name: str, values: dict[str, str]) -> str:
    if fmt == "qwen3_coder":
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    nl = "\n" if fmt == "glm45" else ""
    args = "".join(
        f"{nl}<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>" for k, v in values.items()
    )
    return f"<tool_call>{name}{args}{nl}</tool_call>"


@pytest.mark.parametrize("fmt", XML_FORMATS)
def test_xml_values_follow_the_schema(fmt: str) -> None:
    result = get_parser(fmt, TYPED_TOOLS).parse(xml_call(fmt, "edit", RAW_VALUES))
    assert result.errors == []
    (call,) = result.calls
    assert call.arguments == TYPED
    assert isinstance(call.arguments["scale"], float)


@pytest.mark.parametrize("fmt", XML_FORMATS)
def test_xml_values_without_a_schema_stay_strings(fmt: str) -> None:
    values = {"line": "42", "force": "true", "options": '{"a": 1}'}
    for tools in (None, TYPED_TOOLS):  # no tools at all; a tool missing from the list
        result = get_parser(fmt, tools).parse(xml_call(fmt, "other_tool", values))
        assert pairs(result) == [("other_tool", values)]


@pytest.mark.parametrize("fmt", XML_FORMATS)
@pytest.mark.parametrize(
    ("param", "raw"),
    [
        ("line", "forty-two"),
        ("line", "4.5"),
        ("scale", "fast"),
        ("force", "yes"),
        ("options", "[1]"),
        ("tags", "{'a': 1}"),
        ("text", "x"),
    ],
)
def test_xml_value_of_the_wrong_type_is_an_error_for_that_call(
    fmt: str, param: str, raw: str
) -> None:
    bad = xml_call(fmt, "edit", {param: raw})
    good = xml_call(fmt, "edit", {"line": "3"})
    result = get_parser(fmt, TYPED_TOOLS).parse(good + "\n" + bad)
    if param == "text":  # a string parameter takes any text
        assert len(result.calls) == 2 and result.errors == []
        return
    assert pairs(result) == [("edit", {"line": 3})]
    (error,) = result.errors
    assert error.name == "edit" and error.raw == bad
    assert f"parameter {param!r} must be" in error.message


def test_qwen3_coder_keeps_inner_newlines_and_tags_in_values() -> None:
    code = "if a < b:\n    print('<parameter=x>')\n\n"
    text = xml_call("qwen3_coder", "edit", {"text": code})
    (call,) = get_parser("qwen3_coder", TYPED_TOOLS).parse(text).calls
    assert call.arguments == {"text": code}


def test_glm_string_values_are_kept_exactly() -> None:
    text = xml_call("glm47", "edit", {"text": "  two spaces\n"})
    (call,) = get_parser("glm47", TYPED_TOOLS).parse(text).calls
    assert call.arguments == {"text": "  two spaces\n"}


def test_qwen3_coder_template_booleans() -> None:
    text = xml_call("qwen3_coder", "edit", {"force": "True"})
    (call,) = get_parser("qwen3_coder", TYPED_TOOLS).parse(text).calls
    assert call.arguments == {"force": True}


# fault: an unterminated call (max tokens) vanished or became content -----------------------

CUT_OFF: dict[str, str] = {
    "hermes": 'Let me write it.\n<tool_call>\n{"name": "write_file", "arguments": {"content": "abc',
    "qwen": '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.py", "content": ',
    "longcat": '<longcat_tool_call>{"name": "write_file", "arguments": {"path"',
    "mistral": '[TOOL_CALLS] [{"name": "write_file", "arguments": {"content": "abc',
    "mistral_v11": '[TOOL_CALLS]write_file[ARGS]{"content": "abc',
    "llama3_json": '{"name": "write_file", "parameters": {"content": "abc',
    "llama4_json": '<|python_tag|>{"name": "write_file", "parameters": {"content": "ab',
    "qwen3_coder": "<tool_call>\n<function=write_file>\n<parameter=content>\nabc",
    "deepseek_v3": f'{DS_BEGIN}{DS_CALL}function{DS_SEP}write_file\n```json\n{{"content": "ab',
    "deepseek_v3_1": f'{DS_BEGIN}{DS_CALL}write_file{DS_SEP}{{"content": "abc"}}',
    "kimi_k2": f'{K_BEGIN}{K_CALL}functions.write_file:0{K_ARGS}{{"content": "ab',
    "glm45": "<tool_call>write_file\n<arg_key>content</arg_key>\n<arg_value>abc",
    "glm47": "<tool_call>write_file<arg_key>content</arg_key><arg_value>abc</arg_value>",
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cut_off_call_is_an_error_not_content(fmt: str) -> None:
    result = get_parser(fmt).parse(CUT_OFF[fmt])
    assert result.calls == []
    (error,) = result.errors
    assert "not finished" in error.message and "token limit" in error.message
    assert error.raw.strip() and error.raw in CUT_OFF[fmt]
    assert result.content in (None, "Let me write it.")


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "glm45", "deepseek_v3_1", "kimi_k2"])
def test_a_cut_off_call_after_good_calls_keeps_them(fmt: str) -> None:
    text = EXAMPLES[fmt][1]
    cut = text + text[: len(text) // 4 * 3]  # the turn repeats, cut inside its second call
    result = get_parser(fmt, TOOLS).parse(cut)
    assert pairs(result)[:2] == [BASH_LS, READ]
    assert len(result.errors) == 1 and "not finished" in result.errors[0].message


def test_hermes_complete_object_missing_only_the_closing_tag_is_a_call() -> None:
    # As vLLM: the arguments are complete, only </tool_call> is missing at the very end.
    text = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}'
    assert pairs(get_parser("hermes").parse(text)) == [BASH_LS]


# render -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_render_writes_what_the_examples_parse_to(fmt: str) -> None:
    parser = get_parser(fmt, TOOLS)
    text = parser.render([BASH_LS, READ], "Let me look around.")
    result = parser.parse(text)
    assert pairs(result) == [BASH_LS, READ]
    assert result.content == "Let me look around."
    assert any(m in text for m in parser.markers)


# smaller decisions ------------------------------------------------------------------------


def test_nan_and_infinity_are_not_json() -> None:
    text = '<tool_call>{"name": "scale", "arguments": {"by": NaN}}</tool_call>'
    result = get_parser("hermes").parse(text)
    assert result.calls == [] and "NaN is not JSON" in result.errors[0].message


def test_arguments_and_parameters_together_are_ambiguous() -> None:
    text = '{"name": "bash", "arguments": {"command": "ls"}, "parameters": {"command": "rm"}}'
    result = get_parser("llama3_json").parse(text)
    assert result.calls == [] and "both" in result.errors[0].message


def test_glm_tolerates_a_literal_backslash_n_between_tags() -> None:
    text = "<tool_call>bash<arg_key>command</arg_key>\\n<arg_value>ls -la</arg_value></tool_call>"
    assert pairs(get_parser("glm47", TOOLS).parse(text)) == [BASH_LS]


def test_unknown_tool_names_are_left_to_the_agent_loop() -> None:
    # The parser checks the shape of a name, not whether the tool exists.
    result = get_parser("hermes", TOOLS).parse(
        '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "two words", "arguments": {}}</tool_call>'
    )
    assert pairs(result) == [("no_such_tool", {})]
    assert "'two words' is not a tool name" in result.errors[0].message


def test_vllm_spelling_of_deepseek_v31_is_the_same_parser() -> None:
    text = (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>terminal<｜tool▁sep｜>"
        '{"command": "ls"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    parsed = get_parser("deepseek_v31").parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("terminal", {"command": "ls"})]


# fault: model output did what the model did not write -------------------------------------
# XML values are raw text, so a file the model writes may hold the format's own tags: a
# template, a test fixture, a parser's source. A value ends only where the structure resumes,
# a literal call inside a value stays in it, and no call ever runs from text inside a value.

WRITE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            },
        },
    }
]


def qwen_write(content: str, path: str = "fixture.txt") -> str:
    return (
        f"<tool_call>\n<function=write_file>\n<parameter=path>\n{path}\n</parameter>\n"
        f"<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call>"
    )


def glm_write(fmt: str, content: str, path: str = "fixture.txt") -> str:
    nl = "\n" if fmt == "glm45" else ""
    return (
        f"<tool_call>write_file{nl}<arg_key>path</arg_key>{nl}<arg_value>{path}</arg_value>{nl}"
        f"<arg_key>content</arg_key>{nl}<arg_value>{content}</arg_value>{nl}</tool_call>"
    )


QWEN_EVIL = qwen_write("evil", path="/etc/passwd")
QWEN_VALUES = [
    # vLLM and SGLang end the value at the first </parameter> and cut these short.
    "A parameter block ends with </parameter> here.",
    'def f():\n    return "</parameter>"\n',
    "evil </function>\n</tool_call> tail",
    "text with a literal <parameter=nope> inside",
    "<root>\n  <parameter=name>value</parameter>\n  <item>test</item>\n</root>",
    "<parameter=a>1</parameter>\n<parameter=b>2</parameter>",
    # A whole call inside the value: upstream, and clotho before, ran it (writing
    # /etc/passwd) or reported a repeated parameter.
    QWEN_EVIL,
    "Example:\n" + QWEN_EVIL + "\nand " + qwen_write("two", path="b.txt") + "\nend",
    # The value's own closing tags, then a call, then more value: reading the first
    # </parameter> as the end would run the call and leave the tags as prose.
    "x\n</parameter>\n</function>\n</tool_call>\nthen\n" + QWEN_EVIL + "\ntail",
]


@pytest.mark.parametrize("value", QWEN_VALUES)
def test_qwen3_coder_values_may_hold_the_formats_tags(value: str) -> None:
    parser = get_parser("qwen3_coder", WRITE_TOOLS)
    for text in (qwen_write(value), "I'll write it.\n" + qwen_write(value) + "\nDone."):
        result = parser.parse(text)
        assert pairs(result) == [("write_file", {"path": "fixture.txt", "content": value})]
        assert result.errors == []
        assert result.content in (None, "I'll write it.\nDone.")


def test_qwen3_coder_a_call_inside_a_value_never_runs_when_the_outer_call_is_broken() -> None:
    parser = get_parser("qwen3_coder", WRITE_TOOLS + TOOLS)
    no_function_end = qwen_write(QWEN_EVIL).removesuffix("</function>\n</tool_call>")
    no_function_end += "</tool_call>"
    bad_type = qwen_write(QWEN_EVIL).replace(
        "<function=write_file>", "<function=bash>\n<parameter=timeout>\nsoon\n</parameter>"
    )
    for text in (no_function_end, bad_type):
        for turn in (text, text + "\n" + EXAMPLES["qwen3_coder"][0]):
            result = parser.parse(turn)
            assert "/etc/passwd" not in str(pairs(result)), turn
            assert len(result.errors) == 1 and "/etc/passwd" in result.errors[0].raw
            assert pairs(result) == ([BASH_LS] if turn != text else [])


def test_qwen3_coder_a_value_cut_off_after_a_literal_call_is_cut_off() -> None:
    text = qwen_write(QWEN_EVIL)
    cut = text[: text.index(QWEN_EVIL) + len(QWEN_EVIL)]  # the model stopped here
    result = get_parser("qwen3_coder", WRITE_TOOLS).parse(cut)
    assert result.calls == []
    (error,) = result.errors
    assert "not finished" in error.message and error.raw == cut


def test_qwen3_coder_parameters_still_end_where_the_next_one_starts() -> None:
    # The usual reading is kept: a value ends at the first </parameter> the structure follows.
    text = (
        "<tool_call>\n<function=write_file>\n<parameter=content>\na\n</parameter>\n"
        "<parameter=path>\nb\n</parameter>\n</function>\n</tool_call>"
    )
    result = get_parser("qwen3_coder", WRITE_TOOLS).parse(text)
    assert pairs(result) == [("write_file", {"content": "a", "path": "b"})]
    # Truly ambiguous: a lone `</parameter>` then `<parameter=NAME>` inside a value. It reads
    # as the next parameter even when NAME is undeclared or given already, so the call fails
    # visibly (unknown arguments are refused by clotho's tools; a repeat is an error here)
    # instead of running with a value the model may not have meant.
    undeclared = get_parser("qwen3_coder", WRITE_TOOLS).parse(
        qwen_write("a\n</parameter>\n<parameter=nope>\nb")
    )
    assert pairs(undeclared) == [
        ("write_file", {"path": "fixture.txt", "content": "a", "nope": "b"})
    ]
    repeated = get_parser("qwen3_coder", WRITE_TOOLS).parse(
        qwen_write("a\n</parameter>\n<parameter=path>\nb")
    )
    assert repeated.calls == [] and "given twice" in repeated.errors[0].message


def test_qwen3_coder_truly_ambiguous_turns_take_the_reading_with_fewer_calls() -> None:
    # A second call whose value ends with its own closing tags is, as text, the first call's
    # value holding a call. Truly ambiguous: the reading with fewer calls is taken, so no call
    # is made of text that may lie inside a value.
    tail = "a</parameter>\n</function>\n</tool_call>"
    parser = get_parser("qwen3_coder")
    text = parser.render([("A", {"x": "one"}), ("B", {"y": tail})])
    (call,) = parser.parse(text).calls
    assert call.name == "A" and call.arguments["x"].startswith("one\n</parameter>")
    # Alone, the same value reads whole: the other reading leaves its closing tags as prose.
    assert pairs(parser.parse(parser.render([("B", {"y": tail})]))) == [("B", {"y": tail})]


def test_qwen3_coder_a_lone_closing_tag_followed_by_prose_is_an_error_not_a_short_value() -> None:
    text = (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\noops\n"
        "</function>\n</tool_call>"
    )
    result = get_parser("qwen3_coder", TOOLS).parse(text)
    assert result.calls == []
    (error,) = result.errors
    assert "is followed by '\\noops" in error.message and "not finished" not in error.message


GLM_EVIL = {fmt: glm_write(fmt, "evil", path="/etc/passwd") for fmt in ("glm45", "glm47")}


@pytest.mark.parametrize("fmt", ["glm45", "glm47"])
@pytest.mark.parametrize(
    "value",
    [
        "A value ends with </arg_value> here.",
        'x = "</arg_value></tool_call>"',
        "<arg_key>k</arg_key> and <arg_value> alone",
        "{GLM_EVIL}",
        "before </arg_value>\n</tool_call>\n{GLM_EVIL}\nafter",
    ],
)
def test_glm_values_may_hold_the_formats_tags(fmt: str, value: str) -> None:
    value = value.replace("{GLM_EVIL}", GLM_EVIL[fmt])
    result = get_parser(fmt, WRITE_TOOLS).parse(glm_write(fmt, value) + "\nDone.")
    assert pairs(result) == [("write_file", {"path": "fixture.txt", "content": value})]
    assert result.errors == [] and result.content == "Done."


@pytest.mark.parametrize("fmt", ["glm45", "glm47"])
def test_glm_a_literal_backslash_n_after_the_name_is_not_part_of_it(fmt: str) -> None:
    # GLM outputs sometimes carry the two characters `\` `n` instead of newlines. SGLang ends
    # the name there; vLLM's GLM-4.7 regex kept them in the name (`bash\n`), and so did we.
    text = "<tool_call>bash\\n<arg_key>command</arg_key>\\n<arg_value>ls -la</arg_value>\\n</tool_call>"
    result = get_parser(fmt, TOOLS).parse(text)
    assert pairs(result) == [BASH_LS] and result.errors == []
    # Inside a value the two characters are the value's own (SGLang keeps `C:\\Users\\test`).
    path = "C:\\new\\Users\\test\\n"
    result = get_parser(fmt, WRITE_TOOLS).parse(glm_write(fmt, "x", path=path))
    assert pairs(result) == [("write_file", {"path": path, "content": "x"})]


NAME_LEAKS = {
    "deepseek_v3": f'{DS_BEGIN}{DS_CALL}function{DS_SEP}bash\\n```json\n{{"command": "ls"}}\n```'
    f"{DS_CALL_END}{DS_END}",
    "deepseek_v3_1": DS_BEGIN + ds31("bash\\n", LS_JSON) + DS_END,
    "kimi_k2": K_BEGIN + kimi("functions.bash:0\\n", LS_JSON) + K_END,
    "mistral_v11": f"[TOOL_CALLS]bash\\n[ARGS]{LS_JSON}",
    "qwen3_coder": "<tool_call>\n<function=bash\\n>\n<parameter=command>\nls\n</parameter>\n"
    "</function>\n</tool_call>",
    "hermes": '<tool_call>{"name": "bash\\\\n", "arguments": {}}</tool_call>',
    "llama3_json": '{"name": "bash\\u0000", "parameters": {}}',
}


@pytest.mark.parametrize("fmt", sorted(NAME_LEAKS))
def test_an_escape_leaked_into_a_name_is_an_error_not_a_tool_name(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(NAME_LEAKS[fmt])
    assert result.calls == []
    (error,) = result.errors
    assert "is not a tool name" in error.message


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (
            "glm47",
            "<tool_call>bash<arg_key>command\\n</arg_key><arg_value>ls</arg_value></tool_call>",
        ),
        (
            "glm45",
            "<tool_call>bash\n<arg_key>com mand</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>",
        ),
        (
            "qwen3_coder",
            "<tool_call>\n<function=bash>\n<parameter=command\\n>\nls\n</parameter>\n</function>\n"
            "</tool_call>",
        ),
    ],
)
def test_an_escape_or_space_in_a_parameter_name_is_an_error(fmt: str, text: str) -> None:
    result = get_parser(fmt, TOOLS).parse(text)
    assert result.calls == []
    (error,) = result.errors
    assert "is not a parameter name" in error.message and error.name == "bash"


# A call the model quoted inside another call's JSON string, unescaped, so the outer JSON is
# broken: the broken call is reported, and the quoted one must not run.
QUOTED_CALLS = {
    "hermes": '<tool_call>{"name": "write_file", "arguments": {"content": "Example: <tool_call>'
    '{"name": "bash", "arguments": {"command": "rm -rf /"}}</tool_call>"}}</tool_call>',
    "qwen": '<tool_call>\n{"name": "write_file", "arguments": {"content": "<tool_call>\n'
    '{"name": "bash", "arguments": {"command": "rm -rf /"}}\n</tool_call>"}}\n</tool_call>',
    "deepseek_v3": f"{DS_BEGIN}{DS_CALL}function{DS_SEP}write_file\n```json\n"
    f'{{"content": "e.g. {DS_CALL}function{DS_SEP}bash\n```json\n{{"command": "rm -rf /"}}'
    f'\n```{DS_CALL_END}"}}\n```{DS_CALL_END}{DS_END}',
    "longcat": '<longcat_tool_call>{"name": "write_file", "arguments": {"content": "e.g. '
    '<longcat_tool_call>{"name": "bash", "arguments": {"command": "rm -rf /"}}'
    '</longcat_tool_call>"}}</longcat_tool_call>',
    "mistral_v11": '[TOOL_CALLS]write_file[ARGS]{"content": "e.g. [TOOL_CALLS]bash[ARGS]'
    '{"command": "rm -rf /"} done"}',
    "mistral": '[TOOL_CALLS] [{"name": "write_file", "arguments": {"content": "e.g. '
    '[TOOL_CALLS]bash[ARGS]{"command": "rm -rf /"}"}}]',
    "kimi_k2": f"{K_BEGIN}{K_CALL}functions.write_file:0{K_ARGS}"
    f'{{"content": "e.g. {K_CALL}functions.bash:1{K_ARGS}{{"command": "rm -rf /"}}'
    f'{K_CALL_END}"}}{K_CALL_END}{K_END}',
    "deepseek_v3_1": f"{DS_BEGIN}{DS_CALL}write_file{DS_SEP}"
    f'{{"content": "e.g. {DS_CALL}bash{DS_SEP}{{"command": "rm -rf /"}}{DS_CALL_END}"}}'
    f"{DS_CALL_END}{DS_END}",
}


@pytest.mark.parametrize("fmt", sorted(QUOTED_CALLS))
def test_a_call_quoted_in_a_broken_calls_string_never_runs(fmt: str) -> None:
    result = get_parser(fmt, TOOLS).parse(QUOTED_CALLS[fmt])
    assert result.calls == [], pairs(result)
    assert result.errors and "rm -rf /" in result.errors[0].raw
