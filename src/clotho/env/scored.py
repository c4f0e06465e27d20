"""`ScoredGroup`: one item's rollouts as training data, in Atropos' `ScoredDataGroup` shape."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

MASKED = -100


class ScoredGroup(BaseModel):
    schema_version: Literal[1] = 1
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    inference_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any = None
    env_id: int | None = None

    @model_validator(mode="after")
    def _aligned(self) -> ScoredGroup:
        n = len(self.scores)
        if len(self.tokens) != n or len(self.masks) != n:
            raise ValueError("tokens, masks and scores must have one entry per rollout")
        for tokens, masks in zip(self.tokens, self.masks, strict=True):
            if len(tokens) != len(masks):
                raise ValueError("each mask must be as long as its tokens")
        return self

    def wire(self) -> dict[str, Any]:
        """The dict a trainer sink takes (upstream's field names, no schema_version)."""
        return self.model_dump(exclude={"schema_version"})


class GroupStats(BaseModel):
    """What happened to the groups and rollouts an environment produced."""

    groups: int = 0
    groups_sent: int = 0
    dropped_too_few_valid: int = 0
    dropped_same_scores: int = 0
    dropped_overlong: int = 0
    rollouts: int = 0
    infra_errors: int = 0
    verifier_errors: int = 0
    truncated: int = Field(0, description="sequences cut to max_token_length")
