"""Pass rates, pass@k and confidence intervals from trial records."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from clotho.rollout import PhaseTimings
from clotho.runs.records import CategoryMetrics, RunMetrics, TimingStats, TrialRecord


def wilson_interval(passed: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    if n == 0:
        return None
    p = passed / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0/n and n/n the bound is exactly the observed rate; rounding must not leave it out.
    lo = 0.0 if passed == 0 else max(0.0, centre - half)
    hi = 1.0 if passed == n else min(1.0, centre + half)
    return (lo, hi)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator (Chen et al. 2021): chance that k of n samples include a pass."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def latest(records: Iterable[TrialRecord]) -> dict[tuple[str, int], TrialRecord]:
    """The last record per (task, attempt): a resumed run may have retried an attempt."""
    out: dict[tuple[str, int], TrialRecord] = {}
    for record in records:
        out[record.key] = record
    return out


def _quantile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank quantile: a value some attempt really took."""
    index = max(0, math.ceil(q * len(sorted_values)) - 1)
    return sorted_values[index]


def phase_timings(records: Iterable[TrialRecord]) -> dict[str, TimingStats]:
    """Totals, p50 and p95 of each phase over the attempts that ran (not invalid tasks)."""
    ran = [r.timings.model_dump() for r in records if r.duration_s > 0]
    out: dict[str, TimingStats] = {}
    for phase in PhaseTimings.model_fields:
        values = sorted(t[phase] for t in ran)
        if values and values[-1] > 0:
            out[phase] = TimingStats(
                total_s=round(sum(values), 3),
                p50_s=round(_quantile(values, 0.5), 4),
                p95_s=round(_quantile(values, 0.95), 4),
            )
    return out


def compute_metrics(records: Iterable[TrialRecord], attempts: int = 1) -> RunMetrics:
    final = list(latest(records).values())
    scored = [r for r in final if r.scored]
    n_passed = sum(r.passed for r in scored)
    errors: dict[str, int] = defaultdict(int)
    for r in final:
        if r.error is not None:
            errors[r.error.kind] += 1
    by_cat: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in scored:
        by_cat[r.category].append(r)
    # One reading of an outcome for both figures: a scored failure is a 0 here as it is a
    # failure in the pass rate (and a 0 in training); unscored attempts are in neither.
    rewards = [r.score for r in scored if r.score is not None]
    metrics = RunMetrics(
        pass_rate=n_passed / len(scored) if scored else None,
        pass_rate_ci95=wilson_interval(n_passed, len(scored)),
        mean_reward=sum(rewards) / len(rewards) if rewards else None,
        mean_reward_n=len(rewards),
        n_tasks=len({r.task for r in final}),
        n_attempts=len(final),
        n_scored=len(scored),
        n_passed=n_passed,
        by_category={
            name: CategoryMetrics(
                pass_rate=sum(r.passed for r in rs) / len(rs),
                n=len(rs),
                n_passed=sum(r.passed for r in rs),
            )
            for name, rs in sorted(by_cat.items())
        },
        errors=dict(errors),
        timings=phase_timings(final),
    )
    if attempts > 1:
        per_task: dict[str, list[TrialRecord]] = defaultdict(list)
        for r in scored:
            per_task[r.task].append(r)
        metrics.pass_at_k = {}
        for k in range(1, attempts + 1):
            values = [
                pass_at_k(len(rs), sum(r.passed for r in rs), k)
                for rs in per_task.values()
                if len(rs) >= k
            ]
            if values:
                metrics.pass_at_k[str(k)] = sum(values) / len(values)
    return metrics
