"""Generated run directories and group files, for the viewer's tests, benchmark and screenshots.

Everything is built from the real on-disk models (`EvalConfig`, `TrialRecord`,
`TrialDetail`, `ScoredGroup`), so what the viewer reads here is what `clotho eval` and
`clotho process` write.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clotho.agent.result import AgentResult, ToolErrorRecord, TurnTiming
from clotho.chat.ledger import TokenSequence
from clotho.chat.types import Usage
from clotho.env.scored import GroupStats, ScoredGroup
from clotho.errors import ErrorInfo
from clotho.rollout import PhaseTimings, VerifierOutcome
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import EvalConfig, TrialDetail, TrialRecord
from clotho.runs.store import _safe

CATEGORIES = ["files", "text-processing", "git", "software-engineering", "data", "sysadmin"]
ERROR_KINDS = ["agent", "limit", "verifier", "infra", "task"]


Encode = Callable[[str], list[int]]


def encoder(tokenizer: str | Path | None) -> Encode | None:
    """A tokenizer.json (or its folder) as an encode function; None without one."""
    if tokenizer is None:
        return None
    from tokenizers import Tokenizer

    path = Path(tokenizer)
    loaded = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
    return lambda text: loaded.encode(text).ids


def _sequence(messages: list[dict[str, Any]], rng: random.Random, encode: Encode) -> TokenSequence:
    """The conversation in ChatML, assistant turns trained (as a token API records them)."""
    seq = TokenSequence()
    for m in messages:
        body = m.get("content") or ""
        for call in m.get("tool_calls") or []:
            body += "\n<tool_call>\n" + json.dumps(call["function"]) + "\n</tool_call>"
        head = encode(f"<|im_start|>{m['role']}\n")
        if m["role"] == "assistant":
            seq.extend(head)
            ids = encode(body + "<|im_end|>")
            seq.extend(ids, [-rng.random() * 1.5 for _ in ids])
            seq.extend(encode("\n"))
        else:
            seq.extend(head + encode(body + "<|im_end|>\n"))
    return seq


def _conversation(
    task: str, rng: random.Random, passed: bool, long_output: bool, encode: Encode | None = None
) -> AgentResult:
    listing = "\n".join(
        f"-rw-r--r-- 1 root root {rng.randint(10, 9999):5d} file_{i}.txt"
        for i in range(80 if long_output else 4)
    )
    messages = [
        {"role": "system", "content": "You are an agent in a Linux sandbox. Use the tools."},
        {"role": "user", "content": f"Task {task}: make the tests in /tests pass."},
        {
            "role": "assistant",
            "content": "Let me look at the workspace first.",
            "reasoning_content": "I should list /app before changing anything.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "terminal",
                        "arguments": json.dumps({"command": "ls -l /app"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "terminal", "content": listing},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {
                        "name": "edit_file",
                        "arguments": json.dumps({"path": "/app/main.py", "old": "x", "new": "y"}),
                    },
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_2",
            "name": "edit_file",
            "content": "ok" if passed else "error: /app/main.py: 'x' not found",
        },
        {"role": "assistant", "content": "Done: the file is fixed." if passed else "I give up."},
    ]
    if encode is not None:
        seq = _sequence(messages, rng, encode)
    else:
        seq = TokenSequence()
        seq.extend([rng.randint(100, 150000) for _ in range(40)])
        seq.extend(
            [rng.randint(100, 150000) for _ in range(25)], [-rng.random() * 2 for _ in range(25)]
        )
        seq.extend([rng.randint(100, 150000) for _ in range(12)])
        seq.extend(
            [rng.randint(100, 150000) for _ in range(18)], [-rng.random() for _ in range(18)]
        )
    return AgentResult(
        messages=messages,
        turns=3,
        stop_reason="finished",
        reasoning=["I should list /app before changing anything.", None, None],
        tool_calls=2,
        tool_errors=[]
        if passed
        else [
            ToolErrorRecord(
                turn=2,
                tool="edit_file",
                arguments='{"path": "/app/main.py"}',
                error="/app/main.py: 'x' not found",
            )
        ],
        usage=Usage(prompt_tokens=1800, completion_tokens=230, total_tokens=2030),
        timings=[TurnTiming(model_s=1.2, tools_s=0.1)] * 3,
        duration_s=4.2,
        sequences=[seq],
    )


def _verifier_output(passed: bool) -> str:
    second = "PASSED" if passed else "FAILED"
    return (
        "============================= test session starts ==============================\n"
        "tests/test_outputs.py::test_file_exists PASSED                           [ 50%]\n"
        f"tests/test_outputs.py::test_content {second}                              [100%]\n"
        "=========================== short test summary info ============================\n"
        f"{'1 failed, 1 passed' if not passed else '2 passed'} in 0.12s\n"
    )


def write_run(
    root: Path,
    n_trials: int,
    *,
    seed: int = 0,
    attempts: int = 1,
    pass_prob: float = 0.6,
    details: bool = True,
    agent: str = "llm",
    model: str = "Qwen/Qwen3-8B",
    finished: bool = True,
    tokenizer: str | Path | None = None,
) -> Path:
    """A run directory of `n_trials` attempts over `n_trials // attempts` tasks."""
    rng = random.Random(seed)
    encode = encoder(tokenizer)
    root.mkdir(parents=True, exist_ok=True)
    (root / "trials").mkdir(exist_ok=True)
    config = EvalConfig.model_validate(
        {
            "paths": ["examples/tasks"],
            "agent": agent,
            "attempts": attempts,
            "model": {"model": model},
        }
    )
    (root / "config.json").write_text(config.model_dump_json(indent=2))
    records: list[TrialRecord] = []
    now = 1_790_000_000.0
    with (root / "results.jsonl").open("w") as results:
        for i in range(n_trials):
            task_no, attempt = divmod(i, attempts)
            task = f"task-{task_no:05d}"
            record = trial_record(task, attempt, rng, pass_prob=pass_prob, agent=agent)
            record.finished_at = now + i * 0.5
            if details:
                name = f"{_safe(task)}__{attempt}.json"
                record.detail = f"trials/{name}"
                detail = trial_detail(record, rng, long_output=i % 3 == 0, encode=encode)
                (root / "trials" / name).write_text(detail.model_dump_json())
            results.write(record.model_dump_json() + "\n")
            records.append(record)
    if finished:
        metrics = compute_metrics(records, attempts=attempts)
        metrics.duration_s = n_trials * 0.5
        (root / "metrics.json").write_text(metrics.model_dump_json(indent=2))
    return root


def trial_record(
    task: str, attempt: int, rng: random.Random, *, pass_prob: float = 0.6, agent: str = "llm"
) -> TrialRecord:
    # The task's own seed decides its category and difficulty, so runs agree on them.
    task_rng = random.Random(task)
    category = task_rng.choice(CATEGORIES)
    passed = rng.random() < pass_prob * (0.5 + task_rng.random())
    error = None
    if not passed and rng.random() < 0.3:
        kind = rng.choice(ERROR_KINDS)
        error = ErrorInfo(kind=kind, message=f"{kind} error in {task}: something went wrong")  # type: ignore[arg-type]
    agent_s = rng.uniform(2, 40)
    timings = PhaseTimings(
        acquire_s=round(rng.uniform(0.001, 0.05), 4),
        setup_s=round(rng.uniform(0.01, 0.3), 4),
        agent_s=round(agent_s, 4),
        model_s=round(agent_s * 0.8, 4),
        tools_s=round(agent_s * 0.15, 4),
        verify_s=round(rng.uniform(0.2, 3), 4),
        release_s=round(rng.uniform(0.001, 0.02), 4),
    )
    return TrialRecord(
        task=task,
        category=category,
        attempt=attempt,
        reward=(1.0 if passed else 0.0) if error is None or error.scored else None,
        passed=passed,
        error=error,
        stop_reason="finished",
        turns=rng.randint(1, 30),
        tool_calls=rng.randint(0, 40),
        tool_errors=0 if passed else rng.randint(0, 3),
        duration_s=round(sum(timings.model_dump().values()) - timings.model_s - timings.tools_s, 3),
        agent=agent,
        timings=timings,
    )


def trial_detail(
    record: TrialRecord,
    rng: random.Random,
    *,
    long_output: bool = False,
    encode: Encode | None = None,
) -> TrialDetail:
    agent = _conversation(record.task, rng, record.passed, long_output, encode)
    verifier = VerifierOutcome(
        reward=record.reward or 0.0,
        exit_code=0 if record.passed else 1,
        output=_verifier_output(record.passed),
        duration_s=record.timings.verify_s,
    )
    return TrialDetail(record=record, agent_result=agent, verifier=verifier)


def append_trials(root: Path, start: int, n: int, *, seed: int = 1) -> None:
    """Append `n` more attempts to a run's results.jsonl, as a run still going does."""
    rng = random.Random(seed)
    with (root / "results.jsonl").open("a") as results:
        for i in range(start, start + n):
            record = trial_record(f"task-{i:05d}", 0, rng)
            results.write(record.model_dump_json() + "\n")


