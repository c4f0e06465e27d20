"""The Atropos trajectory API on the wire: request and response bodies as pydantic models.

Field names are exactly those upstream `atroposlib` (0.4) sends and expects, so a trainer or
an environment written for Atropos talks to `clotho api` unchanged, and our client talks to
upstream `run-api`. See `shared/reference/atropos-protocol.md` for the semantics. The group
itself (`/scored_data`'s body, one item of `/batch`) is `clotho.env.scored.ScoredGroup`,
the same model environments build and the JSONL sink writes.

Stricter than upstream, each a 422 instead of a crash or a stall later: a misaligned group
(see `ScoredGroup`), a batch or group size below 1 (upstream divides by it), and a weight or
minimum allocation that is negative, NaN or infinite (a NaN minimum made every `/batch` a 500).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from clotho.env.scored import ScoredGroup

NOT_REGISTERED = "Trainer not registered. Call /register first."
WAIT_FOR_TRAINER = "wait for trainer to start"

OFF_LOOP_BYTES = 1 << 20
"""Bodies and files larger than this are compressed, parsed or written off the event loop."""

GroupLike = ScoredGroup | Mapping[str, Any]
"""What sinks accept: a validated group, or a dict in upstream's `ScoredDataGroup` shape."""


def to_wire(group: GroupLike, env_id: int | None) -> ScoredGroup:
    """The group as sent: validated, with `env_id` filled in (kept as is when None)."""
    if isinstance(group, ScoredGroup):
        if env_id is None or group.env_id == env_id:
            return group
        return group.model_copy(update={"env_id": env_id})
    wire = ScoredGroup.model_validate(group)
    if env_id is not None:
        wire.env_id = env_id
    return wire


class _Strict(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)


# --- trainer registration -------------------------------------------------------------


class Registration(_Strict):
    """`POST /register`: the trainer announces itself and its batch shape."""

    wandb_group: str
    wandb_project: str
    batch_size: int = Field(gt=0)
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int
    vocab_size: int | None = Field(
        None, gt=0, description="clotho extension: token ids at or above it are refused"
    )


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


# --- environment registration ----------------------------------------------------------


class RegisterEnv(_Strict):
    """`POST /register-env`."""

    max_token_length: int
    desired_name: str
    weight: float = Field(ge=0, description="share of inference (status-env's env_weight)")
    group_size: int = Field(gt=0)
    min_batch_allocation: float | None = Field(
        None, ge=0, le=1, description="smallest share of every batch reserved for this env"
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
