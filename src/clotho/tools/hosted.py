"""What the toolsets that call an HTTP API from the host share (`vision`, `web`): the key,
read from the environment variable the config names (it never enters a sandbox), and one
request through a retrying `BalancedPoster` whose failure is the tool's error."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from clotho.chat.http import DEFAULT_MAX_REPLY_BYTES, BalancedPoster
from clotho.errors import ModelError
from clotho.tools.runtime import ToolFailure

T = TypeVar("T")


class HostedApiConfig(Protocol):
    @property
    def base_url(self) -> str | None: ...
    @property
    def api_key_env(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def max_retries(self) -> int: ...


class HostedApi:
    """An API the host calls for a toolset, configured by `config`; `environ` stands in for
    the process environment (tests)."""

    def __init__(self, config: HostedApiConfig, environ: dict[str, str] | None = None) -> None:
        self.config = config
        self._environ = environ

    def _key(self) -> str | None:
        name = self.config.api_key_env
        if not name:
            return None
        return (self._environ if self._environ is not None else os.environ).get(name) or None

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        parse: Callable[[Any], T],
        *,
        failed: str,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> T:
        """The parsed reply to one request (retried as a model request is); a failure is a
        `ToolFailure` that starts with `failed`."""
        config = self.config
        assert config.base_url is not None
        poster = BalancedPoster(
            [config.base_url.rstrip("/")],
            api_key_env=None,
            api_key=self._key(),
            timeout_s=config.timeout_s,
            max_retries=config.max_retries,
            backoff_initial_s=1.0,
            backoff_max_s=10.0,
            unhealthy_cooldown_s=0.0,
            max_reply_bytes=max_reply_bytes,
            request_timeout_s=config.timeout_s * 2,
        )
        try:
            reply, _ = await poster.post(path, body, parse)
        except ModelError as exc:
            raise ToolFailure(f"{failed}: {exc}") from exc
        finally:
            await poster.aclose()
        return reply
