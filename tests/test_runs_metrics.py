"""Pass rate, pass@k and the treatment of errors in metrics."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from clotho.errors import ErrorInfo
from clotho.runs.metrics import compute_metrics, pass_at_k, wilson_interval
from clotho.runs.records import TrialRecord

REPO = Path(__file__).resolve().parent.parent


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


# -- confidence intervals ------------------------------------------------------------------
# Reference values published in R. G. Newcombe, "Two-sided confidence intervals for the single
# proportion: comparison of seven methods", Stat. Med. 17 (1998) 857-872, Table I (method 3,
# the score interval), and "Interval estimation for the difference between independent
# proportions: comparison of eleven methods", Stat. Med. 17 (1998) 873-890, Table II (method
# 10, the hybrid score interval). Printed to 4 decimals with z = 1.959964; clotho uses 1.96,
# which moves none of them by more than 1e-4.
PUBLISHED_WILSON = {
    (81, 263): (0.2553, 0.3662),
    (15, 148): (0.0624, 0.1605),
    (0, 20): (0.0000, 0.1611),
    (1, 29): (0.0061, 0.1718),
}
# (x1, n1, x2, n2): the interval of x1/n1 - x2/n2.
PUBLISHED_NEWCOMBE = {
    (56, 70, 48, 80): (0.0524, 0.3339),
    (9, 10, 3, 10): (0.1705, 0.8090),
    (6, 7, 2, 7): (0.0582, 0.8062),
    (5, 56, 0, 29): (-0.0381, 0.1926),
    (0, 10, 0, 20): (-0.1611, 0.2775),
    (0, 10, 0, 10): (-0.2775, 0.2775),
    (10, 10, 0, 20): (0.6791, 1.0000),
    (10, 10, 0, 10): (0.6075, 1.0000),
}
PUBLISHED_TOLERANCE = 1.5e-4  # 4 printed decimals plus the z rounding


def reference_wilson(x: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The score interval as the roots of (x/n - p)^2 = z^2 p (1 - p) / n, solved for p:
    written independently of clotho's centre-and-half-width form."""
    a = n + z * z
    b = -(2 * x + z * z)
    c = x * x / n
    root = math.sqrt(b * b - 4 * a * c)
    return ((-b - root) / (2 * a), (-b + root) / (2 * a))


def reference_newcombe(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float]:
    """Newcombe's method 10 for p1 - p2 (the formula of the paper, from reference_wilson)."""
    p1, p2 = x1 / n1, x2 / n2
    (l1, u1), (l2, u2) = reference_wilson(x1, n1), reference_wilson(x2, n2)
    d = p1 - p2
    return (
        d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
        d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
    )


@pytest.mark.parametrize(("x", "n"), sorted(PUBLISHED_WILSON))
def test_wilson_interval_matches_the_published_values(x: int, n: int) -> None:
    interval = wilson_interval(x, n)
    assert interval is not None
    assert interval == pytest.approx(PUBLISHED_WILSON[x, n], abs=PUBLISHED_TOLERANCE)
    assert interval == pytest.approx(reference_wilson(x, n), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 6, 7, 10, 11, 263, 10_000])
def test_wilson_interval_at_the_edges(n: int) -> None:
    """0/n starts at 0 and n/n ends at 1; their other ends are the closed forms of the score
    interval there (z^2/(n + z^2) and n/(n + z^2)); between them, the reference formula."""
    z2 = 1.96**2
    lo, hi = wilson_interval(0, n) or (math.nan, math.nan)
    assert lo == pytest.approx(0.0, abs=1e-15) and hi == pytest.approx(z2 / (n + z2), rel=1e-12)
    lo, hi = wilson_interval(n, n) or (math.nan, math.nan)
    assert lo == pytest.approx(n / (n + z2), rel=1e-12) and hi == pytest.approx(1.0, abs=1e-15)
    for x in range(0, n + 1, max(1, n // 7)):
        assert wilson_interval(x, n) == pytest.approx(reference_wilson(x, n), abs=1e-12)


def test_wilson_interval_contains_the_observed_rate_exactly() -> None:
    for n in range(1, 200):
        for x in range(n + 1):
            lo, hi = wilson_interval(x, n) or (math.nan, math.nan)
            assert 0.0 <= lo <= x / n <= hi <= 1.0, (x, n, lo, hi)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0  # type: ignore[index]


def test_wilson_interval_of_no_attempts_is_none_and_metrics_carry_it() -> None:
    assert wilson_interval(0, 0) is None
    assert compute_metrics([rec("a", 0, False, kind="infra")]).pass_rate_ci95 is None
    records = [rec(f"t{i}", 0, i < 81) for i in range(263)]
    records.append(rec("lost", 0, False, kind="infra"))  # not scored: not in the interval
    m = compute_metrics(records)
    assert m.n_scored == 263 and m.n_passed == 81
    assert m.pass_rate_ci95 == pytest.approx((0.2553, 0.3662), abs=PUBLISHED_TOLERANCE)


# The viewer's compare page computes Newcombe's interval in the browser (app.js): the
# functions are run as written, by Node.js (on every machine of this kind).
APP_JS = REPO / "src" / "clotho" / "view" / "static" / "app.js"
NODE = shutil.which("node")


def _run_app_statistics(calls: str) -> object:
    source = APP_JS.read_text()
    start = source.index("function wilson(")
    end = source.index("\n}\n", source.index("function diffInterval(")) + 3
    script = source[start:end] + f"\nprocess.stdout.write(JSON.stringify({calls}));\n"
    if NODE is None:
        pytest.skip("Node.js is not installed (machines of this kind have it)")
    done = subprocess.run(
        [NODE, "-e", script], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout)


def test_the_viewers_newcombe_interval_matches_the_published_values() -> None:
    """diffInterval(pa, na, pb, nb) is the interval of pb/nb - pa/na."""
    cases = sorted(PUBLISHED_NEWCOMBE)
    calls = ", ".join(f"diffInterval({x2}, {n2}, {x1}, {n1})" for x1, n1, x2, n2 in cases)
    got = _run_app_statistics(f"[{calls}]")
    assert isinstance(got, list) and len(got) == len(cases)
    for case, interval in zip(cases, got, strict=True):
        assert interval == pytest.approx(PUBLISHED_NEWCOMBE[case], abs=PUBLISHED_TOLERANCE), case
        assert interval == pytest.approx(reference_newcombe(*case), abs=1e-12), case
    # No attempts on one side: no interval, as wilson_interval says.
    assert _run_app_statistics("[diffInterval(0, 0, 3, 10), diffInterval(3, 10, 0, 0)]") == [
        None,
        None,
    ]


def test_the_viewers_wilson_interval_is_the_one_of_the_metrics() -> None:
    cases = [*sorted(PUBLISHED_WILSON), (0, 1), (1, 1), (7, 10), (10_000, 10_000)]
    got = _run_app_statistics("[" + ", ".join(f"wilson({x}, {n})" for x, n in cases) + "]")
    assert isinstance(got, list)
    for (x, n), interval in zip(cases, got, strict=True):
        assert tuple(interval) == pytest.approx(wilson_interval(x, n), abs=1e-15), (x, n)


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
