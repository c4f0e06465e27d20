"""Pass rate, pass@k and the treatment of errors in metrics."""

from __future__ import annotations

import math

import pytest

from clotho.errors import ErrorInfo
from clotho.runs.metrics import compute_metrics, pass_at_k, wilson_interval
from clotho.runs.records import TrialRecord


def rec(
    task: str, attempt: int, passed: bool, kind: str | None = None, cat: str = "c"
) -> TrialRecord:
    return TrialRecord(
        task=task,
        category=cat,
        attempt=attempt,
        reward=None if kind else float(passed),
        passed=passed,
        error=ErrorInfo(kind=kind, message="x") if kind else None,
        agent="test",
    )


def test_pass_at_k_estimator() -> None:
    assert pass_at_k(5, 0, 1) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert math.isclose(pass_at_k(4, 1, 1), 0.25)
    assert math.isclose(pass_at_k(4, 1, 2), 0.5)  # 1 - C(3,2)/C(4,2)


def test_infra_and_task_errors_are_out_of_the_denominator() -> None:
    records = [
        rec("a", 0, True, cat="x"),
        rec("b", 0, False, cat="x"),
        rec("c", 0, False, kind="infra", cat="y"),
        rec("d", 0, False, kind="task", cat="invalid"),
        rec("e", 0, False, kind="verifier", cat="y"),
    ]
    m = compute_metrics(records)
    assert m.n_scored == 3
    assert m.pass_rate == pytest.approx(1 / 3)
    assert m.errors == {"infra": 1, "task": 1, "verifier": 1}
    assert m.by_category["x"].pass_rate == 0.5 and m.by_category["x"].n == 2
    assert m.by_category["y"].n == 1
    assert "invalid" not in m.by_category
    assert m.n_tasks == 5


def test_latest_record_wins_on_resume() -> None:
    m = compute_metrics([rec("a", 0, False, kind="infra"), rec("a", 0, True)])
    assert m.n_attempts == 1 and m.pass_rate == 1.0 and m.errors == {}


def test_pass_at_k_over_attempts() -> None:
    records = [rec("a", 0, True), rec("a", 1, False), rec("b", 0, False), rec("b", 1, False)]
    m = compute_metrics(records, attempts=2)
    assert m.pass_at_k == {"1": 0.25, "2": 0.5}
    assert m.pass_rate == 0.25


def test_wilson_interval_contains_the_rate() -> None:
    lo, hi = wilson_interval(7, 10)
    assert lo < 0.7 < hi
    assert wilson_interval(0, 0) is None


def test_phase_timings_have_totals_and_quantiles() -> None:
    from clotho.rollout import PhaseTimings
    from clotho.runs.metrics import phase_timings

    records = [
        TrialRecord(
            task=f"t{i}",
            category="c",
            attempt=0,
            reward=1.0,
            passed=True,
            agent="a",
            duration_s=float(i),
            timings=PhaseTimings(agent_s=float(i), verify_s=0.5),
        )
        for i in range(1, 21)
    ]
    records.append(TrialRecord(task="bad", category="invalid", attempt=0, reward=None,
                               passed=False, agent="a"))  # fmt: skip
    stats = phase_timings(records)
    assert set(stats) == {"agent_s", "verify_s"}  # phases that took no time are left out
    assert stats["agent_s"].total_s == 210.0
    assert (stats["agent_s"].p50_s, stats["agent_s"].p95_s) == (10.0, 19.0)
    assert stats["verify_s"].p50_s == 0.5  # the invalid task (no time at all) is not counted
