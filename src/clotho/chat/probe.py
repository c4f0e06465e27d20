"""Asking a model endpoint, once before a run, whether it is there at all.

A server that is not running, a wrong host or a refused key fails every request of a run; found
before the first rollout, it is one clear error instead of a run of retried infra errors.
"""

from __future__ import annotations

import asyncio
import os

import httpx

from clotho.errors import ConfigError


async def probe_endpoint(url: str, api_key_env: str | None, timeout_s: float = 15.0) -> None:
    """Raise a ConfigError when nothing answers HTTP at `url` or it refuses the key. Any other
    answer (a 404 from a server without `/models`, a 503 while it warms up) is left to the
    run's own retries."""
    key = os.environ.get(api_key_env) if api_key_env else None
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # Making a client loads the TLS trust store (0.06-0.1 s of CPU): in a worker thread, so the
    # loop goes on; the request stays on the loop, where a cancellation (Ctrl-C) ends it.
    client = await asyncio.to_thread(httpx.AsyncClient, timeout=timeout_s)
    try:
        async with client as http:
            reply = await http.get(f"{url}/models", headers=headers)
    except httpx.TransportError as exc:
        raise ConfigError(
            f"no model server answers at {url} ({type(exc).__name__}: {exc}); "
            "start it, or correct --base-url"
        ) from exc
    if reply.status_code in (401, 403):
        where = f"set {api_key_env}" if api_key_env else "give an API key"
        raise ConfigError(
            f"the model server at {url} refused the request (HTTP {reply.status_code}): {where}"
        )