def write_groups(
    path: Path,
    n_groups: int,
    *,
    group_size: int = 4,
    seed: int = 0,
    tokenizer: str | Path | None = None,
) -> Path:
    """A `clotho process` JSONL of scored groups and its `.stats.json`."""
    rng = random.Random(seed)
    encode = encoder(tokenizer)
    lines = []
    for g in range(n_groups):
        tokens, masks, logprobs, messages, scores = [], [], [], [], []
        for r in range(group_size):
            result = _conversation(
                f"item-{g}", rng, passed=(r + g) % 2 == 0, long_output=False, encode=encode
            )
            seq = result.sequences[0] if result.sequences else TokenSequence()
            tokens.append(seq.tokens)
            masks.append(seq.masks)
            logprobs.append(seq.logprobs)
            messages.append(result.messages)
            scores.append(1.0 if (r + g) % 2 == 0 else 0.0)
        group = ScoredGroup(
            tokens=tokens,
            masks=masks,
            scores=scores,
            messages=messages,
            inference_logprobs=logprobs,
        )
        lines.append(group.model_dump_json())
    path.write_text("".join(line + "\n" for line in lines))
    stats = GroupStats(
        groups=n_groups + 3,
        groups_sent=n_groups,
        dropped_too_few_valid=1,
        dropped_same_scores=2,
        rollouts=(n_groups + 3) * group_size,
        infra_errors=2,
    )
    path.with_suffix(".stats.json").write_text(stats.model_dump_json(indent=2))
    return path
