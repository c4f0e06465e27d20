"""`clotho bench swe`: how fast a SWE rollout's workspace is ready and how long verification
takes, beside a fresh `git clone` of the same repository measured in the same run.

Workspace ready = the repository at the base commit and its dependencies in a fresh
sandbox, from the warm caches (bare repository fetched, snapshot made and the install
captured before the clock starts): `SweTrial.prepare`, i.e. the snapshot found, the
record's diffs checked, the copy into the sandbox and the cached install unpacked. The
sandbox itself is started off the clock (its cost is `clotho bench sandbox`'s). Baselines
from the same run: `git clone` of the same source plus a checkout of the base commit, on
the host (a rollout without the repository cache), and the same `prepare` with the install
cache off (every rollout runs `install_cmd`).

The toy instances have no `install_cmd`; the benchmark gives them `BENCH_INSTALL`, a
stand-in for a small dependency install that needs no package index: a virtualenv holding
copies of five standard-library packages (about 600 files), byte-compiled. Real installs
(`pip install -e .` with dependencies) take seconds to minutes, so what the cache saves
grows with them; what a restore costs grows with the bytes installed.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from clotho.bench.stats import percentile
from clotho.sandbox import LocalSandboxConfig, SandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.swe.examples import TOY_INSTANCES
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.repos import RepoCache, git
from clotho.swe.trial import SweTrial
from clotho.swe.verify import program_baseline, verify_instance

TARGET_WORKSPACE_MS = 100.0
BENCH_INSTALL = (
    'python3 -m venv --without-pip "$HOME/venv" && '
    "std=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"stdlib\"])') && "
    'site=$("$HOME/venv/bin/python" -c '
    "'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])') && "
    'for m in json email asyncio unittest xml; do cp -r "$std/$m" "$site/"; done && '
    '"$HOME/venv/bin/python" -m compileall -q "$site"'
)


class SweBench(BaseModel):
    backend: str
    instance: str
    repo_files: int
    tests_listed: int  # FAIL_TO_PASS + PASS_TO_PASS: what each verification runs
    rollouts: int
    workspace_ready_p50_ms: float
    workspace_ready_p95_ms: float
    git_clone_p50_ms: float
    verify_p50_ms: float
    verify_p95_ms: float
    first_snapshot_ms: float
    install_cmd: str | None = None
    install_first_ms: float | None = None  # the one real install (and its capture)
    install_cached_bytes: int | None = None
    workspace_no_install_cache_p50_ms: float | None = None  # install_cmd in every rollout
    install_saved_p50_ms: float | None = None  # per rollout, by the install cache
    target_workspace_ms: float = TARGET_WORKSPACE_MS


async def run_swe_bench(
    *,
    instances: Path = TOY_INSTANCES,
    instance_id: str | None = None,
    repos_dir: Path | None = None,
    sandbox: SandboxConfig | None = None,
    rollouts: int = 20,
    progress: Callable[[str], None] | None = None,
    install_cmd: str | None = BENCH_INSTALL,
) -> SweBench:
    """`install_cmd` is used when the instance has none (None: no install measured)."""
    say = progress or (lambda _: None)
    records = [json.loads(x) for x in instances.read_text().splitlines() if x.strip()]
    record = next((r for r in records if r["instance_id"] == instance_id), records[0])
    with tempfile.TemporaryDirectory(prefix="clotho-swe-bench-") as tmp:
        options = SweOptions(
            cache_dir=str(Path(tmp) / "cache"),
            repos_dir=str(repos_dir) if repos_dir else None,
            network_clone=False,
        )
        cache = RepoCache(options.cache_path(), repos_dir=repos_dir, network=False)
        if install_cmd and not record.get("install_cmd"):
            record = {**record, "install_cmd": install_cmd}
        instance = SweInstance.model_validate({**record, "source": instances.resolve().parent})
        trial = SweTrial(instance, options, cache)
        started = time.perf_counter()
        snapshot = await cache.snapshot_async(instance)  # cold: fetch + snapshot, once
        first_ms = (time.perf_counter() - started) * 1000
        _, source = cache.source(instance)
        files = sum(1 for p in snapshot.rglob("*") if p.is_file() and ".git" not in p.parts)
        say(f"{instance.instance_id}: {files} files; first snapshot {first_ms:.0f} ms")

        clone_ms = []
        for i in range(rollouts):
            dest = Path(tmp) / f"clone-{i}"
            t0 = time.perf_counter()
            await asyncio.to_thread(_clone, source, dest, instance.base_commit)
            clone_ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.to_thread(shutil.rmtree, dest)
        config = (sandbox or LocalSandboxConfig()).model_copy(update={"workdir": options.testbed})
        ready_ms: list[float] = []
        verify_ms: list[float] = []
        uncached_ms: list[float] = []
        install_first_ms: float | None = None
        async with SlotPool(PoolConfig(max_size=4)) as pool:
            if instance.install_cmd:  # the one real install, captured for the others
                box = await pool.acquire(config)
                try:
                    t0 = time.perf_counter()
                    await trial.prepare(box)
                    install_first_ms = (time.perf_counter() - t0) * 1000
                finally:
                    await pool.release(box)
                say(f"first install and capture: {install_first_ms:.0f} ms")
            for i in range(rollouts):
                box = await pool.acquire(config)
                try:
                    t0 = time.perf_counter()
                    await trial.prepare(box)
                    ready_ms.append((time.perf_counter() - t0) * 1000)
                    baseline = await program_baseline(box)
                    patch = instance.patch
                    await box.exec(
                        f"git apply <<'CLOTHO_EOF'\n{patch}CLOTHO_EOF", cwd=options.testbed
                    )
                    t0 = time.perf_counter()
                    outcome = await verify_instance(instance, box, snapshot, options, baseline)
                    verify_ms.append((time.perf_counter() - t0) * 1000)
                    if outcome.reward != 1.0:
                        raise RuntimeError(f"the gold patch did not pass: {outcome.output[:500]}")
                finally:
                    await pool.release(box)
                say(f"rollout {i + 1}/{rollouts}: ready {ready_ms[-1]:.1f} ms, "
                    f"verify {verify_ms[-1]:.0f} ms")  # fmt: skip
            if instance.install_cmd:  # the same prepare with the install cache off
                installs = trial.installs
                installs.options = installs.options.model_copy(update={"enabled": False})
                for i in range(rollouts):
                    box = await pool.acquire(config)
                    try:
                        t0 = time.perf_counter()
                        await trial.prepare(box)
                        uncached_ms.append((time.perf_counter() - t0) * 1000)
                    finally:
                        await pool.release(box)
                    say(f"rollout {i + 1}/{rollouts} without the install cache: ready "
                        f"{uncached_ms[-1]:.0f} ms")  # fmt: skip
        cached_bytes = sum(p.stat().st_size for p in cache.root.glob("installs/*/deps.tar"))
    ready_p50 = round(percentile(ready_ms, 50), 2)
    uncached_p50 = round(percentile(uncached_ms, 50), 2) if uncached_ms else None
    if uncached_p50 is not None:
        say(f"install cache: workspace ready p50 {ready_p50:.1f} ms with it, "
            f"{uncached_p50:.1f} ms without (install_cmd in every rollout): "
            f"{uncached_p50 - ready_p50:.1f} ms saved per rollout")  # fmt: skip
    return SweBench(
        backend=config.backend,
        instance=instance.instance_id,
        repo_files=files,
        tests_listed=len(instance.FAIL_TO_PASS) + len(instance.PASS_TO_PASS),
        rollouts=rollouts,
        workspace_ready_p50_ms=ready_p50,
        workspace_ready_p95_ms=round(percentile(ready_ms, 95), 2),
        git_clone_p50_ms=round(percentile(clone_ms, 50), 2),
        verify_p50_ms=round(percentile(verify_ms, 50), 1),
        verify_p95_ms=round(percentile(verify_ms, 95), 1),
        first_snapshot_ms=round(first_ms, 1),
        install_cmd=instance.install_cmd,
        install_first_ms=round(install_first_ms, 1) if install_first_ms is not None else None,
        install_cached_bytes=cached_bytes if instance.install_cmd else None,
        workspace_no_install_cache_p50_ms=uncached_p50,
        install_saved_p50_ms=round(uncached_p50 - ready_p50, 2) if uncached_p50 else None,
    )


def _clone(source: str, dest: Path, commit: str) -> None:
    """The baseline: a fresh clone of the repository and a checkout of the base commit."""
    for args in (("clone", "-q", "--no-checkout", f"file://{source}", dest),
                 ("-C", dest, "-c", "advice.detachedHead=false", "checkout", "-q", commit)):  # fmt: skip
        result = git(*args)
        if result.returncode != 0:
            raise RuntimeError(f"git {args[0]}: {result.stderr.strip()}")
