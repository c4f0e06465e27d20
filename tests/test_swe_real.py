"""Instances generated from real PyPI packages (examples/swe/real.jsonl): the gold patch
passes and doing nothing fails, one instance per package, on the local backend.

Their repositories are built from pinned sdists by scripts/build-swe-examples.sh (the only
step that needs the package index; `make test` runs it). Without them the tests skip, with
the reason shown, except in CI, where that is a failure.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.test_swe import assert_oracle_1_and_nop_0

from clotho.swe.examples import REAL_INSTANCES, REAL_PACKAGES
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.repos import REAL_REPOS, RepoCache
from clotho.swe.trial import SweTrial

MISSING = [n for n in REAL_PACKAGES if not (REAL_REPOS / n).is_dir()]
pytestmark = [
    requires_bwrap,
    pytest.mark.skipif(
        bool(MISSING) and os.environ.get("CI") != "true",
        reason=f"{MISSING} not built in {REAL_REPOS}: run scripts/build-swe-examples.sh",
    ),
]


def one_per_package() -> list[dict]:
    records = [json.loads(x) for x in REAL_INSTANCES.read_text().splitlines() if x.strip()]
    chosen: dict[str, dict] = {}
    for record in records:
        chosen.setdefault(record["repo"], record)
    return list(chosen.values())


def test_every_package_has_instances() -> None:
    repos = {r["repo"] for r in one_per_package()}
    assert repos == {f"clotho-pypi/{n}" for n in REAL_PACKAGES}


async def test_oracle_1_and_nop_0_on_real_packages(tmp_path: Path) -> None:
    options = SweOptions(cache_dir=str(tmp_path / "cache"), network_clone=False)
    cache = RepoCache(options.cache_path(), network=False)
    trials = [SweTrial(SweInstance.model_validate(r), options, cache) for r in one_per_package()]
    await assert_oracle_1_and_nop_0(trials, pool_size=4, at_once=3)
