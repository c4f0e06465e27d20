"""SWE instances on real repositories: SWE-bench / SWE-smith records, a bare-repository cache
with cheap per-commit snapshots, FAIL_TO_PASS + PASS_TO_PASS verification from nothing the
agent controls, and procedural bug generation (`clotho swe generate`)."""

import clotho.swe.format  # noqa: F401  (registers the SWE task format with discovery)
from clotho.swe.instance import SweInstance, SweOptions, load_instances
from clotho.swe.trial import SweTrial

__all__ = ["SweInstance", "SweOptions", "SweTrial", "load_instances"]
