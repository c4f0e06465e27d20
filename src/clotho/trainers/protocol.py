"""The Atropos trajectory API on the wire: request and response bodies as pydantic models.

Field names are exactly those upstream `atroposlib` (0.4) sends and expects, so a trainer or
an environment written for Atropos talks to `clotho api` unchanged, and our client talks to
upstream `run-api`. See `shared/reference/atropos-protocol.md` for the semantics.

One deliberate difference from upstream: a group's `tokens`, `masks` and `scores` must line
up (same number of sequences, and each mask as long as its tokens), and a per-sequence
field that is present and not empty has one entry per sequence. Upstream accepts a
misaligned group and lets the trainer crash on it later; here it is a 422 at the door.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MASKED = -100
"""Mask value of a position that is not trained (prompt, tool output)."""

LOGPROB_PLACEHOLDER = 1.0
"""Logprob placed at masked positions: impossible for a real logprob (e^1 > 1)."""

NOT_REGISTERED = "Trainer not registered. Call /register first."
WAIT_FOR_TRAINER = "wait for trainer to start"

_PER_SEQUENCE = (
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "distill_token_ids",
    "distill_logprobs",
)


class ScoredDataGroup(BaseModel):
    """One group of sequences (N rollouts of one item) with its scores.

    The environment-side form (upstream's `ScoredDataGroup` TypedDict): every field of
    `ScoredData` except `env_id`, which the client fills in when sending.
    """

    model_config = ConfigDict(extra="ignore")

    tokens: list[list[int]] = Field(description="prompt + completion token ids, per sequence")
    masks: list[list[int]] = Field(description="same shape as tokens; -100 = not trained")
    scores: list[float] = Field(description="one reward per sequence")
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = Field(
        None, description="sampling logprobs aligned with tokens; 1.0 at masked positions"
    )
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    @field_validator("messages")
    @classmethod
    def _messages_have_role_and_content(
        cls, value: list[list[dict[str, Any]]] | None
    ) -> list[list[dict[str, Any]]] | None:
        for conversation in value or []:
            for message in conversation:
                if "role" not in message or "content" not in message:
                    raise ValueError("Message must have 'role' and 'content' fields")
        return value

    @model_validator(mode="after")
    def _aligned(self) -> ScoredDataGroup:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a group needs at least one sequence")
        if len(self.masks) != n or len(self.scores) != n:
            raise ValueError(
                f"tokens, masks and scores disagree: {n} token lists, {len(self.masks)} "
                f"mask lists, {len(self.scores)} scores"
            )
        for i, (tokens, mask) in enumerate(zip(self.tokens, self.masks, strict=True)):
            if len(tokens) != len(mask):
                raise ValueError(f"sequence {i}: {len(tokens)} tokens but {len(mask)} masks")
        for name in _PER_SEQUENCE:
            value = getattr(self, name)
            if value and len(value) != n:  # empty stands for absent, as upstream envs send it
                raise ValueError(f"{name} has {len(value)} entries for {n} sequences")
        return self

    @property
    def size(self) -> int:
        """Number of sequences in the group."""
        return len(self.tokens)


class ScoredData(ScoredDataGroup):
    """One group as posted to `/scored_data` and returned in `/batch` (all 14 keys)."""

    env_id: int | None = None


GroupLike = ScoredDataGroup | Mapping[str, Any]
"""What sinks accept: a validated group, or a dict in upstream's `ScoredDataGroup` shape."""


def to_wire(group: GroupLike, env_id: int | None) -> ScoredData:
    """The group as sent: validated, with `env_id` filled in (kept as is when None)."""
    if isinstance(group, ScoredDataGroup):
        fields = {name: getattr(group, name) for name in ScoredDataGroup.model_fields}
        current = group.env_id if isinstance(group, ScoredData) else None
        return ScoredData.model_construct(
            **fields, env_id=env_id if env_id is not None else current
        )
    wire = ScoredData.model_validate(group)
    if env_id is not None:
        wire.env_id = env_id
    return wire


# --- trainer registration -------------------------------------------------------------


class Registration(BaseModel):
    """`POST /register`: the trainer announces itself and its batch shape."""

    wandb_group: str
    wandb_project: str
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int


class RegisterResponse(BaseModel):
    uuid: int


class Info(BaseModel):
    """`GET /info`; both are -1 before a trainer registered."""

    batch_size: int = -1
    max_token_len: int = -1


class WandbInfo(BaseModel):
    group: str | None = None
    project: str | None = None


class Status(BaseModel):
    """`GET /status`; `queue_size` counts groups, not sequences."""

    current_step: int
    queue_size: int


class BatchResponse(BaseModel):
    """`GET /batch`: whole groups adding up to exactly `batch_size` sequences, or null."""

    batch: list[ScoredData] | None = None
    status: str | None = None
    message: str | None = None


# --- environment registration ----------------------------------------------------------


class RegisterEnv(BaseModel):
    """`POST /register-env`."""

    max_token_length: int
    desired_name: str
    weight: float
    group_size: int
    min_batch_allocation: float | None = Field(
        None, description="smallest share of every batch reserved for this env (0..1)"
    )


class RegisterEnvResponse(BaseModel):
    """`status` is "success", or "wait for trainer to start" with every other field absent."""

    status: str
    env_id: int | None = None
    wandb_name: str | None = None
    checkpoint_dir: str | None = None
    starting_step: int | None = None
    checkpoint_interval: int | None = None
    num_steps: int | None = None


class EnvIdentifier(BaseModel):
    """Body of `/disconnect-env` and of `GET /status-env`."""

    env_id: int


class DisconnectResponse(BaseModel):
    status: Literal["success", "failure"]
    error: str | None = None


class StatusEnv(BaseModel):
    """`GET /status-env`: what an environment needs to pace itself.

    `queue_size` and `self_queue_size` are in units of this environment's groups.
    """

    current_step: int
    queue_size: int
    unallocated_fraction: float
    self_queue_size: int
    max_group_size: int
    env_weight: float


class ScoredDataResponse(BaseModel):
    """`/scored_data` reply; upstream may answer "buffered" for an odd-sized group."""

    status: str
    buffer_size: int | None = None


class ScoredDataListResponse(BaseModel):
    status: str
    groups_processed: int
    buffered: int | None = None
    last_buffer_size: int | None = None


EMPTY_EXAMPLE: dict[str, list[Any]] = {
    key: []
    for key in (
        "tokens",
        "masks",
        "scores",
        "advantages",
        "ref_logprobs",
        "generation_params",
        "inference_logprobs",
        "messages",
        "images",
    )
}
"""`/latest_example` before any group arrived (upstream's shape)."""
