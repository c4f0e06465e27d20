"""The gateway tests' fixtures: the run's model (`ScriptedOpenAIServer`, the TEST DOUBLE of a
hosted endpoint) and a gateway in front of it holding the host's key; for the installed
agents, a gateway in front of whichever scripted model a test starts.

A test module loads them with `pytest_plugins = ("tests.gateway_fixtures",)`; it does not import
this module (pytest rewrites its asserts only when it loads it first).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from tests.gateway_helpers import REAL_KEY
from tests.scripted_openai import ScriptedOpenAIServer, fast_config

from clotho.chat import ChatClient
from clotho.gateway import Gateway


@pytest.fixture
def scripted() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer() as server:
        yield server


@pytest.fixture
async def gateway(scripted: ScriptedOpenAIServer) -> AsyncIterator[Gateway]:
    client = ChatClient(fast_config(scripted.base_url, max_retries=1), api_key=REAL_KEY)
    gw = Gateway(client, model_name="scripted-model")
    try:
        yield gw
    finally:
        await gw.aclose()
        await client.aclose()


@pytest.fixture
async def gateway_for() -> AsyncIterator[Callable[[ScriptedOpenAIServer], Gateway]]:
    """`gateway_for(server)`: a gateway to `server` (no provider key), closed after the test."""
    made: list[tuple[Gateway, ChatClient]] = []

    def make(server: ScriptedOpenAIServer) -> Gateway:
        client = ChatClient(fast_config(server.base_url, max_retries=1, api_key_env=None))
        gateway = Gateway(client, model_name="scripted-model")
        made.append((gateway, client))
        return gateway

    yield make
    for gateway, client in made:
        await gateway.aclose()
        await client.aclose()
