"""`ScoredGroup`: one item's rollouts as training data, the one model for every place a group goes.

The environment builds it, the JSONL sink writes it (one per line, with `schema_version`),
`AtroposClient` posts it and `clotho api` validates the request body with it. Field names are
exactly upstream Atropos' `ScoredData` (its `ScoredDataGroup` plus `env_id`), so a trainer or
an environment written for Atropos reads and writes it unchanged; `wire()` is the form sent to
a trainer (all 14 upstream keys, no `schema_version`).

Stricter than upstream, so bad data is a 422 at the door instead of a trainer crash later:
`tokens`, `masks` and `scores` line up; a per-sequence field that is present and not empty
has one entry per sequence; every message has `role` and `content`; no float is NaN or
infinite (JSON has no such numbers: they reached trainers as `null`); token ids are not
negative and, when the validation context carries `vocab_size`, below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from clotho.chat.tokens import MASKED, NOT_SAMPLED

if TYPE_CHECKING:
    from clotho.rollout import RolloutOutcome

SCHEMA_VERSION = 1

PER_SEQUENCE = (
    "advantages",
    "ref_logprobs",
    "messages",
    "inference_logprobs",
    "overrides",
    "distill_token_ids",
    "distill_logprobs",
)
"""Optional fields that hold one entry per sequence when present."""

WIRE_EXCLUDE = frozenset({"schema_version"})
"""What `wire()` leaves out: the file version is not part of the trajectory API."""


class ScoredGroup(BaseModel):
    """N sequences (rollouts of one item) with their scores, in upstream Atropos' shape."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    schema_version: Literal[1] = SCHEMA_VERSION
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
    env_id: int | None = Field(None, description="filled in by the sink that sends the group")
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
    def _aligned(self, info: ValidationInfo) -> ScoredGroup:
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
        for name in PER_SEQUENCE:
            value = getattr(self, name)
            if value and len(value) != n:  # empty stands for absent, as upstream envs send it
                raise ValueError(f"{name} has {len(value)} entries for {n} sequences")
        context = info.context if isinstance(info.context, dict) else {}
        self._check_token_ids(context.get("vocab_size"))
        return self

    def _check_token_ids(self, vocab_size: int | None) -> None:
        """Ids a trainer would index its embedding with: negative or out-of-vocabulary ids
        crash it (or worse, silently wrap), so they are refused here."""
        rows = [row for row in self.tokens if row]
        if not rows:
            return
        lowest = min(min(row) for row in rows)
        if lowest < 0:
            raise ValueError(f"token id {lowest} is negative")
        if vocab_size is None:
            return
        highest = max(max(row) for row in rows)
        masked_highest = max((max(row) for row in self.masks if row), default=MASKED)
        if max(highest, masked_highest) >= vocab_size:
            raise ValueError(
                f"token id {max(highest, masked_highest)} is outside the vocabulary "
                f"(size {vocab_size})"
            )

    @property
    def size(self) -> int:
        """Number of sequences in the group."""
        return len(self.tokens)

    def wire(self) -> dict[str, Any]:
        """The dict a trainer sink takes (upstream's 14 keys, no schema_version)."""
        return self.model_dump(exclude=set(WIRE_EXCLUDE))

    def wire_json(self) -> bytes:
        """`wire()` as compact JSON: the body `/scored_data` takes and `/batch` serves."""
        return self.__pydantic_serializer__.to_json(self, exclude=set(WIRE_EXCLUDE))


class GroupStats(BaseModel):
    """What happened to the groups and rollouts an environment produced."""

    def count(self, rollouts: Sequence[RolloutOutcome]) -> None:
        """Count a group's rollouts and their failures by kind."""
        self.groups += 1
        self.rollouts += len(rollouts)
        for r in rollouts:
            self.retries += len(r.lost_tries)
            if r.error is None:
                continue
            self.errors[r.error.kind] = self.errors.get(r.error.kind, 0) + 1
            self.infra_errors += r.error.kind == "infra"
            self.verifier_errors += r.error.kind == "verifier"
            self.failures_scored += r.trainable

    groups: int = 0
    groups_sent: int = 0
    dropped_too_few_valid: int = 0
    dropped_same_scores: int = 0
    dropped_overlong: int = 0
    dropped_no_tokens: int = Field(0, description="no rollout produced a token to train on")
    rollouts: int = 0
    infra_errors: int = 0
    verifier_errors: int = 0
    errors: dict[str, int] = Field(
        default_factory=dict, description="failed rollouts by error kind, scored or not"
    )
    failures_scored: int = Field(
        0, description="failed rollouts kept in their group with the failure score"
    )
    truncated: int = Field(0, description="sequences cut to max_token_length")
    retries: int = Field(
        0, description="tries lost to infra errors and run again (not counted as rollouts)"
    )


__all__ = [
    "MASKED",
    "NOT_SAMPLED",
    "PER_SEQUENCE",
    "SCHEMA_VERSION",
    "GroupStats",
    "ScoredGroup",
]
