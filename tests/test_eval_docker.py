"""End to end: `clotho eval --sandbox docker` and `clotho sandbox ls|gc` as a user runs them.

Skipped with the reason shown when no Docker daemon answers; in CI (CI=true), where the
daemon is set up on purpose, its absence fails the tests instead.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import DOCKER_PROBLEM, IN_CI, requires_docker  # noqa: F401
from tests.support import run_clotho, wait_until_sync

from clotho.sandbox.docker.images import context_hash
from clotho.sandbox.host.leases import OWNER

pytestmark = requires_docker


@pytest.fixture(autouse=True)
def _docker_answers() -> None:
    if DOCKER_PROBLEM is not None:  # only reached in CI: elsewhere the module is skipped
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")


def clotho(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return run_clotho(*args, env={"COLUMNS": "300", **(env or {})}, timeout=timeout)


def results(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def docker_call(method: str, *args: Any, **kwargs: Any) -> Any:
    """Run one aiodocker coroutine (`containers.list`, `images.inspect`, ...) to completion."""
    import aiodocker

    async def call() -> Any:
        docker = aiodocker.Docker()
        try:
            target: Any = docker
            for part in method.split("."):
                target = getattr(target, part)
            return await target(*args, **kwargs)
        finally:
            await docker.close()

    return asyncio.run(call())


def run_containers(out: Path) -> list[dict[str, Any]]:
    """Containers of the run writing to `out` (its run label is `<out name>-<random>`)."""
    listed = docker_call("containers.list", all=True, filters={"label": ["clotho=1"]})
    return [
        c._container
        for c in listed
        if (c._container.get("Labels") or {}).get("clotho.run", "").startswith(f"{out.name}-")
    ]


def image_exists(tag: str) -> bool:
    from aiodocker.exceptions import DockerError

    try:
        docker_call("images.inspect", tag)
    except DockerError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def wait_for(predicate, timeout: float, what: str) -> None:
    assert wait_until_sync(predicate, timeout), f"timed out waiting for {what}"


def ls_rows(ids: list[str], state_dir: Path) -> dict[str, list[str]]:
    """`clotho sandbox ls` rows (their cells) of those of the given container ids it lists."""
    proc = clotho("sandbox", "ls", "--state-dir", str(state_dir))
    assert proc.returncode == 0, proc.stderr
    assert "not listed" not in proc.stdout, proc.stdout  # Docker was asked: absent means gone
    rows = {}
    for line in proc.stdout.splitlines():
        for cid in ids:
            if cid[:12] in line:
                rows[cid] = [cell.strip() for cell in line.strip().strip("│").split("│")]
    return rows


def container_gone(cid: str) -> bool:
    import aiodocker
    from aiodocker.exceptions import DockerError

    async def show() -> bool:
        docker = aiodocker.Docker()
        try:
            await docker.containers.container(cid).show()
        except DockerError as exc:
            if exc.status == 404:
                return True
            raise
        finally:
            await docker.close()
        return False

    return asyncio.run(show())


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / f"run-{secrets.token_hex(4)}"


# --- the bundled tasks -----------------------------------------------------------------------


@pytest.mark.parametrize("agent", ["oracle", "nop"])
def test_bundled_tasks_in_docker(examples_dir: Path, out: Path, agent: str) -> None:
    proc = clotho(
        "eval", str(examples_dir), "--agent", agent, "--sandbox", "docker", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    rows = results(out)
    tasks = sorted(p.name for p in examples_dir.iterdir() if (p / "task.toml").is_file())
    assert len(tasks) >= 10
    assert sorted(r["task"] for r in rows) == tasks
    for row in rows:
        assert row["error"] is None, row
        assert row["passed"] is (agent == "oracle"), row
        assert row["reward"] == (1.0 if agent == "oracle" else 0.0), row
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_rate"] == (1.0 if agent == "oracle" else 0.0)
    assert json.loads((out / "config.json").read_text())["sandbox"]["backend"] == "docker"
    # Each task has its image built from environment/Dockerfile (the oracle passing shows the
    # workspace came from it: a Dockerfile task gets no upload) ...
    for name in tasks:
        assert image_exists(
            f"clotho-env/{name}:{context_hash(examples_dir / name / 'environment')[:16]}"
        )
    # ... and no container outlives the run.
    assert run_containers(out) == []


def test_failing_image_build_is_a_task_error_not_retried(
    make_task, tmp_path: Path, out: Path
) -> None:
    make_task("good-1")
    make_task("good-2")
    token = secrets.token_hex(4)
    make_task(
        "broken-env",
        env_files={
            "Dockerfile": f"FROM clotho/base:bookworm\nRUN echo about-to-fail-{token} && exit 3\n"
        },
    )
    proc = clotho(
        "eval",
        str(tmp_path / "tasks"),
        "--agent",
        "oracle",
        "--sandbox",
        "docker",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    by_task = {r["task"]: r for r in results(out)}
    assert set(by_task) == {"good-1", "good-2", "broken-env"}
    assert by_task["good-1"]["passed"] is True and by_task["good-2"]["passed"] is True
    broken = by_task["broken-env"]
    assert broken["passed"] is False and broken["reward"] is None
    assert broken["error"]["kind"] == "task"
    assert "environment" in broken["error"]["message"]
    assert "non-zero code: 3" in broken["error"]["message"]
    assert f"about-to-fail-{token}" in broken["error"]["message"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass_rate"] == 1.0 and metrics["errors"] == {"task": 1}
    assert run_containers(out) == []
    # --resume does not build it again: a broken Dockerfile stays broken
    again = clotho("eval", "--out", str(out), "--resume")
    assert again.returncode == 0, again.stderr
    assert len(results(out)) == 3


# --- interrupted runs ------------------------------------------------------------------------


def start_eval(tasks: Path, out: Path, log: Path, concurrency: int) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "clotho", "eval", str(tasks), "--agent", "oracle",
             "--sandbox", "docker", "--concurrency", str(concurrency), "--out", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )  # fmt: skip


def running(out: Path) -> list[dict[str, Any]]:
    return [c for c in run_containers(out) if c.get("State") == "running"]


def test_sigkill_leaves_orphans_that_gc_removes(make_task, tmp_path: Path, out: Path) -> None:
    """SIGKILL skips every cleanup: the run's containers are orphans until `clotho sandbox gc`.

    Another clotho process on this daemon (a second suite, a user's run) may reap them first:
    its pool removes dead runs' containers when it starts, as it should. So the run's own
    containers are named while it lives (by their ids and its owner label), and each is, after
    the kill, either listed as an orphan or already gone; after gc, all are gone.
    """
    make_task("slow-1", solve_sh="sleep 120\n")
    make_task("slow-2", solve_sh="sleep 120\n")
    state = tmp_path / "state"  # local sandboxes: none of ours, and nobody else's either
    state.mkdir()
    proc = start_eval(tmp_path / "tasks", out, tmp_path / "eval.log", concurrency=2)
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        wait_for(lambda: len(running(out)) == 2, 60, "two running containers")
        containers = running(out)
        ids = [c["Id"] for c in containers]
        run = containers[0]["Labels"]["clotho.run"]
        assert {c["Labels"]["clotho.task"] for c in containers} == {"slow-1", "slow-2"}
        assert all(c["Labels"][OWNER] == owner for c in containers), containers
        rows = ls_rows(ids, state)
        assert set(rows) == set(ids)  # a live owner's containers: nobody reaps them
        for cells in rows.values():
            assert cells[-1] == "", cells  # the owner is alive: not an orphan
            assert cells[3] == "True", cells
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # No cleanup ran, and the dead run made nothing more: what is left of it is its own.
    left = run_containers(out)
    assert {c["Id"] for c in left} <= set(ids), left
    assert all(c["Labels"][OWNER] == owner for c in left), left
    # `ls` calls each an orphan, unless another process's pool reaped it first (then it is gone).
    rows = ls_rows(ids, state)
    for cid in ids:
        if cid in rows:
            assert rows[cid][-1] == "yes", rows[cid]
            assert rows[cid][3] == "False", rows[cid]
        else:
            assert container_gone(cid), cid
    gc = clotho("sandbox", "gc", "--state-dir", str(state))
    assert gc.returncode == 0, gc.stderr
    assert "not checked" not in gc.stdout, gc.stdout
    # (its count includes other dead runs' leftovers, and not ours a reaper took first)
    assert gc.stdout.startswith("removed "), gc.stdout
    assert all(container_gone(cid) for cid in ids)
    assert docker_call("containers.list", all=True, filters={"label": [f"clotho.run={run}"]}) == []
    assert not set(ls_rows(ids, state))


def test_sigterm_keeps_results_and_leaves_no_container(
    make_task, tmp_path: Path, out: Path
) -> None:
    make_task("quick-1")
    make_task("quick-2")
    make_task("slow-1", solve_sh="sleep 120\n")
    make_task("slow-2", solve_sh="sleep 120\n")
    log = tmp_path / "eval.log"
    proc = start_eval(tmp_path / "tasks", out, log, concurrency=4)
    try:
        wait_for(
            # >= 2: the pool may keep a quick task's container warm, or start its replacement.
            lambda: len(results(out)) == 2 and len(running(out)) >= 2,
            60,
            "the quick tasks to finish while the slow ones run",
        )
        run = run_containers(out)[0]["Labels"]["clotho.run"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    assert "interrupted" in stderr and "--resume" in stderr
    assert sorted(r["task"] for r in results(out)) == ["quick-1", "quick-2"]
    assert all(r["passed"] for r in results(out))
    assert json.loads((out / "metrics.json").read_text())["n_passed"] == 2
    assert docker_call("containers.list", all=True, filters={"label": [f"clotho.run={run}"]}) == []
