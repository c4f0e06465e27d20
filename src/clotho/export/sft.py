"""SFT export: scored trajectories as supervised fine-tuning data.

Pure functions: which trajectories are kept (`rejection`), the key that finds duplicates
(`trajectory_key`), and the two line formats:

* `chat` — OpenAI chat messages, one conversation per line: `{"messages", "tools"}`, the
  shape OpenAI's fine-tuning files and TRL's conversational datasets take. Assistant turns
  carry `tool_calls: [{id, type: "function", function: {name, arguments}}]` with
  `arguments` as JSON text, each answered by a `tool` message with its `tool_call_id`;
  `reasoning_content` stays on the turn it belongs to (chat templates such as Qwen3's
  render it).
* `sharegpt` — LLaMA-Factory's ShareGPT convention (hiyouga/LLaMA-Factory, data/README.md
  "Sharegpt Format" and src/llamafactory/data/converter.py, formatter.py): `conversations`
  of `{from, value}` with `from` one of system (first only), human, gpt, function_call,
  observation; human/observation on even positions and gpt/function_call on odd ones after
  the system turn, ending on a model turn; `tools` is the tool list as JSON text. A call is
  `{"name", "arguments": {...}}` as JSON text, a list of them for parallel calls (what
  `FunctionFormatter` parses); reasoning is a `<think>` block before the value (its
  `thought_words`); text beside a tool call is dropped and results of parallel calls are
  joined into one observation, as LLaMA-Factory's own OpenAI converter does.

Both carry `tokens` and `masks` when known (masks: the token id where trained, -100
elsewhere, the labels convention) and `metadata` (reward, task, the duplicate key, the
schema version). Exact ledger sequences from a token backend win over a re-tokenization.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clotho.chat.ledger import TokenSequence
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.errors import ClothoError, ErrorInfo, ErrorKind

SftFormat = Literal["chat", "sharegpt"]
ERROR_KINDS: tuple[ErrorKind, ...] = (
    "infra",
    "agent",
    "verifier",
    "task",
    "config",
    "limit",
    "tamper",
)
SCHEMA_VERSION = 1
# Pass threshold of trajectories that carry only a score (groups files): the rollout default.
PASS_REWARD = 1.0


class SftConversionError(ClothoError):
    """A conversation that cannot be written in the format asked for (malformed tool calls,
    roles out of order)."""

    kind: ErrorKind = "config"


class SftOptions(BaseModel):
    """What `--sft-*` flags ask for."""

    model_config = ConfigDict(extra="forbid")

    format: SftFormat = "chat"
    min_reward: float | None = Field(
        None, description="keep reward >= this; None: only passed trajectories"
    )
    keep_all: bool = Field(False, description="keep every trajectory, whatever its reward")
    errors: frozenset[ErrorKind] = Field(
        frozenset(), description="error kinds whose trajectories are kept (none by default)"
    )
    dedup: bool = True
    tokenizer: str | None = Field(
        None, description="tokenizer folder or tokenizer.json with its chat template"
    )


class Trajectory(BaseModel):
    """One rollout, whatever it came from (a run directory, a groups file, a live rollout)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    reward: float | None = None
    passed: bool = False
    error: ErrorInfo | None = None
    sequences: list[TokenSequence] | None = Field(
        None, description="exact training sequences from a token backend's ledger"
    )
    sequences_from: Literal["ledger", "group"] = Field(
        "ledger", description="group: a groups file's rows (ledger or template, as it was made)"
    )
    source: str
    task: str | None = None
    attempt: int | None = None


