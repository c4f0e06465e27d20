"""ChatClient against the scripted OpenAI-compatible test double (a real HTTP server)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from tests.model_helpers import Held
from tests.scripted_openai import (
    CHAT_PATH,
    HTTPError,
    RawBody,
    Reply,
    ScriptedOpenAIServer,
    assistant,
    chat_client,
    fast_config,
    tool_call,
    unused_url,
    usage,
)
from tests.support import PATIENCE_S, wait_until

from clotho.chat import ChatClient, InvalidToolCall, ModelConfig, SamplingParams, ToolCall, Usage
from clotho.errors import ConfigError, InfraError, ModelError

USER = [{"role": "user", "content": "hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "run a command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


# -- request body and response parsing ---------------------------------------------------------


async def test_the_reply_is_read_once_into_a_model_turn() -> None:
    """Reasoning split off, arguments parsed from their JSON text (kept as written), the
    model's malformed arguments and unreadable calls kept with what is wrong: no retry."""
    calls = [
        tool_call("terminal", '{"command":  "ls"}', id="text"),
        {"id": "obj", "type": "function", "function": {"name": "terminal", "arguments": {"a": 1}}},
        tool_call("terminal", "", id="empty"),
        tool_call("terminal", '{"command": "ls"', id="cut"),
        tool_call("terminal", "[1, 2]", id="list"),
        {"id": "nameless", "type": "function", "function": {"arguments": "{}"}},
        "not a call",
    ]
    message = {"role": "assistant", "content": "<think>plan</think>Running.", "tool_calls": calls}
    with ScriptedOpenAIServer([message]) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            turn = await client.complete(USER, TOOLS)
    assert len(server.requests) == 1
    assert (turn.content, turn.reasoning) == ("Running.", "plan")
    text, obj, empty, cut, listed = turn.tool_calls
    assert text == ToolCall(
        id="text", name="terminal", arguments={"command": "ls"}, text='{"command":  "ls"}'
    )
    assert (obj.arguments, obj.text) == ({"a": 1}, '{"a": 1}')
    assert (empty.arguments, empty.text) == ({}, "")
    assert cut.arguments is None and cut.text == '{"command": "ls"'
    assert cut.error is not None and "the arguments of 'terminal' are not valid JSON" in cut.error
    assert listed.arguments is None and listed.error == (
        "the arguments of 'terminal' must be a JSON object"
    )
    assert [c.text for c in turn.invalid_tool_calls] == [
        '{"id": "nameless", "type": "function", "function": {"arguments": "{}"}}',
        '"not a call"',
    ]
    assert all(isinstance(c, InvalidToolCall) and c.error for c in turn.invalid_tool_calls)
    assert client.session() is client and client.sequences(USER) is None


async def test_request_body_has_model_messages_tools_sampling_and_extra_body() -> None:
    call = tool_call("terminal", {"command": "ls"}, id="call_1")
    with ScriptedOpenAIServer([Reply(assistant("ok", [call]), usage=usage(12, 3))]) as server:
        config = fast_config(
            server.base_url,
            model="my-model",
            sampling=SamplingParams(
                temperature=0.2, top_p=0.9, max_tokens=64, stop=["END"], seed=7, min_p=0.05
            ),
            extra_body={"chat_template_kwargs": {"enable_thinking": True}, "top_k": 20},
        )
        async with chat_client(config) as client:
            response = await client.complete(USER, TOOLS)

    assert server.paths == [CHAT_PATH]
    assert server.requests == [
        {
            "model": "my-model",
            "messages": USER,
            "tools": TOOLS,
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 64,
            "stop": ["END"],
            "seed": 7,
            "min_p": 0.05,  # extra sampling fields are allowed and sent
            "chat_template_kwargs": {"enable_thinking": True},
            "top_k": 20,
        }
    ]
    assert response.content == "ok"
    assert response.tool_calls == [
        ToolCall(
            id="call_1", name="terminal", arguments={"command": "ls"}, text='{"command": "ls"}'
        )
    ]
    assert response.finish_reason == "tool_calls"
    assert response.usage == Usage(prompt_tokens=12, completion_tokens=3, total_tokens=15)
    assert response.model == "scripted-model"
    assert response.latency_s > 0


