"""`AgentLoop`: ask the model, run the tools it calls in the sandbox, repeat until done.

The model session returns each turn already parsed (`ModelTurn`: content, reasoning, tool
calls with dict arguments); the loop checks the calls against the tools' pydantic models,
runs them, and writes the turn into the conversation in the stored OpenAI format.
Every way a tool call can be wrong (unknown tool, arguments that are not JSON or not an
object, arguments that fail the schema, a tool that fails) is told to the model in the tool
message and recorded as a `ToolErrorRecord`; nothing is silently replaced by `{}`. Model
errors that survive the client's retries stop the run with `stop_reason="model_error"`.
A broken sandbox (`SandboxError`) propagates: it is infrastructure, not the agent's doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from clotho.agent.result import AgentResult, StopReason, ToolErrorRecord, TurnTiming
from clotho.chat.models import ModelSession
from clotho.chat.types import InvalidToolCall, ModelTurn, ToolCall
from clotho.errors import (
    AgentLimit,
    LimitExceeded,
    ModelError,
    SandboxError,
    describe_validation_error,
)
from clotho.tools.runtime import ToolFailure, ToolRuntime
from clotho.tools.tool import Tool


class AgentLimits(BaseModel):
    max_turns: int = 30
    time_limit_s: float | None = None
    max_total_tokens: int | None = None


class _Call:
    """One tool call of a turn, checked before it runs."""

    def __init__(self, call_id: str, name: str, text: str) -> None:
        self.id = call_id
        self.name = name
        self.text = text  # the arguments as the model wrote them
        self.tool: Tool | None = None
        self.arguments: BaseModel | None = None
        self.error: str | None = None


class AgentLoop:
    """Runs one rollout on one model session; a fresh loop (and session) per rollout."""

    def __init__(
        self,
        model: ModelSession,
        tools: Sequence[Tool],
        runtime: ToolRuntime,
        limits: AgentLimits | None = None,
    ) -> None:
        self.model = model
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools] or None
        self.runtime = runtime
        self.limits = limits or AgentLimits()
        self._ids: set[str] = set()

    async def run(
        self, messages: list[dict[str, Any]], into: AgentResult | None = None
    ) -> AgentResult:
        """The run, written into `into` as it goes (so that a caller who stops it early, by
        cancelling or by an error raised from a tool, still holds a well-formed transcript)."""
        result = into if into is not None else AgentResult(messages=[])
        result.messages[:] = [dict(m) for m in messages]
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.limits.time_limit_s):
                result.stop_reason = await self._turns(result)
        except TimeoutError:
            result.stop_reason = "time_limit"
            _close_open_calls(result.messages, "the agent's time limit was reached")
        except BaseException:
            result.stop_reason = "interrupted"
            _close_open_calls(result.messages, "the rollout was stopped")
            with contextlib.suppress(Exception):  # the stop is what the caller must see
                self._finish(result, started)
            raise
        self._finish(result, started)
        return result

    def _finish(self, result: AgentResult, started: float) -> None:
        result.duration_s = time.perf_counter() - started
        result.sequences = self.model.sequences(result.messages)

    async def _turns(self, result: AgentResult) -> StopReason:
        while True:
            if result.turns >= self.limits.max_turns:
                return "max_turns"
            budget = self.limits.max_total_tokens
            if budget is not None and result.usage.total_tokens >= budget:
                return "token_limit"
            try:
                turn = await self.model.complete(result.messages, self.schemas)
            except ModelError as exc:
                result.error = str(exc)
                return "model_error"
            except AgentLimit as exc:  # e.g. the context is full
                result.error = str(exc)
                return "token_limit"
            result.turns += 1
            result.usage = result.usage + turn.usage
            timing = TurnTiming(model_s=turn.latency_s)
            result.timings.append(timing)
            result.reasoning.append(turn.reasoning)
            calls = [self._check(call, result.turns, i) for i, call in enumerate(turn.tool_calls)]
            # Calls a client-side parser could not read: the model is told, the rest still run.
            for invalid in turn.invalid_tool_calls:
                calls.append(self._invalid(invalid, result.turns, len(calls)))
            result.messages.append(_assistant_message(turn, calls))
            if not calls:
                return "finished"
            tools_started = time.perf_counter()
            outputs = await self._dispatch(calls)
            timing.tools_s = time.perf_counter() - tools_started
            result.tool_calls += len(calls)
            for call, (output, failed) in zip(calls, outputs, strict=True):
                result.messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
                if failed:
                    result.tool_errors.append(
                        ToolErrorRecord(
                            turn=result.turns,
                            tool=call.name,
                            arguments=call.text[:500],
                            error=output,
                        )
                    )

    def _unique_id(self, proposed: str | None, turn: int, index: int) -> str:
        call_id = proposed or f"call_{turn}_{index}"
        while call_id in self._ids:  # some servers repeat ids across turns
            call_id = f"{call_id}_{turn}_{index}"
        self._ids.add(call_id)
        return call_id

    def _invalid(self, invalid: InvalidToolCall, turn: int, index: int) -> _Call:
        call = _Call(self._unique_id(None, turn, index), invalid.name or "", invalid.text)
        call.error = f"Error: {invalid.error or 'the tool call could not be parsed'}; nothing ran"
        return call

    def _check(self, model_call: ToolCall, turn: int, index: int) -> _Call:
        name = model_call.name
        call = _Call(self._unique_id(model_call.id, turn, index), name, model_call.text)
        call.tool = self.tools.get(name)
        if call.tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            call.error = f"Error: unknown tool {name!r}. Available tools: {available}"
        elif model_call.arguments is None:  # not a JSON object; the client said why
            call.error = f"Error: {model_call.error}; nothing ran"
        else:
            try:
                call.arguments = call.tool.validate(model_call.arguments)
            except ValidationError as exc:
                call.error = (
                    f"Error: invalid arguments for {name!r}: {describe_validation_error(exc)}; "
                    "nothing ran"
                )
        return call

    async def _dispatch(self, calls: list[_Call]) -> list[tuple[str, bool]]:
        """Run the calls; neighbouring calls of parallel-safe tools run together, in order.

        A batch runs in a `TaskGroup`: a `SandboxError` in one call cancels its siblings and
        propagates (as itself, not wrapped in an exception group).
        """
        outputs: list[tuple[str, bool]] = []
        batch: list[_Call] = []

        async def flush() -> None:
            if not batch:
                return
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(self._invoke(c)) for c in batch]
            except ExceptionGroup as failed:
                raise failed.exceptions[0] from None
            outputs.extend(t.result() for t in tasks)
            batch.clear()

        for call in calls:
            if call.tool is not None and call.tool.parallel and call.error is None:
                batch.append(call)
                continue
            await flush()
            outputs.append(await self._invoke(call))
        await flush()
        return outputs

    async def _invoke(self, call: _Call) -> tuple[str, bool]:
        if call.error is not None or call.tool is None or call.arguments is None:
            return call.error or "Error: invalid call", True
        try:
            return await call.tool.run(self.runtime, call.arguments), False
        except ToolFailure as exc:
            return f"Error: {exc}", True
        except (SandboxError, LimitExceeded):  # the sandbox broke or hit a limit: not the tool's
            raise
        except Exception as exc:
            return f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", True


def _assistant_message(turn: ModelTurn, calls: list[_Call]) -> dict[str, Any]:
    """The turn in the stored OpenAI format: arguments as JSON text, `reasoning_content`."""
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.text}}
            for c in calls
        ]
    if turn.reasoning:
        message["reasoning_content"] = turn.reasoning
    return message


def _close_open_calls(messages: list[dict[str, Any]], reason: str) -> None:
    """Give every unanswered tool call a result so the conversation stays well-formed."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
            for call in message.get("tool_calls") or []:
                if call["id"] not in answered:
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": f"Error: {reason}"}
                    )
            return
