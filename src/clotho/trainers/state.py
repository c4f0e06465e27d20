"""What a trajectory API server knows: the trainer's registration, environments, the queue.

`ApiState` is the protocol's semantics without HTTP (`server.py` puts it on the wire). Each
server owns one, so several servers live in one process. All methods are synchronous and
called from one event loop, so no request can interleave inside one of them.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, Field, SecretStr

from clotho.env.scored import ScoredGroup
from clotho.trainers.batching import form_batch, pick_exact, scaled_minimums
from clotho.trainers.protocol import (
    WAIT_FOR_TRAINER,
    DisconnectResponse,
    Info,
    RegisterEnv,
    RegisterEnvResponse,
    Registration,
    Status,
    StatusEnv,
    WandbInfo,
)

log = logging.getLogger(__name__)

MIN_ENV_WEIGHT = 0.01
"""Smallest inference share reported to an environment, so none is starved completely."""


class ApiSettings(BaseModel):
    """Server-side settings (upstream has none: everything came from the trainer)."""

    batch_size: int | None = Field(
        None, ge=1, description="preset batch size: envs may register before any trainer"
    )
    max_token_len: int = Field(-1, description="preset max_token_len reported by /info")
    env_timeout_s: float = Field(
        120.0, ge=0, description="an env silent this long is treated as gone; 0 = never"
    )
    max_request_bytes: int = Field(
        256 << 20,
        ge=1,
        description="largest request body, before and after gzip decompression (else 413)",
    )
    token: SecretStr | None = Field(
        None,
        description="required as `Authorization: Bearer` (or Basic with it as password); "
        "None: no authentication, allowed on a loopback address only",
    )
    cors_origins: list[str] = Field(
        default_factory=list,
        description="web origins allowed to call the API (they still need the token); "
        "requests from any other web page are refused",
    )
    vocab_size: int | None = Field(
        None, gt=0, description="token ids at or above it are refused (else: the trainer's)"
    )
    max_batch_size: int = Field(
        1 << 16,
        ge=1,
        description="largest batch_size a trainer may register (sequences); above: 422",
    )
    min_allocation_wait_s: float = Field(
        5.0,
        ge=0,
        description="how long envs' min_batch_allocation may hold back a batch that the "
        "queue could fill; then the batch goes with what those envs have queued",
    )


class Rejected(Exception):
    """A request the server refuses; carries the HTTP status to answer with."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


@dataclass(frozen=True)
class QueuedGroup:
    """A validated group as the queue keeps it: its wire JSON, about 10x smaller than the
    same group as Python lists of ints, and served by `/batch` without re-encoding."""

    size: int
    env_id: int | None
    body: bytes

    @classmethod
    def of(cls, group: ScoredGroup) -> QueuedGroup:
        return cls(size=group.size, env_id=group.env_id, body=group.wire_json())


@dataclass
class EnvRecord:
    env_id: int
    desired_name: str
    real_name: str
    max_context_len: int
    weight: float
    group_size: int
    min_batch_allocation: float | None
    last_seen: float
    disconnected: bool = False
    expired_logged: bool = False