async def test_unset_sampling_fields_and_empty_tools_are_not_sent() -> None:
    with ScriptedOpenAIServer([assistant("a"), assistant("b")]) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            await client.complete(USER)
            await client.complete(USER, [])
    for body in server.requests:
        assert body == {"model": "scripted-model", "messages": USER, "temperature": 1.0}


async def test_extra_body_overrides_sampling() -> None:
    with ScriptedOpenAIServer([assistant("a")]) as server:
        config = fast_config(
            server.base_url,
            sampling=SamplingParams(temperature=0.7),
            extra_body={"temperature": 0.0},
        )
        async with chat_client(config) as client:
            await client.complete(USER)
    assert server.requests[0]["temperature"] == 0.0


async def test_missing_or_null_usage_counts_as_zero() -> None:
    script = [
        assistant("no usage"),
        Reply(assistant("null fields"), usage={"prompt_tokens": None, "completion_tokens": 4}),
    ]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            first = await client.complete(USER)
            second = await client.complete(USER)
    assert first.usage == Usage()
    assert second.usage == Usage(prompt_tokens=0, completion_tokens=4, total_tokens=0)


async def test_trailing_slash_in_base_url_is_ignored() -> None:
    with ScriptedOpenAIServer([assistant("a")]) as server:
        async with chat_client(fast_config(server.base_url + "/")) as client:
            await client.complete(USER)
    assert server.paths == [CHAT_PATH]


def test_empty_base_url_list_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at least one URL"):
        ChatClient(ModelConfig(model="m", base_url=[]))


# -- authorization ------------------------------------------------------------------------------


async def test_authorization_header_comes_from_the_named_env_var() -> None:
    with ScriptedOpenAIServer([assistant("a")]) as server:
        config = fast_config(server.base_url, api_key_env="MY_PROVIDER_KEY")
        async with chat_client(
            config, environ={"MY_PROVIDER_KEY": "sk-test-123", "OPENAI_API_KEY": "sk-wrong"}
        ) as client:
            await client.complete(USER)
    assert server.headers[0]["authorization"] == "Bearer sk-test-123"


async def test_no_authorization_header_when_the_env_var_is_unset() -> None:
    with ScriptedOpenAIServer([assistant("a")]) as server:
        config = fast_config(server.base_url, api_key_env="MY_PROVIDER_KEY")
        async with chat_client(config, environ={"OPENAI_API_KEY": "sk-other"}) as client:
            await client.complete(USER)
    assert "authorization" not in server.headers[0]


async def test_explicit_api_key_wins_over_the_environment() -> None:
    with ScriptedOpenAIServer([assistant("a")]) as server:
        config = fast_config(server.base_url, api_key_env="MY_PROVIDER_KEY")
        async with chat_client(
            config, api_key="sk-explicit", environ={"MY_PROVIDER_KEY": "sk-env"}
        ) as client:
            await client.complete(USER)
    assert server.headers[0]["authorization"] == "Bearer sk-explicit"


# -- retries ----------------------------------------------------------------------------------


async def test_5xx_is_retried_then_succeeds() -> None:
    script = [HTTPError(500), HTTPError(503), assistant("third time lucky")]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            response = await client.complete(USER, TOOLS)
    assert response.content == "third time lucky"
    assert len(server.requests) == 3
    # Every attempt sends the same request.
    assert server.requests[0] == server.requests[1] == server.requests[2]


async def test_429_is_retried() -> None:
    with ScriptedOpenAIServer([HTTPError(429), assistant("after the rate limit")]) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            response = await client.complete(USER)
    assert response.content == "after the rate limit"
    assert len(server.requests) == 2


