"""`clotho eval` retries, within the run, attempts the infrastructure lost (and only those):
real bubblewrap sandboxes, real failures of the local backend, one results line per attempt."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import get_args

import pytest
from tests.conftest import TaskFactory, requires_bwrap
from tests.support import wait_for_value, wait_until

from clotho.errors import ErrorInfo, ErrorKind
from clotho.rollout.run import RetryBudget
from clotho.runs.eval import run_eval
from clotho.runs.records import EvalConfig, TrialRecord
from clotho.runs.schedule import retry_budget
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.host import cgroups
from clotho.sandbox.local.backend import LocalBackend


def _lines(out: Path) -> list[TrialRecord]:
    text = (out / "results.jsonl").read_text()
    return [TrialRecord.model_validate_json(line) for line in text.splitlines()]


def test_only_infra_errors_are_retried_and_the_budget_holds() -> None:
    budget = RetryBudget(per_attempt=2, total=3)
    for kind in get_args(ErrorKind):
        if kind != "infra":
            assert not budget.take(ErrorInfo(kind=kind, message="x"), 1), kind
    assert not budget.take(None, 1)
    infra = ErrorInfo(kind="infra", message="node lost")
    assert budget.take(infra, 1) and budget.take(infra, 2)
    assert not budget.take(infra, 3), "two retries per attempt at most"
    assert budget.take(infra, 1)
    assert not budget.take(infra, 1), "the run's budget of 3 is spent"
    assert budget.used == 3
    default = retry_budget(EvalConfig(paths=["x"], concurrency=4), pending=40)
    assert (default.per_attempt, default.left) == (2, 10)


def _two_tasks_and_a_blocker(make_task: TaskFactory, tmp_path: Path) -> tuple[Path, Path]:
    """Tasks a and b, and a file where the sandboxes' state folder's parent should be: the
    local backend fails to make their folders (an infra error) until the file goes."""
    tasks = tmp_path / "tasks"
    make_task("a", root=tasks)
    make_task("b", root=tasks)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the state folder's parent should be")
    return tasks, blocker


@requires_bwrap
async def test_a_sandbox_that_cannot_be_made_is_retried_within_the_run(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    """The local backend cannot make the sandbox's folder (its parent is a file: a real
    failure, while acquiring, so an infra error); the run repairs it when it hears of the
    retry, and the retry passes. One line per attempt; the lost try is kept apart."""
    tasks, blocker = _two_tasks_and_a_blocker(make_task, tmp_path)
    state = blocker / "state"
    out = tmp_path / "run"
    events: list[tuple[str, object]] = []

    def listen(event: str, data: object) -> None:
        events.append((event, data))
        if event == "trial_retry" and blocker.is_file():
            blocker.unlink()
            state.mkdir(parents=True)

    config = EvalConfig(
        paths=[str(tasks)],
        agent="oracle",
        concurrency=1,
        prewarm=False,
        sandbox=LocalSandboxConfig(state_dir=str(state)),
    )
    metrics = await run_eval(config, out, listener=listen)

    records = _lines(out)
    assert sorted(r.key for r in records) == [("a", 0), ("b", 0)], "one line per attempt"
    assert all(r.passed and r.error is None for r in records), records
    # `a` failed first; `b` may have started before the repair (then it was retried too).
    first = next(r for r in records if r.task == "a")
    assert [e.kind for e in first.lost_tries] == ["infra"]
    assert "Not a directory" in first.lost_tries[0].message
    retried = [d for e, d in events if e == "trial_retry"]
    assert len(retried) == sum(len(r.lost_tries) for r in records)
    assert all(isinstance(d, TrialRecord) and d.error and d.error.kind == "infra" for d in retried)
    assert len([e for e, _ in events if e == "trial_end"]) == 2
    lost_detail = json.loads((out / "trials" / "a__0.lost1.json").read_text())
    assert lost_detail["record"]["error"]["kind"] == "infra"
    assert (metrics.n_attempts, metrics.n_scored, metrics.n_passed) == (2, 2, 2)
    assert metrics.errors == {}
    assert _sandbox_folders(state) == [], "no sandbox folder left"


@requires_bwrap
async def test_past_the_budget_infra_failures_are_recorded_for_resume(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    tasks, blocker = _two_tasks_and_a_blocker(make_task, tmp_path)
    out = tmp_path / "run"
    config = EvalConfig(
        paths=[str(tasks)],
        agent="oracle",
        concurrency=2,
        prewarm=False,
        retry_budget=1,
        sandbox=LocalSandboxConfig(state_dir=str(blocker / "state")),
    )
    metrics = await run_eval(config, out)
    records = _lines(out)
    assert sorted(r.key for r in records) == [("a", 0), ("b", 0)]
    assert all(r.error is not None and r.error.kind == "infra" for r in records)
    assert sorted(len(r.lost_tries) for r in records) == [0, 1], "one retry in the whole run"
    assert metrics.errors == {"infra": 2} and metrics.n_scored == 0


def _sandbox_folders(state: Path) -> list[Path]:
    """What the state folder holds but the local backend's own caches (named .clotho-*)."""
    return [f for f in state.iterdir() if not f.name.startswith(".clotho-")]