class SftMetadata(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    source: str
    task: str | None = None
    attempt: int | None = None
    reward: float | None = None
    passed: bool = False
    error: ErrorKind | None = None
    key: str = Field(description="sha256 of the normalized messages and tools: equal = duplicate")
    tokens_from: Literal["ledger", "template", "group"] | None = None
    sequence: int | None = Field(
        None, description="which of the trajectory's token sequences this line holds"
    )
    sequences: int | None = Field(
        None, description="how many (a template that rewrites earlier turns splits one)"
    )


class ChatRecord(BaseModel):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tokens: list[int] | None = None
    masks: list[int] | None = None
    metadata: SftMetadata


ShareGptRole = Literal["system", "human", "gpt", "function_call", "observation"]


class ShareGptTurn(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: ShareGptRole = Field(alias="from")
    value: str


class ShareGptRecord(BaseModel):
    conversations: list[ShareGptTurn]
    tools: str | None = Field(None, description="the tool list as JSON text")
    tokens: list[int] | None = None
    masks: list[int] | None = None
    metadata: SftMetadata


# -- filters ---------------------------------------------------------------------------


def rejection(trajectory: Trajectory, options: SftOptions) -> str | None:
    """Why the trajectory is left out, or None when it is kept."""
    error = trajectory.error
    if error is not None and error.kind not in options.errors:
        return f"{error.kind} error"
    if not trajectory.messages:
        return "no messages (a group with tokens only)"
    if not any(m.get("role") == "assistant" for m in trajectory.messages):
        return "no model turn"
    if options.keep_all:
        return None
    if options.min_reward is not None:
        reward = trajectory.reward
        if reward is None or not math.isfinite(reward) or reward < options.min_reward:
            return "reward below --sft-min-reward"
        return None
    return None if trajectory.passed else "not passed"


# -- normalization -----------------------------------------------------------------------


def _text(value: Any, where: str) -> str:
    """Message content as text: None is empty, a list of text parts is joined."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    raise SftConversionError(f"{where}: content is neither text nor text parts")


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise SftConversionError(f"{where}: a tool call is not an object")
    function = call.get("function")
    call_id = call.get("id")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise SftConversionError(f"{where}: a tool call has no function name")
    if not isinstance(call_id, str) or not call_id:
        raise SftConversionError(f"{where}: a tool call has no id")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):  # an object: the wire form is its JSON text
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def normalize_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation in the OpenAI chat shape with only the fields training uses, checked:
    every tool message answers a call of the assistant turn before it, no call id repeats,
    and every call is answered before the conversation goes on."""
    out: list[dict[str, Any]] = []
    pending: set[str] = set()
    seen: set[str] = set()
    for index, message in enumerate(messages):
        where = f"message {index}"
        if not isinstance(message, dict):
            raise SftConversionError(f"{where} is not an object")
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise SftConversionError(f"{where}: role {role!r} is not system/user/assistant/tool")
        if role != "tool" and pending:
            raise SftConversionError(f"{where}: tool calls {sorted(pending)} were never answered")
        clean: dict[str, Any] = {"role": role, "content": _text(message.get("content"), where)}
        if role == "assistant":
            calls = [_tool_call(c, where) for c in message.get("tool_calls") or []]
            for call in calls:
                if call["id"] in seen:
                    raise SftConversionError(f"{where}: tool call id {call['id']!r} repeats")
                seen.add(call["id"])
                pending.add(call["id"])
            if calls:
                clean["tool_calls"] = calls
            reasoning = message.get("reasoning_content")
            if isinstance(reasoning, str) and reasoning:
                clean["reasoning_content"] = reasoning
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in pending:
                raise SftConversionError(
                    f"{where}: tool message answers {call_id!r}, which no open call has"
                )
            pending.discard(call_id)
            clean["tool_call_id"] = call_id
        out.append(clean)
    return out  # calls of a last assistant turn may stay open: the conversation ends there


def trajectory_key(messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """sha256 of the normalized messages and tools, tool call ids replaced by their order
    (servers make them up at random, so two identical runs differ only there)."""
    order: dict[str, str] = {}
    canonical = []
    for message in messages:
        m = dict(message)
        if "tool_calls" in m:
            m["tool_calls"] = [
                {**c, "id": order.setdefault(c["id"], f"#{len(order)}")} for c in m["tool_calls"]
            ]
        if "tool_call_id" in m:
            m["tool_call_id"] = order.get(m["tool_call_id"], m["tool_call_id"])
        canonical.append(m)
    payload = json.dumps(
        {"messages": canonical, "tools": tools}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(payload.encode()).hexdigest()


# -- ShareGPT ---------------------------------------------------------------------------

_MODEL_TURNS = ("gpt", "function_call")
_OTHER_TURNS = ("human", "observation")


def _think(message: dict[str, Any]) -> str:
    reasoning = message.get("reasoning_content")
    return f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""


def _call_value(call: dict[str, Any]) -> dict[str, Any]:
    """`{"name", "arguments"}` with the arguments as an object; text that is not a JSON
    object stays text (the model wrote it so; the tool message says what went wrong)."""
    raw = call["function"]["arguments"]
    try:
        arguments: Any = json.loads(raw)
    except (ValueError, RecursionError):  # also: nesting too deep to parse
        arguments = raw
    if not isinstance(arguments, dict):
        arguments = raw
    return {"name": call["function"]["name"], "arguments": arguments}


def to_sharegpt(messages: Sequence[dict[str, Any]]) -> list[ShareGptTurn]:
    """Normalized chat messages as ShareGPT turns (see the module docstring for the rules)."""
    turns: list[ShareGptTurn] = []
    body = list(messages)
    if body and body[0]["role"] == "system":
        turns.append(ShareGptTurn(from_="system", value=body.pop(0)["content"]))
    observations: list[str] = []
    conversation: list[ShareGptTurn] = []

    def flush() -> None:
        if observations:
            value = "\n</tool_response>\n<tool_response>\n".join(observations)
            conversation.append(ShareGptTurn(from_="observation", value=value))
            observations.clear()

    for index, message in enumerate(body):
        role = message["role"]
        if role == "tool":
            observations.append(message["content"])
            continue
        flush()
        if role == "system":
            raise SftConversionError(f"message {index}: ShareGPT has a system turn only first")
        if role == "user":
            conversation.append(ShareGptTurn(from_="human", value=message["content"]))
        elif message.get("tool_calls"):
            calls = [_call_value(c) for c in message["tool_calls"]]
            value = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
            conversation.append(ShareGptTurn(from_="function_call", value=_think(message) + value))
        else:
            conversation.append(
                ShareGptTurn(from_="gpt", value=_think(message) + message["content"])
            )
    flush()
    while conversation and conversation[-1].from_ in _OTHER_TURNS:
        conversation.pop()  # results after the last model turn: nothing to learn from them
    if not conversation:
        raise SftConversionError("no model turn to train on")
    for position, turn in enumerate(conversation):
        allowed = _OTHER_TURNS if position % 2 == 0 else _MODEL_TURNS
        if turn.from_ not in allowed:
            raise SftConversionError(
                f"ShareGPT turn {position} is {turn.from_}, where {' or '.join(allowed)} must be"
            )
    return turns + conversation


# -- records -----------------------------------------------------------------------------

TokenRows = list[tuple[list[int], list[int]]]
TokensFrom = Literal["ledger", "template", "group"]


def token_rows(
    trajectory: Trajectory,
    messages: list[dict[str, Any]],
    tokenizer: TemplateTokenizer | None,
) -> tuple[TokenRows, TokensFrom | None]:
    """Token sequences and masks: the ledger's exact ones when the rollout has them, else the
    chat template's rendering when a tokenizer is given, else none."""
    if trajectory.sequences is not None:
        rows = [(s.tokens, s.masks) for s in trajectory.sequences if s.tokens]
        if rows:
            return rows, trajectory.sequences_from
    if tokenizer is not None:
        tokens, masks = tokenizer.tokens_and_masks(messages, tools=trajectory.tools)
        return [(tokens, masks)], "template"
    return [], None


def build_records(
    trajectory: Trajectory,
    options: SftOptions,
    tokenizer: TemplateTokenizer | None = None,
    *,
    messages: list[dict[str, Any]] | None = None,
    key: str | None = None,
) -> list[ChatRecord | ShareGptRecord]:
    """The lines of one kept trajectory: one, or one per token sequence when its chat
    template split it (each with the whole conversation and `metadata.sequence`)."""
    messages = messages if messages is not None else normalize_messages(trajectory.messages)
    key = key or trajectory_key(messages, trajectory.tools)
    conversations = to_sharegpt(messages) if options.format == "sharegpt" else None
    rows, tokens_from = token_rows(trajectory, messages, tokenizer)
    meta = SftMetadata(
        source=trajectory.source,
        task=trajectory.task,
        attempt=trajectory.attempt,
        reward=trajectory.reward,
        passed=trajectory.passed,
        error=trajectory.error.kind if trajectory.error else None,
        key=key,
        tokens_from=tokens_from,
    )
    variants: list[tuple[list[int] | None, list[int] | None, SftMetadata]] = [(None, None, meta)]
    if rows:
        many = len(rows) > 1
        variants = [
            (
                tokens,
                masks,
                meta.model_copy(update={"sequence": i, "sequences": len(rows)}) if many else meta,
            )
            for i, (tokens, masks) in enumerate(rows)
        ]
    records: list[ChatRecord | ShareGptRecord] = []
    for tokens, masks, line_meta in variants:
        if conversations is not None:
            tools_text = json.dumps(trajectory.tools) if trajectory.tools else None
            records.append(
                ShareGptRecord(
                    conversations=conversations,
                    tools=tools_text,
                    tokens=tokens,
                    masks=masks,
                    metadata=line_meta,
                )
            )
        else:
            records.append(
                ChatRecord(
                    messages=messages,
                    tools=trajectory.tools or None,
                    tokens=tokens,
                    masks=masks,
                    metadata=line_meta,
                )
            )
    return records


def record_line(record: ChatRecord | ShareGptRecord) -> str:
    """One JSONL line. Absent tools/tokens are left out; ASCII-only, so no character in the
    data (U+2028, NEL, a lone surrogate) can split a line for a reader or fail to encode."""
    data = record.model_dump(mode="json", by_alias=True)
    for name in ("tools", "tokens", "masks"):
        if data.get(name) is None:
            data.pop(name, None)
    return json.dumps(data, ensure_ascii=True, separators=(",", ":")) + "\n"