async def test_retry_after_is_capped_by_backoff_max() -> None:
    """A server asking for a day's pause gets backoff_max_s (0.05 s): the retry comes long
    before the test's patience runs out, which a day's wait never would."""
    script = [HTTPError(429, headers={"Retry-After": "86400"}), assistant("ok")]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url, backoff_max_s=0.05)) as client:
            async with asyncio.timeout(PATIENCE_S):
                response = await client.complete(USER)
    assert response.content == "ok"
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    "bad",
    [
        RawBody("this is not json"),
        RawBody('{"choices": [{"message": {"role": "assis'),  # cut off
        RawBody("<html>502 Bad Gateway</html>", content_type="text/html"),
        RawBody('{"object": "chat.completion"}'),  # no choices
        RawBody('{"choices": []}'),
        RawBody('{"choices": [{"message": "just text"}]}'),
        RawBody("[]"),
        RawBody('{"choices": [{"message": {"content": "x"}}], "usage": "many"}'),
        RawBody('{"choices": [{"message": {"content": "x"}}], "usage": {"total_tokens": "lots"}}'),
        RawBody('{"choices": [{"message": {"content": "", "tool_calls": {"id": "c"}}}]}'),
    ],
    ids=[
        "not-json",
        "truncated",
        "html",
        "no-choices",
        "empty-choices",
        "message-not-object",
        "json-array",
        "usage-not-object",
        "usage-not-int",
        "tool-calls-not-a-list",
    ],
)
async def test_malformed_body_is_retried(bad: RawBody) -> None:
    with ScriptedOpenAIServer([bad, assistant("well-formed")]) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            response = await client.complete(USER)
    assert response.content == "well-formed"
    assert len(server.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_client_errors_are_not_retried(status: int) -> None:
    script = [HTTPError(status, '{"error": "context length exceeded"}'), assistant("unused")]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url, max_retries=5)) as client:
            with pytest.raises(ModelError, match=f"HTTP {status}") as info:
                await client.complete(USER)
    assert "context length exceeded" in str(info.value)
    assert len(server.requests) == 1
    assert server.remaining == 1


async def test_model_error_after_max_retries() -> None:
    with ScriptedOpenAIServer(default=HTTPError(500, "upstream on fire")) as server:
        async with chat_client(fast_config(server.base_url, max_retries=2)) as client:
            with pytest.raises(ModelError) as info:
                await client.complete(USER)
    assert isinstance(info.value, InfraError)
    assert info.value.kind == "infra"
    assert "after 3 attempts" in str(info.value)
    assert "HTTP 500" in str(info.value) and "upstream on fire" in str(info.value)
    assert len(server.requests) == 3


async def test_model_error_after_only_malformed_bodies() -> None:
    with ScriptedOpenAIServer(default=RawBody("{nope")) as server:
        async with chat_client(fast_config(server.base_url, max_retries=1)) as client:
            with pytest.raises(ModelError, match="malformed response"):
                await client.complete(USER)
    assert len(server.requests) == 2


async def test_connection_errors_are_retried_then_raise_model_error() -> None:
    config = fast_config(unused_url(), max_retries=2)
    async with chat_client(config) as client:
        with pytest.raises(ModelError, match=r"after 3 attempts.*ConnectError"):
            await client.complete(USER)


# -- several endpoints --------------------------------------------------------------------------


async def test_two_endpoints_are_used_round_robin() -> None:
    with (
        ScriptedOpenAIServer(default=assistant("from a")) as a,
        ScriptedOpenAIServer(default=assistant("from b")) as b,
    ):
        async with chat_client(fast_config(a.base_url, b.base_url)) as client:
            answers = [(await client.complete(USER)).content for _ in range(6)]
    assert answers == ["from a", "from b"] * 3
    assert len(a.requests) == 3
    assert len(b.requests) == 3


