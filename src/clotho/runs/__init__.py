"""Evaluation runs: run directory, streamed results, resume and metrics."""

from clotho.runs.eval import run_eval
from clotho.runs.metrics import compute_metrics, pass_at_k
from clotho.runs.records import EvalConfig, RunMetrics, TrialRecord

__all__ = ["EvalConfig", "RunMetrics", "TrialRecord", "compute_metrics", "pass_at_k", "run_eval"]
