"""`clotho bench swe`: how fast a SWE rollout's workspace is ready and how long verification
takes, beside a fresh `git clone` of the same repository measured in the same run.

Workspace ready = the repository at the base commit in a fresh sandbox, from the warm cache
(bare repository fetched and snapshot made before the clock starts): `SweTrial.prepare`,
i.e. the snapshot found, the record's diffs checked, the copy into the sandbox and the
install command if the instance has one. The sandbox itself is started off the clock (its
cost is `clotho bench sandbox`'s). The baseline is `git clone` of the same source plus a
checkout of the base commit, on the host, which is what a rollout without the cache does.
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


class SweBench(BaseModel):
    backend: str
    instance: str
    repo_files: int
    rollouts: int
    workspace_ready_p50_ms: float
    workspace_ready_p95_ms: float
    git_clone_p50_ms: float
    verify_p50_ms: float
    verify_p95_ms: float
    first_snapshot_ms: float
    target_workspace_ms: float = TARGET_WORKSPACE_MS


async def run_swe_bench(
    *,
    instances: Path = TOY_INSTANCES,
    instance_id: str | None = None,
    repos_dir: Path | None = None,
    sandbox: SandboxConfig | None = None,
    rollouts: int = 20,
    progress: Callable[[str], None] | None = None,
) -> SweBench:
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
        async with SlotPool(PoolConfig(max_size=4)) as pool:
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
    return SweBench(
        backend=config.backend,
        instance=instance.instance_id,
        repo_files=files,
        rollouts=rollouts,
        workspace_ready_p50_ms=round(percentile(ready_ms, 50), 2),
        workspace_ready_p95_ms=round(percentile(ready_ms, 95), 2),
        git_clone_p50_ms=round(percentile(clone_ms, 50), 2),
        verify_p50_ms=round(percentile(verify_ms, 50), 1),
        verify_p95_ms=round(percentile(verify_ms, 95), 1),
        first_snapshot_ms=round(first_ms, 1),
    )


def _clone(source: str, dest: Path, commit: str) -> None:
    """The baseline: a fresh clone of the repository and a checkout of the base commit."""
    for args in (("clone", "-q", "--no-checkout", f"file://{source}", dest),
                 ("-C", dest, "-c", "advice.detachedHead=false", "checkout", "-q", commit)):  # fmt: skip
        result = git(*args)
        if result.returncode != 0:
            raise RuntimeError(f"git {args[0]}: {result.stderr.strip()}")