def _kill_sandbox_of(state: Path, marker: str) -> str:
    """From the host: wait for a sandbox whose /app holds `marker`, SIGKILL every process in
    its cgroup (its shell, bubblewrap, the solution) and say which folder it was."""

    def started() -> str | None:
        return next((f.name for f in state.iterdir() if (f / "app" / marker).exists()), None)

    name = wait_for_value(started, timeout=120)
    assert cgroups.SandboxCgroups(name).kill(cgroups.AGENT) > 0
    return name


class _HealthProbe:
    """Test double for the local backend's health probe only (the local backend has no daemon
    that can go down): reports the backend down while `down` is set. Sandboxes, their
    processes and the failure itself are real."""

    def __init__(self) -> None:
        self.down = False
        self.asked = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        async def healthy(backend: LocalBackend, sandbox: object = None) -> bool:
            self.asked += 1
            return not self.down

        monkeypatch.setattr(LocalBackend, "healthy", healthy)


# Says it started, then waits for /app/go: the kill always lands before it can finish.
SLOW_SOLVE = (
    "touch /app/started\nuntil [ -e /app/go ]; do sleep 0.05; done\necho ok > /app/done.txt\n"
)


def _release_all_but(state: Path, killed: str) -> None:
    """Let every started solution but the killed sandbox's go on (the retry's)."""
    for folder in state.iterdir():
        app = folder / "app"
        if folder.name != killed and (app / "started").is_file() and not (app / "go").exists():
            with contextlib.suppress(OSError):  # removed meanwhile
                (app / "go").touch()


@requires_bwrap
@pytest.mark.skipif(not cgroups.available(), reason="needs cgroups v1 (root) to kill a sandbox")
async def test_a_sandbox_killed_while_its_backend_is_down_is_retried_and_passes(
    make_task: TaskFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = tmp_path / "tasks"
    make_task("slow", root=tasks, solve_sh=SLOW_SOLVE)
    state = tmp_path / "state"
    state.mkdir()
    probe = _HealthProbe()
    probe.install(monkeypatch)
    out = tmp_path / "run"
    config = EvalConfig(
        paths=[str(tasks)],
        agent="oracle",
        concurrency=1,
        sandbox=LocalSandboxConfig(state_dir=str(state)),
    )

    async def host_failure() -> str:
        killed = await asyncio.to_thread(_kill_sandbox_of, state, "started")
        probe.down = True  # the backend is down when the rollout asks, as with a daemon
        return killed

    killer = asyncio.create_task(host_failure())

    def listen(event: str, data: object) -> None:
        if event == "trial_retry":
            probe.down = False  # back up before the retry

    run = asyncio.create_task(run_eval(config, out, listener=listen))
    killed = await killer

    def released_until_done() -> bool:
        _release_all_but(state, killed)
        return run.done()

    assert await wait_until(released_until_done, timeout=300)
    metrics = await run
    records = _lines(out)
    assert len(records) == 1, "one line for the attempt, the lost try superseded"
    (record,) = records
    assert record.passed and record.error is None, record
    assert [e.kind for e in record.lost_tries] == ["infra"], record.lost_tries
    assert probe.asked >= 1
    assert (metrics.n_attempts, metrics.n_passed, metrics.errors) == (1, 1, {})
    assert not (state / killed).exists(), "the killed sandbox's folder was removed"
    assert _sandbox_folders(state) == []


@requires_bwrap
async def test_a_sandbox_the_agent_breaks_is_its_failure_and_never_retried(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    """The solution kills its own session shell while the backend is healthy: an `agent`
    error, scored as a failure, run once (a retry would let an agent re-roll its failures)."""
    tasks = tmp_path / "tasks"
    make_task("breaks", root=tasks, solve_sh="kill -9 -1\nsleep 5\n")
    out = tmp_path / "run"
    events: list[str] = []
    config = EvalConfig(paths=[str(tasks)], agent="oracle", concurrency=1, retries=2)
    metrics = await run_eval(config, out, listener=lambda e, d: events.append(e))
    (record,) = _lines(out)
    assert record.error is not None and record.error.kind == "agent", record.error
    assert "backend is healthy" in record.error.message
    assert record.lost_tries == [] and "trial_retry" not in events
    assert not list((out / "trials").glob("*.lost*"))
    assert (metrics.n_scored, metrics.n_passed) == (1, 0)
