"""Writing an environment's evaluation as a run directory, like `clotho eval` does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from clotho.env.evaluation import EvalSample
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import RunMetrics, TrialDetail, TrialRecord
from clotho.runs.store import RunStore


async def write_evaluation(samples: list[EvalSample], out: Path, agent: str) -> RunMetrics:
    """The same layout as `clotho eval`: results.jsonl, trials/*.json and metrics.json."""
    store = RunStore(out)
    store.prepare(resume=False)
    for sample in samples:
        record = TrialRecord.from_outcome(
            sample.rollout,
            task=sample.name,
            category=sample.category,
            attempt=sample.attempt,
            agent=agent,
        )
        record.lost_tries = list(sample.rollout.lost_tries)  # retried in the run, as in eval
        await store.append(record, TrialDetail.of(record, sample.rollout))
    metrics = compute_metrics(await asyncio.to_thread(store.load_records))
    store.write_metrics(metrics)
    return metrics
