"""What an environment's `evaluate()` returns: one sample per evaluated item."""

from __future__ import annotations

from pydantic import BaseModel

from clotho.rollout import RolloutOutcome


class EvalSample(BaseModel):
    name: str
    category: str = "uncategorized"
    attempt: int = 0
    rollout: RolloutOutcome
