"""RL environments: the `Environment` base, `ToolContext`, group rollouts and scored groups."""

from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.context import ToolContext
from clotho.env.evaluation import EvalSample
from clotho.env.scored import MASKED, GroupStats, ScoredGroup

__all__ = [
    "MASKED",
    "EnvConfig",
    "Environment",
    "EvalSample",
    "GroupStats",
    "ScoredGroup",
    "ToolContext",
]
