"""`AgentLoop`: ask the model, run the tools it calls in the sandbox, repeat until done.

Every way a tool call can be wrong (unknown tool, arguments that are not JSON or not an
object, arguments that fail the schema, a tool that fails) is told to the model in the tool
message and recorded as a `ToolErrorRecord`; nothing is silently replaced by `{}`. Model
errors that survive the client's retries stop the run with `stop_reason="model_error"`.
A broken sandbox (`SandboxError`) propagates: it is infrastructure, not the agent's doing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from clotho.agent.result import AgentResult, StopReason, ToolErrorRecord, TurnTiming
from clotho.chat.reasoning import split_reasoning
from clotho.chat.types import ChatResponse
from clotho.errors import AgentLimit, ModelError, SandboxError
from clotho.tools.registry import Tool, describe_validation_error
from clotho.tools.runtime import ToolFailure, ToolRuntime


class ChatModel(Protocol):
    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ChatResponse: ...


class AgentLimits(BaseModel):
    max_turns: int = 30
    time_limit_s: float | None = None
    max_total_tokens: int | None = None


class _Call:
    """One tool call of a turn, checked before it runs."""

    def __init__(self, call_id: str, name: str, raw: str) -> None:
        self.id = call_id
        self.name = name
        self.raw = raw
        self.tool: Tool | None = None
        self.arguments: BaseModel | None = None
        self.error: str | None = None


class AgentLoop:
    def __init__(
        self,
        model: ChatModel,
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

    async def run(self, messages: list[dict[str, Any]]) -> AgentResult:
        result = AgentResult(messages=[dict(m) for m in messages])
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.limits.time_limit_s):
                result.stop_reason = await self._turns(result)
        except TimeoutError:
            result.stop_reason = "time_limit"
            _close_open_calls(result.messages, "the agent's time limit was reached")
        result.duration_s = time.perf_counter() - started
        sequences = getattr(self.model, "sequences", None)
        if callable(sequences):  # a token session: the exact training sequences
            result.sequences = sequences(result.messages)
        return result

    async def _turns(self, result: AgentResult) -> StopReason:
        while True:
            if result.turns >= self.limits.max_turns:
                return "max_turns"
            budget = self.limits.max_total_tokens
            if budget is not None and result.usage.total_tokens >= budget:
                return "token_limit"
            try:
                response = await self.model.complete(result.messages, self.schemas)
            except ModelError as exc:
                result.error = str(exc)
                return "model_error"
            except AgentLimit as exc:  # e.g. the context is full
                result.error = str(exc)
                return "token_limit"
            result.turns += 1
            result.usage = result.usage + response.usage
            timing = TurnTiming(model_s=response.latency_s)
            result.timings.append(timing)
            reasoning, content = split_reasoning(response.message)
            result.reasoning.append(reasoning)
            raw_calls = response.message.get("tool_calls") or []
            calls = [self._check(raw, result.turns, i) for i, raw in enumerate(raw_calls)]
            # Calls a client-side parser could not read: the model is told, the rest still run.
            for raw in response.message.get("invalid_tool_calls") or []:
                calls.append(self._invalid(raw, result.turns, len(calls)))
            assistant: dict[str, Any] = {"role": "assistant", "content": content or ""}
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.raw},
                    }
                    for c in calls
                ]
            if reasoning:
                assistant["reasoning_content"] = reasoning
            result.messages.append(assistant)
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
                            arguments=call.raw[:500],
                            error=output,
                        )
                    )

    def _unique_id(self, proposed: Any, turn: int, index: int) -> str:
        call_id = proposed if isinstance(proposed, str) and proposed else f"call_{turn}_{index}"
        while call_id in self._ids:  # some servers repeat ids across turns
            call_id = f"{call_id}_{turn}_{index}"
        self._ids.add(call_id)
        return call_id

    def _invalid(self, raw: Any, turn: int, index: int) -> _Call:
        raw = raw if isinstance(raw, dict) else {}
        name = raw.get("name") if isinstance(raw.get("name"), str) else ""
        call = _Call(self._unique_id(None, turn, index), name, str(raw.get("raw", "")))
        call.error = (
            f"Error: {raw.get('error') or 'the tool call could not be parsed'}; nothing ran"
        )
        return call

    def _check(self, raw: Any, turn: int, index: int) -> _Call:
        raw = raw if isinstance(raw, dict) else {}
        function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
        name = function.get("name") if isinstance(function.get("name"), str) else ""
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):  # some servers send an object, not JSON text
            arguments = json.dumps(arguments)
        call = _Call(self._unique_id(raw.get("id"), turn, index), name, arguments)
        call.tool = self.tools.get(name)
        if call.tool is None:
            available = ", ".join(sorted(self.tools)) or "none"
            call.error = f"Error: unknown tool {name!r}. Available tools: {available}"
            return call
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            call.error = f"Error: the arguments of {name!r} are not valid JSON ({exc}); nothing ran"
            return call
        if not isinstance(parsed, dict):
            call.error = f"Error: the arguments of {name!r} must be a JSON object; nothing ran"
            return call
        try:
            call.arguments = call.tool.validate(parsed)
        except ValidationError as exc:
            call.error = (
                f"Error: invalid arguments for {name!r}: {describe_validation_error(exc)}; "
                "nothing ran"
            )
        return call

    async def _dispatch(self, calls: list[_Call]) -> list[tuple[str, bool]]:
        """Run the calls; neighbouring calls of parallel-safe tools run together, in order."""
        outputs: list[tuple[str, bool]] = []
        batch: list[_Call] = []

        async def flush() -> None:
            outputs.extend(await asyncio.gather(*(self._invoke(c) for c in batch)))
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
        except (SandboxError, asyncio.CancelledError):
            raise
        except Exception as exc:
            return f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", True


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
