"""The gateway's OpenAI Responses API over real HTTP on 127.0.0.1, driven by the real `openai`
SDK (`client.responses.create`, whole and streamed): function tools and function_call items
forwarded to the run's model as a chat conversation, the reply recorded as the agent got it,
`previous_response_id` served from the trial's own responses. The run's model is
`ScriptedOpenAIServer`, the TEST DOUBLE of a hosted endpoint."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from tests.gateway_helpers import assert_host_key_only, open_trial, sdk_for
from tests.scripted_openai import Reply, ScriptedOpenAIServer, assistant, tool_call, usage

from clotho.gateway import Gateway, GatewayLimits, GatewayRecord, GatewayTrial, Listener

pytest_plugins = ("tests.gateway_fixtures",)  # scripted, gateway

SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
FORWARDED_TOOL = {
    "type": "function",
    "function": {
        "name": "shell",
        "parameters": SHELL_TOOL["parameters"],
        "description": "run a command",
    },
}


async def _sdk(
    gateway: Gateway, limits: GatewayLimits | None = None
) -> tuple[GatewayTrial, Listener, openai.AsyncOpenAI]:
    trial, listener = await open_trial(gateway, limits)
    return trial, listener, sdk_for(listener, trial)


async def test_function_call_round_trip_is_forwarded_and_recorded(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(assistant("let me look", [tool_call("shell", {"cmd": "ls"})]), usage=usage(12, 7)),
        Reply(assistant("there is a.txt"), usage=usage(30, 4)),
    ]
    trial, _, sdk = await _sdk(gateway)
    first_input: list[Any] = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list"}]},
    ]
    reply = await sdk.responses.create(
        model="gpt-whatever",
        instructions="you are a coding agent",
        input=first_input,
        tools=[SHELL_TOOL],  # type: ignore[list-item]
        temperature=0.2,
        store=False,
    )
    assert reply.status == "completed"
    assert reply.output_text == "let me look"
    calls = [item for item in reply.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("shell", {"cmd": "ls"})]
    assert reply.usage is not None and reply.usage.total_tokens == 19

    # The agent sends back the whole history, its call, and the call's output (store=False).
    second_input = [
        *first_input,
        *[item.model_dump(exclude_none=True) for item in reply.output],
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "a.txt"},
    ]
    reply2 = await sdk.responses.create(
        model="gpt-whatever", instructions="you are a coding agent", input=second_input,
        tools=[SHELL_TOOL],  # type: ignore[list-item]
    )  # fmt: skip
    assert reply2.output_text == "there is a.txt"
    assert [item.type for item in reply2.output] == ["message"]

    # The model got one chat conversation: instructions first, the call and its output paired.
    assert scripted.requests[0]["messages"] == [
        {"role": "system", "content": "you are a coding agent"},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "list"},
    ]
    assert scripted.requests[0]["tools"] == [FORWARDED_TOOL]
    sent = scripted.requests[1]["messages"]
    assert sent[3]["role"] == "assistant" and sent[3]["content"] == "let me look"
    assert sent[3]["tool_calls"][0]["id"] == calls[0].call_id
    assert sent[4] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "a.txt"}
    assert_host_key_only(scripted, trial, calls=2)

    record = gateway.close_trial(trial)
    assert [e.api for e in record.exchanges] == ["openai-responses"] * 2
    assert [e.path for e in record.exchanges] == ["/v1/responses"] * 2
    assert record.turns == 2 and record.usage.total_tokens == 19 + 34
    exchange = record.exchanges[0]
    assert exchange.request["input"] == first_input and exchange.request["temperature"] == 0.2
    assert exchange.forwarded == scripted.requests[0]["messages"]
    assert exchange.response is not None and exchange.response["id"] == reply.id
    assert exchange.response["output"][1]["call_id"] == calls[0].call_id
    assert GatewayRecord.model_validate_json(record.model_dump_json()) == record


async def test_a_stream_carries_the_recorded_response(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(
            assistant("on it", [tool_call("shell", {"cmd": "pwd"}), tool_call("shell", {})],
                      reasoning_content="the user wants the folder"),
            usage=usage(5, 4),
        )
    ]  # fmt: skip
    trial, _, sdk = await _sdk(gateway)
    stream = await sdk.responses.create(
        model="m", input="where am I", tools=[SHELL_TOOL], stream=True,  # type: ignore[list-item]
    )  # fmt: skip
    kinds: list[str] = []
    text, arguments, numbers = "", {}, []
    final = None
    async for event in stream:
        kinds.append(event.type)
        numbers.append(event.sequence_number)
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            arguments[event.item_id] = arguments.get(event.item_id, "") + event.delta
        elif event.type == "response.completed":
            final = event.response
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and numbers == list(range(len(kinds)))
    assert kinds.count("response.output_item.added") == 4  # reasoning, message, two calls
    assert kinds.count("response.output_item.done") == 4
    assert final is not None and final.output_text == text == "on it"

    record = gateway.close_trial(trial)
    exchange = record.exchanges[0]
    assert exchange.stream is True
    assert exchange.forwarded == [{"role": "user", "content": "where am I"}]
    assert exchange.response == final.model_dump(exclude_unset=True, mode="json")
    recorded_calls = [i for i in exchange.response["output"] if i["type"] == "function_call"]
    assert arguments == {c["id"]: c["arguments"] for c in recorded_calls}
    assert [json.loads(c["arguments"]) for c in recorded_calls] == [{"cmd": "pwd"}, {}]
    assert exchange.response["output"][0]["summary"][0]["text"] == "the user wants the folder"
    assert record.usage.total_tokens == 9 == final.usage.total_tokens  # type: ignore[union-attr]


async def test_previous_response_id_continues_the_trials_conversation(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [
        Reply(assistant("", [tool_call("shell", {"cmd": "id"})])),
        Reply(assistant("you are root")),
    ]
    trial, _, sdk = await _sdk(gateway)
    first = await sdk.responses.create(
        model="m", instructions="old rules", input="who am I",
        tools=[SHELL_TOOL],  # type: ignore[list-item]
    )  # fmt: skip
    [call] = [item for item in first.output if item.type == "function_call"]
    assert [item.type for item in first.output] == ["function_call"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "uid=0(root)"}
    second = await sdk.responses.create(
        model="m", instructions="new rules", previous_response_id=first.id, input=[output],
    )  # fmt: skip
    assert second.output_text == "you are root"
    # Only the new instructions (the API's rule); the earlier turns as the model saw them.
    assert [m["role"] for m in scripted.requests[1]["messages"]] == [
        "system", "user", "assistant", "tool",
    ]  # fmt: skip
    assert scripted.requests[1]["messages"][0]["content"] == "new rules"
    assert scripted.requests[1]["messages"][2]["tool_calls"][0]["id"] == call.call_id

    # An id this trial never answered is the agent's error, never forwarded.
    with pytest.raises(openai.BadRequestError, match="no such response"):
        await sdk.responses.create(model="m", previous_response_id="resp_nope", input="hi")
    record = gateway.close_trial(trial)
    assert len(scripted.requests) == 2
    assert [e.status for e in record.exchanges] == [200, 200, 400]
    assert record.exchanges[2].error is not None and record.exchanges[2].error.kind == "agent"


async def test_hosted_tools_are_left_out_namespaces_opened_and_images_refused(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    """What codex sends: a hosted web search (left out: no tool of the run's model), a
    `namespace` of functions (forwarded by name; a call of one names its namespace back)."""
    spawn = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
    namespace = {"type": "namespace", "name": "multi_agent", "tools": [spawn]}
    scripted.script = [Reply(assistant("", [tool_call("spawn_agent", {})]))]
    trial, listener, sdk = await _sdk(gateway)
    tools: list[Any] = [{"type": "web_search"}, namespace, SHELL_TOOL]
    reply = await sdk.responses.create(model="m", input="hi", tools=tools)
    forwarded = {"type": "function", "function": {"name": "spawn_agent",
                                                  "parameters": {"type": "object"}}}  # fmt: skip
    assert scripted.requests[0]["tools"] == [forwarded, FORWARDED_TOOL]
    [item] = reply.output
    assert item.type == "function_call" and item.name == "spawn_agent"
    recorded = trial.record.exchanges[0].response
    assert recorded is not None and recorded["output"][0]["namespace"] == "multi_agent"
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    with pytest.raises(openai.BadRequestError, match="only text content"):
        await sdk.responses.create(
            model="m",
            input=[{"role": "user", "content": [image]}],  # type: ignore[list-item]
        )
    # Another trial's token is refused before anything is read.
    async with httpx.AsyncClient(base_url=str(listener.url)) as http:
        refused = await http.post("/v1/responses", json={"input": "hi"},
                                  headers={"authorization": "Bearer clotho-gw-guess"})  # fmt: skip
    assert refused.status_code == 401 and "unknown" in refused.json()["error"]["message"]
    assert len(scripted.requests) == 1
    assert [e.status for e in gateway.close_trial(trial).exchanges] == [200, 400]


async def test_the_turn_budget_refuses_a_responses_call(
    gateway: Gateway, scripted: ScriptedOpenAIServer
) -> None:
    scripted.script = [Reply(assistant("one"))]
    trial, _, sdk = await _sdk(gateway, GatewayLimits(max_turns=1))
    await sdk.responses.create(model="m", input="first")
    with pytest.raises(openai.AuthenticationError, match="model-call limit"):
        await sdk.responses.create(model="m", input="second")
    record = gateway.close_trial(trial)
    assert record.limit == "turns" and len(scripted.requests) == 1
