"""Dependencies installed once per (repo, commit, install_cmd, sandbox kind) and copied into
later rollouts: real bubblewrap sandboxes and real containers, the bundled toy repositories.

The install command writes a module with a random nonce under HOME (a place every backend
lets a sandbox write: a local sandbox cannot write the host's site-packages, an isolated
Docker slot not the container's) and a file into the testbed: a rollout that shows the
first rollout's nonce got the cached copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import DOCKER_PROBLEM, requires_docker
from tests.support import running, wait_until
from tests.test_swe import Script

from clotho.agent.reference import OracleAgent
from clotho.errors import SandboxError, TaskError
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.swe.examples import TOY_INSTANCES
from clotho.swe.install_cache import InstallCache, InstallCacheOptions
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.repos import RepoCache
from clotho.swe.trial import SweTrial
from clotho.tasks.trial import run_trial

SITE = '"$HOME/deps"'
INSTALL = (
    f'd={SITE} && mkdir -p "$d" && '
    "printf \"NONCE = '%s'\\n\" \"$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n')\" "
    '> "$d/clotho_dep.py" && echo built > built.flag'
)
SHOW = (
    "PYTHONPATH=$HOME/deps python3 -c 'import clotho_dep; print(clotho_dep.NONCE)'; cat built.flag"
)


pytest_plugins = ("tests.swe_fixtures",)  # toys, options


def record(install_cmd: str = INSTALL) -> dict:
    first = json.loads(TOY_INSTANCES.read_text().splitlines()[0])
    return first | {"install_cmd": install_cmd}


def make_trial(options: SweOptions, cache: RepoCache | None = None, **fields: str) -> SweTrial:
    cache = cache or RepoCache(options.cache_path(), repos_dir=Path(options.repos_dir or "."))
    cache.network = False
    return SweTrial(SweInstance.model_validate(record(**fields)), options, cache)


def tar_digest(installs: InstallCache) -> dict[str, str]:
    return {
        p.parent.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (installs.root / "installs").glob("*/deps.tar")
    }


POISON = (
    f'd={SITE} && echo "NONCE = \'poisoned\'" > "$d/clotho_dep.py" && echo poisoned > '
    'built.flag && mkdir -p "$d/evil" && echo "import os" > "$d/evil.pth"'
)


async def _second_rollout_restores_and_poison_stays_private(
    options: SweOptions, config: SandboxConfig
) -> None:
    trial = make_trial(options)
    installs = trial.installs
    async with SlotPool(PoolConfig(max_size=4)) as pool:
        first = Script(SHOW, POISON, SHOW, name="poisoner")
        second = Script(SHOW, name="reader")
        one = await run_trial(trial, first, config, pool)
        cached = tar_digest(installs)
        two = await run_trial(trial, second, config, pool)
        oracle = await run_trial(trial, OracleAgent(), config, pool)
    assert one.error is None and two.error is None, (one.error, two.error)
    assert installs.installs == 1 and installs.restores == 2
    nonce, built = first.outputs[0].split()
    assert len(nonce) == 16 and built == "built"
    assert first.outputs[2].split() == ["poisoned", "poisoned"]  # it did poison its own copy
    assert second.outputs[0].split() == [nonce, "built"]  # the next rollout never saw it
    assert tar_digest(installs) == cached and len(cached) == 1
    assert oracle.error is None and oracle.reward == 1.0


@requires_bwrap
async def test_second_rollout_restores_and_an_agent_cannot_poison_it(options: SweOptions) -> None:
    await _second_rollout_restores_and_poison_stays_private(options, LocalSandboxConfig())


@requires_bwrap
async def test_concurrent_first_rollouts_install_once(options: SweOptions) -> None:
    """Six rollouts start together, from two InstallCache objects sharing the folder (as two
    processes would): one install, everyone has its nonce."""
    a = make_trial(options)
    b = make_trial(options, RepoCache(options.cache_path(), repos_dir=Path(options.repos_dir)))
    assert a.installs is not b.installs
    readers = [Script(SHOW, name=f"r{i}") for i in range(6)]
    async with SlotPool(PoolConfig(max_size=6)) as pool:
        outcomes = await asyncio.gather(
            *(
                run_trial(a if i % 2 else b, agent, LocalSandboxConfig(), pool)
                for i, agent in enumerate(readers)
            )
        )
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    assert a.installs.installs + b.installs.installs == 1
    assert a.installs.restores + b.installs.restores == 5
    assert len({r.outputs[0] for r in readers}) == 1


@requires_bwrap
async def test_failing_install_is_a_task_error_remembered_not_a_zero(options: SweOptions) -> None:
    trial = make_trial(options, install_cmd="echo 'no compiler here' >&2; exit 7")
    async with SlotPool() as pool:
        one = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
        two = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
    for outcome in (one, two):
        assert outcome.reward is None
        assert outcome.error is not None and outcome.error.kind == "task"
        assert "install_cmd failed (exit code 7)" in outcome.error.message
        assert "no compiler here" in outcome.error.message
    assert "remembered" in two.error.message
    assert trial.installs.installs == 1


@requires_bwrap
async def test_timed_out_install_is_a_task_error(options: SweOptions) -> None:
    options = options.model_copy(update={"install_timeout_s": 1.0})
    trial = make_trial(options, install_cmd="sleep 30")
    async with SlotPool() as pool:
        box = await pool.acquire(LocalSandboxConfig(workdir="/testbed"))
        try:
            with pytest.raises(TaskError, match="timed out after 1 s"):
                await trial.prepare(box)
        finally:
            await pool.release(box)


@requires_bwrap
async def test_a_sandbox_that_dies_during_install_is_infra_and_not_remembered(
    options: SweOptions,
) -> None:
    """The sandbox goes away while the install runs (as a lost host or daemon would): a
    SandboxError (infra, retried), and the next rollout installs again instead of failing
    from memory."""
    # A duration no other process uses: its `sleep` is found in the process table by it.
    marker = f"600.{secrets.randbelow(10**9):09d}"
    trial = make_trial(options, install_cmd=f"sleep {marker}")
    async with SlotPool() as pool:
        box = await pool.acquire(LocalSandboxConfig(workdir="/testbed"))
        try:
            preparing = asyncio.create_task(trial.prepare(box))
            assert await wait_until(lambda: running(["sleep", marker]))  # the install runs
            await box.close()
            with pytest.raises(SandboxError):
                await preparing
        finally:
            await pool.release(box)
    assert trial.installs.installs == 1
    assert not list((trial.installs.root / "installs").glob("*/failed.json"))
    good = make_trial(options, trial.cache, install_cmd="sleep 30")
    good.options = options.model_copy(update={"install_timeout_s": 0.5})
    async with SlotPool() as pool:
        box = await pool.acquire(LocalSandboxConfig(workdir="/testbed"))
        try:
            with pytest.raises(TaskError, match="timed out"):  # tried again, not remembered
                await good.prepare(box)
        finally:
            await pool.release(box)
    assert trial.installs.installs == 2


@requires_bwrap
async def test_a_changed_install_cmd_is_another_key(options: SweOptions) -> None:
    cache = RepoCache(options.cache_path(), repos_dir=Path(options.repos_dir))
    first = make_trial(options, cache)
    other = make_trial(options, cache, install_cmd=INSTALL + " && echo again >> built.flag")
    async with SlotPool() as pool:
        for trial in (first, other, first):
            outcome = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
            assert outcome.error is None and outcome.reward == 1.0
    assert cache.install_cache().installs == 2 and cache.install_cache().restores == 1


@requires_bwrap
async def test_disabled_cache_installs_every_time(options: SweOptions) -> None:
    trial = make_trial(options)
    trial.installs.options = trial.installs.options.model_copy(update={"enabled": False})
    readers = [Script(SHOW), Script(SHOW)]
    async with SlotPool() as pool:
        for agent in readers:
            assert (await run_trial(trial, agent, LocalSandboxConfig(), pool)).error is None
    assert readers[0].outputs[0] != readers[1].outputs[0]
    assert trial.installs.installs == 0


@requires_docker
async def test_docker_second_rollout_restores_and_an_agent_cannot_poison_it(
    options: SweOptions,
) -> None:
    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    await _second_rollout_restores_and_poison_stays_private(options, DockerSandboxConfig())


@requires_docker
async def test_docker_slots_restore_into_their_own_slot(options: SweOptions) -> None:
    """Slots of one container (concurrent, a poisoner each): one install, each slot its
    own copy."""
    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    trial = make_trial(options)
    readers = [Script(SHOW, POISON, name=f"r{i}") for i in range(3)]
    config = DockerSandboxConfig(slots_per_container=4)
    async with SlotPool(PoolConfig(max_size=4)) as pool:
        outcomes = await asyncio.gather(*(run_trial(trial, r, config, pool) for r in readers))
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    assert trial.installs.installs == 1
    nonces = {r.outputs[0] for r in readers}
    assert len(nonces) == 1 and "poisoned" not in next(iter(nonces))


@requires_bwrap
async def test_an_install_past_max_bytes_is_a_remembered_task_error(options: SweOptions) -> None:
    trial = make_trial(options)
    trial.installs.options = InstallCacheOptions(max_bytes=1000)
    async with SlotPool() as pool:
        one = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
        two = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
    for outcome in (one, two):
        assert outcome.reward is None and outcome.error is not None
        assert outcome.error.kind == "task" and "max_bytes (1000)" in outcome.error.message
    assert "remembered" in two.error.message and trial.installs.installs == 1
    assert not list((trial.installs.root / "installs").glob("*/deps.tar"))