async def test_dead_endpoint_is_skipped_after_its_failure() -> None:
    with ScriptedOpenAIServer(default=assistant("healthy")) as healthy:
        # No retries: a call that reaches the dead endpoint fails, so every call after the
        # first one succeeding proves that the dead endpoint is no longer tried.
        config = fast_config(unused_url(), healthy.base_url, max_retries=0)
        async with chat_client(config) as client:
            with pytest.raises(ModelError, match="ConnectError"):
                await client.complete(USER)
            answers = [(await client.complete(USER)).content for _ in range(5)]
    assert answers == ["healthy"] * 5
    assert len(healthy.requests) == 5


async def test_dead_endpoint_failure_is_retried_on_the_healthy_one() -> None:
    with ScriptedOpenAIServer(default=assistant("healthy")) as healthy:
        config = fast_config(unused_url(), healthy.base_url)
        async with chat_client(config) as client:
            answers = [(await client.complete(USER)).content for _ in range(5)]
    assert answers == ["healthy"] * 5
    assert len(healthy.requests) == 5


async def test_endpoint_answering_5xx_is_skipped_for_the_cooldown() -> None:
    with (
        ScriptedOpenAIServer(default=HTTPError(502)) as broken,
        ScriptedOpenAIServer(default=assistant("fine")) as fine,
    ):
        config = fast_config(broken.base_url, fine.base_url, unhealthy_cooldown_s=30)
        async with chat_client(config) as client:
            for _ in range(4):
                assert (await client.complete(USER)).content == "fine"
    assert len(broken.requests) == 1
    assert len(fine.requests) == 4


class ClientClock:
    """The `time` module as the endpoint balancer sees it, with a monotonic clock the test
    moves: the cool-down is judged by the client's own clock, not by waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


async def test_dead_endpoint_is_tried_again_after_the_cooldown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = ClientClock()
    monkeypatch.setattr("clotho.chat.http.time", clock)
    with (
        ScriptedOpenAIServer(default=HTTPError(500)) as flaky,
        ScriptedOpenAIServer(default=assistant("fine")) as fine,
    ):
        config = fast_config(flaky.base_url, fine.base_url, unhealthy_cooldown_s=30)
        async with chat_client(config) as client:
            await client.complete(USER)  # flaky's 500, retried on fine
            assert len(flaky.requests) == 1
            clock.now += 29.5
            for _ in range(3):  # cooling down: every call goes to fine
                assert (await client.complete(USER)).content == "fine"
            assert len(flaky.requests) == 1
            clock.now += 1
            await client.complete(USER)  # the cool-down is over: flaky is tried again
    assert len(flaky.requests) == 2


async def test_only_endpoint_is_used_even_while_cooling_down() -> None:
    with ScriptedOpenAIServer([HTTPError(500), assistant("recovered")]) as server:
        config = fast_config(server.base_url, unhealthy_cooldown_s=3600)
        async with chat_client(config) as client:
            response = await client.complete(USER)
    assert response.content == "recovered"
    assert len(server.requests) == 2


# -- timeouts ---------------------------------------------------------------------------------


async def test_request_timeout_is_retried_then_raises_model_error() -> None:
    held = Held()
    with ScriptedOpenAIServer(default=held) as server:
        config = fast_config(server.base_url, timeout_s=0.2, max_retries=1)
        async with chat_client(config) as client:
            try:
                with pytest.raises(ModelError, match="Timeout"):
                    await client.complete(USER)
                # The client gave up on both before either could answer.
                assert await wait_until(lambda: len(server.requests) >= 2)
                assert (len(server.requests), held.answered) == (2, 0)
            finally:
                held.release.set()


async def test_request_timeout_then_a_fast_answer_succeeds() -> None:
    """The held answer never comes in time; the fast one has a generous read timeout."""
    held = Held()
    with ScriptedOpenAIServer([held, assistant("in time")]) as server:
        config = fast_config(server.base_url, timeout_s=10)
        async with chat_client(config) as client:
            try:
                response = await client.complete(USER)
                assert held.answered == 0
            finally:
                held.release.set()
    assert response.content == "in time"
    assert len(server.requests) == 2
