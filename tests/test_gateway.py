"""The model gateway over real HTTP on 127.0.0.1: the wire formats (OpenAI chat through the
real `openai` SDK, Anthropic Messages through httpx), per-trial tokens, limits, usage and the
record. The run's model is `ScriptedOpenAIServer`, the TEST DOUBLE of a hosted endpoint."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import openai
import pytest
from tests.gateway_helpers import REAL_KEY, assert_host_key_only, open_trial, sdk_for
from tests.scripted_openai import (
    HTTPError,
    Reply,
    ScriptedOpenAIServer,
    assistant,
    tool_call,
    usage,
)

from clotho.errors import AgentLimit
from clotho.gateway import Gateway, GatewayLimits, GatewayRecord, GatewayTrial

pytest_plugins = ("tests.gateway_fixtures",)  # scripted, gateway

BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


def _sse_data(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


# --- OpenAI Chat Completions ---------------------------------------------------------------


async def test_openai_tool_call_is_forwarded_answered_and_recorded(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(assistant("let me look", [tool_call("bash", {"cmd": "ls"})]), usage=usage(12, 7)),
        Reply(assistant("done"), usage=usage(30, 2)),
    ]
    trial, listener = await open_trial(gateway)
    sdk = sdk_for(listener, trial)
    first = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "list"}]
    reply = await sdk.chat.completions.create(
        model="gpt-whatever", messages=first, tools=[BASH_TOOL], temperature=0.2
    )
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert message.content == "let me look"
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"cmd": "ls"})
    assert reply.usage is not None and reply.usage.total_tokens == 19

    second = [
        *first,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    reply2 = await sdk.chat.completions.create(model="gpt-whatever", messages=second)
    assert reply2.choices[0].message.content == "done"

    # The model got the conversation in OpenAI form, with the host's key, never the token.
    assert scripted.requests[0]["messages"][0] == {"role": "system", "content": "be brief"}
    assert scripted.requests[0]["tools"] == [BASH_TOOL]
    assert scripted.requests[1]["messages"][-1]["content"] == "a.txt"
    assert_host_key_only(scripted, trial, calls=2)

    record = gateway.close_trial(trial)
    assert record.turns == 2
    assert record.usage.total_tokens == 19 + 32
    assert [e.status for e in record.exchanges] == [200, 200]
    sent = record.exchanges[0]
    assert sent.request["messages"] == first  # exactly as the agent sent it
    assert sent.request["temperature"] == 0.2
    assert sent.forwarded == scripted.requests[0]["messages"]
    assert sent.response is not None
    assert sent.response["choices"][0]["message"]["tool_calls"][0]["id"] == call.id
    assert sent.turn is not None and sent.turn.tool_calls[0].arguments == {"cmd": "ls"}
    assert record.exchanges[1].request["messages"][-1]["tool_call_id"] == call.id
    assert GatewayRecord.model_validate_json(record.model_dump_json()) == record


async def test_openai_stream_carries_the_recorded_reply(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(
            assistant("thinking done", [tool_call("bash", {"cmd": "pwd"})]),
            usage=usage(5, 4),
        )
    ]
    trial, listener = await open_trial(gateway)
    stream = await sdk_for(listener, trial).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": [{"type": "text", "text": "where am I"}]}],
        tools=[BASH_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    content, calls, finish, counted = "", {}, None, None
    async for chunk in stream:
        if chunk.usage is not None:
            counted = chunk.usage.total_tokens
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"id": delta.id, "name": "", "args": ""})
                entry["name"] += delta.function.name or ""
                entry["args"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    record = gateway.close_trial(trial)
    exchange = record.exchanges[0]
    assert exchange.stream is True
    assert exchange.forwarded == [{"role": "user", "content": "where am I"}]
    assert exchange.response is not None
    recorded = exchange.response["choices"][0]
    assert content == recorded["message"]["content"] == "thinking done"
    recorded_call = recorded["message"]["tool_calls"][0]
    assert calls == {
        0: {
            "id": recorded_call["id"],
            "name": "bash",
            "args": recorded_call["function"]["arguments"],
        }
    }
    assert finish == recorded["finish_reason"] == "tool_calls"
    assert counted == 9 == record.usage.total_tokens


# --- Anthropic Messages --------------------------------------------------------------------


async def test_anthropic_messages_with_tools_round_trip(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(assistant("", [tool_call("bash", {"cmd": "cat a"}, id="up_1")]), usage=usage(9, 3)),
        Reply(assistant("the file says hi"), usage=usage(20, 5)),
    ]
    trial, listener = await open_trial(gateway)
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    first = {
        "model": "claude-x",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "you are terse"}],
        "tools": tools,
        "messages": [{"role": "user", "content": "read a"}],
    }
    async with httpx.AsyncClient(base_url=str(listener.url)) as http:
        r1 = await http.post("/v1/messages", json=first, headers={"x-api-key": trial.token})
        assert r1.status_code == 200, r1.text
        reply = r1.json()
        assert reply["stop_reason"] == "tool_use"
        assert reply["usage"] == {"input_tokens": 9, "output_tokens": 3}
        [use] = reply["content"]
        assert (use["type"], use["id"], use["input"]) == ("tool_use", "up_1", {"cmd": "cat a"})
        second = {
            **first,
            "stream": True,
            "messages": [
                *first["messages"],
                {"role": "assistant", "content": reply["content"]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "up_1", "content": "hi"},
                        {"type": "text", "text": "and now?"},
                    ],
                },
            ],
        }
        auth = {"authorization": f"Bearer {trial.token}"}  # ANTHROPIC_AUTH_TOKEN's form
        r2 = await http.post("/v1/messages", json=second, headers=auth)
        assert r2.status_code == 200, r2.text
        assert r2.headers["content-type"].startswith("text/event-stream")
    events = _sse_data(r2.text)
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    streamed = "".join(e["delta"].get("text", "") for e in events if "delta" in e)
    assert streamed == "the file says hi"
    assert events[-2]["delta"]["stop_reason"] == "end_turn"

    # What the model saw: system first, the tool use as a call, the result as a tool message.
    assert scripted.requests[0]["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert scripted.requests[1]["messages"] == [
        {"role": "system", "content": "you are terse"},
        {"role": "user", "content": "read a"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "up_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"cmd": "cat a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "up_1", "content": "hi"},
        {"role": "user", "content": "and now?"},
    ]
    record = gateway.close_trial(trial)
    assert [e.api for e in record.exchanges] == ["anthropic-messages"] * 2
    assert record.exchanges[1].request == second
    assert record.exchanges[1].response is not None
    assert record.exchanges[1].response["content"] == [{"type": "text", "text": "the file says hi"}]
    assert record.usage.total_tokens == 37


# --- tokens --------------------------------------------------------------------------------


async def test_only_the_trials_own_token_reaches_the_model(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.default = assistant("ok")
    trial, listener = await open_trial(gateway)
    other = gateway.open_trial()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(base_url=str(listener.url)) as http:
        for headers in (
            {},
            {"authorization": "Bearer nope"},
            {"authorization": f"Bearer {REAL_KEY}"},
            {"authorization": f"Bearer {other.token}"},  # another trial's, on this trial's socket
        ):
            r = await http.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 401, headers
            assert "token" in r.json()["error"]["message"]
        ok = await http.post("/v1/chat/completions", json=body, headers=_bearer(trial))
        assert ok.status_code == 200
        gateway.close_trial(trial)
        closed = await http.post("/v1/chat/completions", json=body, headers=_bearer(trial))
        assert closed.status_code == 401
        models = await http.get("/v1/models", headers=_bearer(trial))
        assert models.status_code == 401
    assert len(scripted.requests) == 1


def _bearer(trial: GatewayTrial) -> dict[str, str]:
    return {"authorization": f"Bearer {trial.token}"}


# --- limits --------------------------------------------------------------------------------


async def test_turn_limit_refuses_the_next_call_without_forwarding(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.default = assistant("again")
    trial, listener = await open_trial(gateway, GatewayLimits(max_turns=2))
    sdk = sdk_for(listener, trial)
    messages = [{"role": "user", "content": "go"}]
    for _ in range(2):
        await sdk.chat.completions.create(model="m", messages=messages)
    with pytest.raises(openai.AuthenticationError, match=r"model-call limit \(2 calls\)"):
        await sdk.chat.completions.create(model="m", messages=messages)
    assert len(scripted.requests) == 2
    record = trial.record
    assert (record.turns, record.limit) == (2, "turns")
    refused = record.exchanges[-1]
    assert refused.status == 401 and refused.error is not None
    assert (refused.error.kind, refused.error.limit) == ("limit", "turns")
    assert refused.forwarded is None
    limit = trial.agent_limit()
    assert isinstance(limit, AgentLimit) and "model-call limit" in str(limit)


async def test_token_budget_counts_usage_and_refuses_past_it(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [Reply(assistant("a"), usage=usage(60, 10)), Reply(assistant("b"))]
    trial, listener = await open_trial(gateway, GatewayLimits(max_tokens=50))
    async with httpx.AsyncClient(base_url=str(listener.url)) as http:
        body = {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        first = await http.post("/v1/messages", json=body, headers={"x-api-key": trial.token})
        assert first.status_code == 200
        second = await http.post("/v1/messages", json=body, headers={"x-api-key": trial.token})
    assert second.status_code == 401
    assert second.json()["type"] == "error"
    assert "token budget (50 tokens)" in second.json()["error"]["message"]
    assert len(scripted.requests) == 1
    assert trial.record.usage.total_tokens == 70
    assert trial.record.limit == "tokens"


async def test_wall_clock_cuts_a_call_in_flight_and_refuses_later_ones(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    released = threading.Event()

    def never_in_time(body: Any) -> dict[str, Any]:
        released.wait(60)  # answers only once the test is over
        return assistant("too late")

    scripted.script = [never_in_time]
    # 3 s: room for the first call to reach the server on a busy machine before the cut
    trial, listener = await open_trial(gateway, GatewayLimits(timeout_s=3))
    sdk = sdk_for(listener, trial)
    messages = [{"role": "user", "content": "slow"}]
    try:
        with pytest.raises(openai.AuthenticationError, match="time limit"):
            await sdk.chat.completions.create(model="m", messages=messages)
        with pytest.raises(openai.AuthenticationError, match="time limit"):
            await sdk.chat.completions.create(model="m", messages=messages)
    finally:
        released.set()
    assert len(scripted.requests) == 1  # the second call never left the gateway
    errors = [e.error for e in trial.record.exchanges]
    assert all(e is not None and e.limit == "wall_clock" for e in errors)
    assert trial.record.exchanges[0].forwarded == messages  # it was forwarded, then cut
    assert trial.record.exchanges[1].forwarded is None
    assert trial.record.limit == "wall_clock"


# --- failures ------------------------------------------------------------------------------


async def test_a_failing_model_is_a_502_counted_as_infra(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.default = HTTPError(500)
    trial, listener = await open_trial(gateway)
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk_for(listener, trial).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    assert caught.value.status_code == 502
    record = trial.record
    assert record.infra_errors == 1
    assert record.limit is None and trial.agent_limit() is None
    error = record.exchanges[0].error
    assert error is not None and error.kind == "infra"


async def test_bad_requests_are_refused_and_recorded(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    trial, listener = await open_trial(gateway, GatewayLimits(max_request_bytes=4096))
    headers = _bearer(trial)
    async with httpx.AsyncClient(base_url=str(listener.url)) as http:
        huge = {"model": "m", "messages": [{"role": "user", "content": "x" * 10_000}]}
        too_big = await http.post("/v1/chat/completions", json=huge, headers=headers)
        not_json = await http.post("/v1/chat/completions", content=b"{nope", headers=headers)
        image = {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        }
        no_image = await http.post("/v1/chat/completions", json=image, headers=headers)
        server_tool = {
            "model": "c",
            "max_tokens": 5,
            "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "messages": [{"role": "user", "content": "hi"}],
        }
        no_server_tool = await http.post("/v1/messages", json=server_tool, headers=headers)
    assert too_big.status_code == 413
    assert not_json.status_code == 400 and "not JSON" in not_json.json()["error"]["message"]
    assert no_image.status_code == 400 and "'image_url'" in no_image.json()["error"]["message"]
    assert no_server_tool.status_code == 400
    assert "web_search" in no_server_tool.json()["error"]["message"]
    assert scripted.requests == []
    record = trial.record
    assert record.turns == 0
    # The over-size body is never read, so it has no exchange; the others are recorded.
    assert [e.status for e in record.exchanges] == [400, 400, 400]
    assert record.exchanges[0].request == "{nope"
    assert all(e.error is not None and e.error.kind == "agent" for e in record.exchanges)
