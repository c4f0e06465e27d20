"""What the gateway tests share: a trial reached over real HTTP on 127.0.0.1 through the real
`openai` SDK, and what the run's model (`ScriptedOpenAIServer`, the TEST DOUBLE of a hosted
endpoint) may have seen. The fixtures are in tests/gateway_fixtures.py."""

from __future__ import annotations

import json

import openai
from tests.scripted_openai import ScriptedOpenAIServer

from clotho.gateway import Gateway, GatewayLimits, GatewayTrial, Listener

# The provider's key: the model must get it, a sandbox never.
REAL_KEY = "sk-real-provider-key-never-in-a-sandbox"


async def open_trial(
    gateway: Gateway, limits: GatewayLimits | None = None
) -> tuple[GatewayTrial, Listener]:
    """A trial and the TCP listener its agent reaches it on."""
    trial = gateway.open_trial(limits)
    return trial, await gateway.listen_tcp(trial=trial)


def sdk_for(listener: Listener, trial: GatewayTrial) -> openai.AsyncOpenAI:
    """The real `openai` SDK pointed at the trial, with its token and no retries of its own."""
    assert listener.url is not None
    return openai.AsyncOpenAI(base_url=listener.url + "/v1", api_key=trial.token, max_retries=0)


def assert_host_key_only(scripted: ScriptedOpenAIServer, trial: GatewayTrial, calls: int) -> None:
    """The model got the host's key on each of `calls` requests, never the trial's token."""
    sent = [h["authorization"] for h in scripted.headers]
    assert sent == [f"Bearer {REAL_KEY}"] * calls, sent
    seen = json.dumps(scripted.requests) + json.dumps(scripted.headers)
    assert trial.token not in seen, "the trial's token reached the model"
