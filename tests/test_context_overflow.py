"""A conversation that outgrows the model's context is the agent's failure, on every server's
wording: the run stops with `token_limit` at once (no retry) and is verified and scored,
instead of a `model_error` that eval retries and training drops as infrastructure."""

from __future__ import annotations

import json

import pytest
from tests.scripted_openai import HTTPError, ScriptedOpenAIServer, assistant, tool_call
from tests.test_agent_loop import run_loop

from clotho.chat.overflow import is_context_overflow
from clotho.sandbox import Sandbox

pytest_plugins = ("tests.sandbox_fixtures",)  # sandbox


def error(message: str, **extra: object) -> str:
    return json.dumps({"error": {"message": message, **extra}})


# Replies as each server sends them when the prompt no longer fits.
OVERFLOWS = {
    "openai": (
        400,
        error(
            "This model's maximum context length is 8192 tokens. However, your messages "
            "resulted in 9001 tokens. Please reduce the length of the messages.",
            type="invalid_request_error",
            code="context_length_exceeded",
        ),
    ),
    "vllm": (
        400,
        error(
            "This model's maximum context length is 4096 tokens. However, you requested "
            "4200 tokens (3700 in the messages, 500 in the completion).",
            type="BadRequestError",
        ),
    ),
    "vllm-v1": (
        400,
        error("The decoder prompt (length 5000) is longer than the maximum model length of 4096."),
    ),
    "sglang": (
        400,
        error("The input (5000 tokens) is longer than the model's context length (4096 tokens)."),
    ),
    "llama.cpp": (
        400,
        error(
            "the request exceeds the available context size, try increasing it",
            type="exceed_context_size_error",
            n_prompt_tokens=5000,
            n_ctx=4096,
        ),
    ),
    "clotho serve-model": (
        400,
        error("the prompt has 5000 tokens: it does not fit the context of 4096 tokens with room"),
    ),
    "tgi": (
        422,
        json.dumps(
            {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096"}
        ),
    ),
}

# Client errors that say nothing about the context: still model errors.
OTHER_ERRORS = {
    "unknown model": (404, error("The model `m` does not exist.")),
    "bad request": (400, error("temperature must be between 0 and 2")),
    "server error mentioning context": (500, error("maximum context length cache exhausted")),
}


@pytest.mark.parametrize("server_kind", list(OVERFLOWS))
async def test_an_overflow_stops_the_run_as_the_agents_limit(
    server_kind: str,
    sandbox: Sandbox,
) -> None:
    status, body = OVERFLOWS[server_kind]
    first = assistant("", [tool_call("terminal", {"command": "seq 1 5"})])
    with ScriptedOpenAIServer([first], default=HTTPError(status, body)) as server:
        result = await run_loop(server, sandbox, max_retries=5)
    assert result.stop_reason == "token_limit"
    assert result.error is not None and "exceeds the model's context" in result.error
    assert len(server.requests) == 2  # the turn that fit, then one refusal: never retried
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool"]


@pytest.mark.parametrize("what", list(OTHER_ERRORS))
def test_other_errors_are_not_overflows(what: str) -> None:
    status, body = OTHER_ERRORS[what]
    assert not is_context_overflow(status, body)
    for status, body in OVERFLOWS.values():
        assert is_context_overflow(status, body)
