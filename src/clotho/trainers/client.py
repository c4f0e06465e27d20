"""`AtroposClient`: an environment's side of the trajectory API (ours or upstream `run-api`).

- `register_env` retries until the server is up and a trainer has started (upstream answers
  "wait for trainer to start" until the trainer's first `/batch`), up to
  `register_timeout_s`.
- `send_groups` posts one group to `/scored_data` or several to `/scored_data_list`, gzipped
  when the body is large and compression pays (as upstream's client does).
- `wait_for_room` holds a producer back while `/status-env` says the queue already holds
  `max_batches_offpolicy` batches (upstream's pause rule), then lets it go.
- After registering, a background heartbeat polls `/status-env` whenever the client has been
  quiet for `heartbeat_s`, so a server that expires silent environments (ours) knows a slow
  agentic rollout is not a dead environment.
- `disconnect_env` (also on `async with` exit) gives the environment's share back.

Connection errors and 5xx are retried with backoff; what survives the retries, and any 4xx,
is a `TrainerError`.

Authentication: `token` is sent as `Authorization: Bearer <token>` on every request; a token
in the URL (`http://clotho:<token>@host:8000`, the form upstream Atropos clients use) is
taken from there and left out of the URL. Upstream `run-api` ignores the header.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from clotho.env.scored import ScoredGroup
from clotho.errors import TrainerError
from clotho.trainers.protocol import (
    OFF_LOOP_BYTES,
    WAIT_FOR_TRAINER,
    GroupLike,
    Info,
    RegisterEnv,
    RegisterEnvResponse,
    ScoredDataListResponse,
    ScoredDataResponse,
    StatusEnv,
    to_wire,
)

log = logging.getLogger(__name__)

_GROUPS = TypeAdapter(list[ScoredGroup])


class ApiClientConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = "http://localhost:8000"
    token: SecretStr | None = Field(
        None, description="sent as 'Authorization: Bearer'; or put it in the url's user info"
    )
    timeout_s: float = Field(60.0, gt=0, description="per request")
    register_timeout_s: float = Field(
        600.0, ge=0, description="how long register_env waits for the server and a trainer"
    )
    register_poll_s: float = Field(1.0, gt=0)
    max_retries: int = Field(3, ge=0, description="retries of a request on 5xx / connection errors")
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 10.0
    gzip_min_bytes: int = Field(1024, ge=0, description="bodies this large are gzipped if smaller")
    max_batches_offpolicy: int = Field(
        3, description="pause producing while the queue holds this many batches; <= 0: never"
    )
    backpressure_poll_s: float = Field(0.5, gt=0)
    heartbeat_s: float = Field(
        10.0, ge=0, description="poll status-env when idle this long; 0 = off"
    )


class _Retryable(Exception):
    pass


class _NotStarted(Exception):
    pass


def _compress(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=6)


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        return str(body.get("message") or body.get("detail") or body)[:500]
    return str(body)[:500]


class AtroposClient:
    def __init__(
        self, config: ApiClientConfig | None = None, *, http: httpx.AsyncClient | None = None
    ) -> None:
        """`http`: a shared connection pool to use (and close) instead of a new one."""
        self.config = config or ApiClientConfig()
        url = httpx.URL(self.config.url)
        token = self.config.token.get_secret_value() if self.config.token else None
        token = token or url.password or url.username or None
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._base = str(url.copy_with(username=None, password=None)).rstrip("/")
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(self.config.timeout_s, connect=min(10.0, self.config.timeout_s))
        )
        self.request: RegisterEnv | None = None
        self.registered: RegisterEnvResponse | None = None
        self.trainer_info: Info | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._last_contact = 0.0

    @property
    def env_id(self) -> int | None:
        return self.registered.env_id if self.registered else None

    # --- transport ----------------------------------------------------------------------

    async def _encode(self, data: bytes) -> tuple[bytes, dict[str, str]]:
        headers = {"Content-Type": "application/json"}
        if len(data) < self.config.gzip_min_bytes:
            return data, headers
        if len(data) > OFF_LOOP_BYTES:
            packed = await asyncio.to_thread(_compress, data)
        else:
            packed = _compress(data)
        if len(packed) >= len(data):
            return data, headers
        return packed, {**headers, "Content-Encoding": "gzip"}

    async def _send(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Any:
        try:
            response = await self._http.request(
                method, self._base + path, content=body, headers={**headers, **self._auth}
            )
        except httpx.TransportError as exc:
            raise _Retryable(f"{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise _Retryable(f"{path}: HTTP {response.status_code}: {_error_text(response)}")
        if response.status_code >= 400:
            raise TrainerError(
                f"{self._base}{path}: HTTP {response.status_code}: {_error_text(response)}"
            )
        try:
            return response.json()
        except ValueError as exc:
            raise _Retryable(f"{path}: not JSON: {response.text[:200]}") from exc

    async def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        """One request with retries on connection errors and 5xx."""
        attempts = self.config.max_retries + 1
        headers: dict[str, str] = {}
        if body is not None:
            body, headers = await self._encode(body)
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=wait_exponential(
                    multiplier=self.config.backoff_initial_s, max=self.config.backoff_max_s
                ),
                retry=retry_if_exception_type(_Retryable),
                reraise=True,
            ):
                with attempt:
                    return await self._send(method, path, body, headers)
        except _Retryable as exc:
            raise TrainerError(
                f"trajectory API at {self._base} failed after {attempts} attempts: {exc}"
            ) from exc
        raise AssertionError("unreachable")

    # --- registration -------------------------------------------------------------------

    async def register_env(self, request: RegisterEnv) -> RegisterEnvResponse:
        """Register, waiting while the server is down or no trainer has started yet."""
        body, headers = await self._encode(request.model_dump_json().encode())
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_delay(self.config.register_timeout_s),
                wait=wait_fixed(self.config.register_poll_s),
                retry=retry_if_exception_type((_Retryable, _NotStarted)),
                reraise=True,
            ):
                with attempt:
                    reply = RegisterEnvResponse.model_validate(
                        await self._send("POST", "/register-env", body, headers)
                    )
                    if reply.status == WAIT_FOR_TRAINER:
                        raise _NotStarted(WAIT_FOR_TRAINER)
        except (_Retryable, _NotStarted) as exc:
            raise TrainerError(
                f"could not register with the trajectory API at {self._base} within "
                f"{self.config.register_timeout_s:.0f} s: {exc}"
            ) from exc
        if reply.status != "success" or reply.env_id is None:
            raise TrainerError(f"register-env answered {reply.model_dump(exclude_none=True)}")
        self.request, self.registered = request, reply
        self._last_contact = time.monotonic()
        self.trainer_info = await self.server_info()
        self._start_heartbeat()
        log.info("registered as %s (env_id %s)", reply.wandb_name, reply.env_id)
        return reply

    async def server_info(self) -> Info:
        return Info.model_validate(await self._call("GET", "/info"))

    async def disconnect_env(self) -> None:
        """Give this environment's share back; the server keeps its queued groups."""
        self._stop_heartbeat()
        env_id = self.env_id
        if env_id is None:
            return
        self.registered = None
        reply = await self._call("POST", "/disconnect-env", f'{{"env_id":{env_id}}}'.encode())
        if reply.get("status") != "success":
            raise TrainerError(f"disconnect-env {env_id} answered {reply}")

    # --- backpressure -------------------------------------------------------------------

    def _require_env_id(self) -> int:
        if self.env_id is None:
            raise TrainerError("the environment is not registered: call register_env first")
        return self.env_id

    async def status_env(self) -> StatusEnv:
        """`GET /status-env` with a JSON body, as upstream servers require."""
        body = f'{{"env_id":{self._require_env_id()}}}'.encode()
        status = StatusEnv.model_validate(await self._call("GET", "/status-env", body))
        self._last_contact = time.monotonic()
        return status

    def queue_full(self, status: StatusEnv) -> bool:
        """Upstream's pause rule: the queue holds `max_batches_offpolicy` batches already,
        unless this environment has a minimum share that its own queued groups do not cover."""
        limit = self.config.max_batches_offpolicy
        batch_size = self.trainer_info.batch_size if self.trainer_info else -1
        if limit <= 0 or batch_size <= 0 or self.request is None:
            return False
        group_size = self.request.group_size
        if status.queue_size * group_size < limit * batch_size:
            return False
        minimum = self.request.min_batch_allocation
        return minimum is None or status.self_queue_size * group_size >= int(batch_size * minimum)

    async def wait_for_room(self) -> StatusEnv:
        """Return once the queue has room for more groups (at once if it has)."""
        while True:
            status = await self.status_env()
            if not self.queue_full(status):
                return status
            await asyncio.sleep(self.config.backpressure_poll_s)

    # --- data ---------------------------------------------------------------------------

    async def send_groups(
        self, groups: Sequence[GroupLike]
    ) -> ScoredDataResponse | ScoredDataListResponse:
        """Post groups: one to `/scored_data`, several to `/scored_data_list`."""
        if not groups:
            raise ValueError("send_groups needs at least one group")
        if len(groups) == 1:
            return await self.send_group(groups[0])
        wire = _GROUPS.dump_json(
            [to_wire(group, self.env_id) for group in groups],
            exclude={"__all__": {"schema_version"}},
        )
        reply = ScoredDataListResponse.model_validate(
            await self._call("POST", "/scored_data_list", wire)
        )
        self._last_contact = time.monotonic()
        return reply

    async def send(self, group: GroupLike) -> None:
        """One group to the trainer (the `GroupSink` call environments' drivers make)."""
        await self.send_group(group)

    async def send_group(self, group: GroupLike) -> ScoredDataResponse:
        wire = to_wire(group, self.env_id).wire_json()
        reply = ScoredDataResponse.model_validate(await self._call("POST", "/scored_data", wire))
        self._last_contact = time.monotonic()
        return reply

    # --- heartbeat and shutdown ----------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._stop_heartbeat()
        if self.config.heartbeat_s > 0:
            self._heartbeat = asyncio.create_task(self._beat(), name="atropos-heartbeat")

    def _stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def _beat(self) -> None:
        interval = self.config.heartbeat_s
        while True:
            quiet = time.monotonic() - self._last_contact
            if quiet < interval:
                await asyncio.sleep(interval - quiet)
                continue
            try:
                await self.status_env()
            except Exception as exc:  # a background beat must outlive any one failure
                log.warning("heartbeat to the trajectory API failed: %s", exc)
                await asyncio.sleep(interval)

    async def aclose(self) -> None:
        """Disconnect (best effort) and close the connection pool."""
        try:
            await self.disconnect_env()
        except TrainerError as exc:
            log.warning("disconnect-env failed: %s", exc)
        finally:
            await self._http.aclose()

    async def __aenter__(self) -> AtroposClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