class ApiState:
    def __init__(
        self, settings: ApiSettings | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or ApiSettings()
        self._clock = clock
        self.reset()

    # --- trainer ------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything; a preset batch size (if any) applies again."""
        self.registration: Registration | None = None
        self.trainer_registered = False
        self.started = False
        self.step = 0
        self.batches_served = 0
        self.queue: list[QueuedGroup] = []
        self.envs: list[EnvRecord] = []
        self.latest: QueuedGroup | None = None
        self.requesters: list[int] = []
        self.held_since: float | None = None
        if self.settings.batch_size is not None:
            self.registration = Registration(
                wandb_group="",
                wandb_project="",
                batch_size=self.settings.batch_size,
                max_token_len=self.settings.max_token_len,
                checkpoint_dir="",
                save_checkpoint_interval=-1,
                starting_step=0,
                num_steps=-1,
            )
            self.started = True

    def register(self, registration: Registration) -> int:
        """A trainer registers. The first one sets the batch shape; a later one must match it
        once anything depends on that shape, else 409.

        Squatting is harmless: a token holder (an environment, a tool such as upstream's
        sft-gen) that registered first with another shape is replaced by the later
        registration as long as nothing depends on the shape yet, i.e. no batch served, no
        environment registered, no group queued, and no preset (`--batch-size`: then the
        operator's shape holds against every registration). A `batch_size` above
        `max_batch_size` is refused outright. A token holder that wants to disrupt training
        can already `/reset_data`; this only stops a stray registration from locking the
        real trainer out.
        """
        limit = self.settings.max_batch_size
        if registration.batch_size > limit:
            raise Rejected(
                422,
                f"batch_size {registration.batch_size} is above the server's limit of {limit} "
                "sequences (ApiSettings.max_batch_size)",
            )
        current = self.registration
        if current is not None and (
            registration.batch_size != current.batch_size
            or (current.max_token_len != -1 and registration.max_token_len != current.max_token_len)
        ):
            if not self._shape_in_use():
                log.warning(
                    "registration with batch_size=%d replaces batch_size=%d: nothing used it yet",
                    registration.batch_size,
                    current.batch_size,
                )
                self.registration = registration
                self.trainer_registered = True
                self.step = registration.starting_step
                self.requesters.append(uuid.uuid4().int)
                return self.requesters[-1]
            raise Rejected(
                409,
                f"already registered with batch_size={current.batch_size}, "
                f"max_token_len={current.max_token_len}; call /reset_data first to change them",
            )
        if not self.trainer_registered:
            self.trainer_registered = True
            self.registration = registration
            if self.step == 0:
                self.step = registration.starting_step
        self.requesters.append(uuid.uuid4().int)
        return self.requesters[-1]

    def _shape_in_use(self) -> bool:
        """Whether anything was built on the registered batch shape: a preset, a batch served,
        an environment registered, a group queued (checked against the batch size)."""
        return (
            self.settings.batch_size is not None
            or self.batches_served > 0
            or bool(self.envs)
            or bool(self.queue)
        )

    @property
    def vocab_size(self) -> int | None:
        """Token ids must be below this: the server's setting, else the trainer's."""
        if self.settings.vocab_size is not None:
            return self.settings.vocab_size
        return self.registration.vocab_size if self.registration else None

    def require_registration(self) -> Registration:
        """The batch shape, or a 409: nothing can be queued before a trainer registered."""
        if self.registration is None:
            raise Rejected(409, "Trainer not registered. Call /register first.")
        return self.registration

    @property
    def batch_size(self) -> int:
        return self.require_registration().batch_size

    def info(self) -> Info:
        if self.registration is None:
            return Info()
        return Info(
            batch_size=self.registration.batch_size,
            max_token_len=self.registration.max_token_len,
        )

    def wandb_info(self) -> WandbInfo:
        if self.registration is None:
            return WandbInfo()
        return WandbInfo(
            group=self.registration.wandb_group, project=self.registration.wandb_project
        )

    def status(self) -> Status:
        return Status(current_step=self.step, queue_size=len(self.queue))

    def next_batch(self) -> list[QueuedGroup] | None:
        """The oldest groups making exactly one batch; `step` counts batches handed out.

        Live environments' minimum allocations come first. They may hold a batch back while
        the rest of the queue could fill it, but for `min_allocation_wait_s` at most: then
        the batch goes with whatever those environments have queued, so a slow (or crashed,
        not yet expired) environment with a minimum never starves the trainer.
        """
        batch_size = self.batch_size
        self.started = True
        minimums = scaled_minimums(
            {
                env.env_id: int(batch_size * env.min_batch_allocation)
                for env in self.envs
                if env.min_batch_allocation is not None and self.is_live(env)
            },
            batch_size,
        )
        queued = [(group.env_id, group.size) for group in self.queue]
        picked = form_batch(queued, batch_size, minimums)
        if picked is None and pick_exact([size for _, size in queued], batch_size) is None:
            self.held_since = None  # nothing could be served anyway: no hold is running
        elif picked is None:
            now = self._clock()
            if self.held_since is None:
                self.held_since = now
                wait = self.settings.min_allocation_wait_s
                log.info("a batch waits up to %.0f s for minimum allocations", wait)
            if now - self.held_since >= self.settings.min_allocation_wait_s:
                have: dict[int, int] = {}
                for env_id, size in queued:
                    if env_id in minimums:
                        have[env_id] = have.get(env_id, 0) + size
                partial = {env: min(m, have.get(env, 0)) for env, m in minimums.items()}
                picked = form_batch(queued, batch_size, partial)
        if picked is None:
            return None
        self.held_since = None
        chosen = set(picked)
        batch = [self.queue[i] for i in picked]
        self.queue = [g for i, g in enumerate(self.queue) if i not in chosen]
        self.step += 1
        self.batches_served += 1
        return batch

    # --- environments -------------------------------------------------------------------

    def register_env(self, request: RegisterEnv) -> RegisterEnvResponse:
        if not self.started or self.registration is None:
            return RegisterEnvResponse(status=WAIT_FOR_TRAINER)
        if request.group_size > self.registration.batch_size:
            raise Rejected(
                422,
                f"group_size {request.group_size} is larger than the batch size "
                f"{self.registration.batch_size}: its groups could never be served",
            )
        same_name = sum(e.desired_name == request.desired_name for e in self.envs)
        env = EnvRecord(
            env_id=len(self.envs),
            desired_name=request.desired_name,
            real_name=f"{request.desired_name}_{same_name}",
            max_context_len=request.max_token_length,
            weight=request.weight,
            group_size=request.group_size,
            min_batch_allocation=request.min_batch_allocation,
            last_seen=self._clock(),
        )
        self.envs.append(env)
        return RegisterEnvResponse(
            status="success",
            env_id=env.env_id,
            wandb_name=env.real_name,
            checkpoint_dir=self.registration.checkpoint_dir,
            starting_step=self.step,
            checkpoint_interval=self.registration.save_checkpoint_interval,
            num_steps=self.registration.num_steps,
        )

    def disconnect_env(self, env_id: int) -> DisconnectResponse:
        if not 0 <= env_id < len(self.envs):
            return DisconnectResponse(status="failure", error=f"unknown env_id {env_id}")
        self.envs[env_id].disconnected = True
        log.info("environment %s disconnected", self.envs[env_id].real_name)
        return DisconnectResponse(status="success")

    def is_live(self, env: EnvRecord) -> bool:
        """Connected and heard from within `env_timeout_s`: only live envs hold a share."""
        if env.disconnected:
            return False
        timeout = self.settings.env_timeout_s
        if timeout > 0 and self._clock() - env.last_seen > timeout:
            if not env.expired_logged:
                env.expired_logged = True
                log.warning(
                    "environment %s silent for over %.0f s: its share is released",
                    env.real_name,
                    timeout,
                )
            return False
        return True

    def _touch(self, env_id: int | None) -> None:
        if env_id is not None and 0 <= env_id < len(self.envs):
            env = self.envs[env_id]
            env.last_seen = self._clock()
            env.expired_logged = False

    def status_env(self, env_id: int) -> StatusEnv:
        if not 0 <= env_id < len(self.envs):
            raise Rejected(404, f"unknown env_id {env_id}: register the environment again")
        self._touch(env_id)
        env = self.envs[env_id]
        batch_size = self.batch_size
        live = [e for e in self.envs if self.is_live(e)]
        total = sum(max(0, e.max_context_len) * e.weight for e in live)
        own = max(0, env.max_context_len) * env.weight
        share = own / total if total > 0 else (1.0 if own > 0 else 0.0)
        minimums = {
            e.env_id: int(batch_size * e.min_batch_allocation)
            for e in live
            if e.min_batch_allocation is not None
        }
        allocated = sum(e.min_batch_allocation or 0.0 for e in live)

        largest = max((g.size for g in self.queue), default=1)
        own_size = max([env.group_size, *(g.size for g in self.queue if g.env_id == env_id)])
        own_seqs = sum(g.size for g in self.queue if g.env_id == env_id)
        others: dict[int | None, int] = {}
        for group in self.queue:
            if group.env_id != env_id:
                others[group.env_id] = others.get(group.env_id, 0) + group.size
        available = sum(
            max(0, math.ceil(seqs / largest) * largest - minimums.get(other, 0))
            for other, seqs in others.items()
        )
        return StatusEnv(
            current_step=self.step,
            queue_size=(own_seqs + available) // own_size,
            unallocated_fraction=1.0 - min(1.0, allocated),
            self_queue_size=own_seqs // own_size,
            max_group_size=largest,
            env_weight=min(1.0, max(MIN_ENV_WEIGHT, share)),
        )

    # --- data ---------------------------------------------------------------------------

    def add_groups(self, groups: Sequence[QueuedGroup]) -> None:
        """Queue groups, all or none: a group larger than a batch is refused, not stranded."""
        batch_size = self.batch_size
        for i, group in enumerate(groups):
            if group.size > batch_size:
                where = f"group {i}" if len(groups) > 1 else "the group"
                raise Rejected(
                    422,
                    f"{where} has {group.size} sequences, more than the batch size "
                    f"{batch_size}: it could never be served",
                )
        for group in groups:
            self._touch(group.env_id)
            self.queue.append(group)
            self.latest = group
