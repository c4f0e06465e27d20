"""The one rollout path: sandbox from the pool, workspace, agent, verification, release.

`clotho eval`, `clotho check` and every environment run their attempts through
`run_rollout`, and all of them get a `RolloutOutcome` back.
"""

from clotho.rollout.outcome import Phase, PhaseTimings, RolloutOutcome, VerifierOutcome
from clotho.rollout.run import RETRY_DELAY_S, RolloutSpec, run_retried, run_rollout

__all__ = [
    "RETRY_DELAY_S",
    "Phase",
    "PhaseTimings",
    "RolloutOutcome",
    "RolloutSpec",
    "VerifierOutcome",
    "run_retried",
    "run_rollout",
]
