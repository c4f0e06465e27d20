"""Writing an environment's evaluation as a run directory, like `clotho eval` does."""

from __future__ import annotations

import time
from pathlib import Path

from clotho.env.evaluation import EvalSample
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import RunMetrics, TrialDetail, TrialRecord
from clotho.runs.store import RunStore


def write_evaluation(
    samples: list[EvalSample], out: Path, agent: str, threshold: float = 1.0
) -> RunMetrics:
    """The same layout as `clotho eval`: results.jsonl, trials/*.json and metrics.json."""
    store = RunStore(out)
    store.prepare(resume=False)
    for sample in samples:
        r = sample.rollout
        result = r.agent
        record = TrialRecord(
            task=sample.name,
            category=sample.category,
            attempt=sample.attempt,
            reward=r.reward,
            passed=r.error is None and r.reward is not None and r.reward >= threshold,
            error=r.error,
            stop_reason=result.stop_reason if result else None,
            turns=result.turns if result else 0,
            tool_calls=result.tool_calls if result else 0,
            tool_errors=len(result.tool_errors) if result else 0,
            duration_s=round(result.duration_s, 3) if result else 0.0,
            agent=agent,
            finished_at=time.time(),
        )
        store.append(record, TrialDetail(record=record, agent_result=result))
    metrics = compute_metrics(store.load_records())
    store.write_metrics(metrics)
    return metrics
