"""A SWE instance as an `EvalTask`: the repository at its base commit at /testbed, the
problem statement as the instruction, FAIL_TO_PASS + PASS_TO_PASS as the verdict."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from pathlib import Path

from clotho.agent.base import Agent
from clotho.agent.result import AgentResult
from clotho.rollout import RolloutSpec, VerifierOutcome
from clotho.rollout.run import SETUP_MARGIN_S
from clotho.sandbox import EnvironmentSpec, PreparedEnvironment, Sandbox
from clotho.swe.install_cache import InstallCache, install_key, run_install, sandbox_kind
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.repos import RepoCache
from clotho.swe.specs import ResolvedSpec, missing_image_message, registry
from clotho.swe.verify import program_baseline, verify_instance
from clotho.verify.integrity import ProgramDigests


def instruction(instance: SweInstance, testbed: str) -> str:
    """What the agent reads: the problem statement and where the code is."""
    return (
        f"The repository {instance.repo} is checked out at {testbed} (commit "
        f"{instance.base_commit[:12]}). Fix the following issue by editing the code in "
        f"{testbed}; the repository's tests will be run afterwards.\n\n"
        f"{instance.problem_statement.strip()}\n"
    )


def solution_dir(instance: SweInstance, cache_root: Path, testbed: str) -> Path | None:
    """A folder whose solve.sh applies the gold patch (what `--agent oracle` runs)."""
    if not instance.patch.strip():
        return None
    digest = hashlib.sha256(f"{testbed}\0{instance.patch}".encode()).hexdigest()[:16]
    folder = cache_root / "solutions" / digest
    if not (folder / "solve.sh").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "patch.diff").write_text(instance.patch)
        (folder / "solve.sh").write_text(
            "#!/bin/bash\nset -eu\n"
            f"cd {shlex.quote(testbed)}\n"
            'git apply --whitespace=nowarn "$(dirname "$0")/patch.diff"\n'
        )
    return folder


class SweTrial:
    """One SWE instance, attempted in a sandbox whose workspace is the repository."""

    def __init__(
        self,
        instance: SweInstance,
        options: SweOptions,
        cache: RepoCache | None = None,
        installs: InstallCache | None = None,
    ) -> None:
        self.instance = instance
        self.options = options
        self.cache = cache or RepoCache(
            options.cache_path(),
            repos_dir=Path(options.repos_dir) if options.repos_dir else None,
            network=options.network_clone,
        )
        # Shared by every trial of the cache (one lock per install key in this process).
        self.installs = installs or self.cache.install_cache(options.install_cache)
        self._checked: Path | None = None  # the snapshot the record's diffs were checked on

    @property
    def name(self) -> str:
        return self.instance.instance_id

    @property
    def category(self) -> str:
        return self.instance.repo_category

    @property
    def spec(self) -> ResolvedSpec | None:
        """The repository spec the instance's tests run by (None: the record's own command
        or clotho's runner)."""
        return registry(self.options.specs_files).resolve(self.instance)

    @property
    def image(self) -> str | None:
        """The record's image (`image_name`, as SWE-smith's records and SWE-bench's harness
        name it), else the one its repository spec names (`sweb.eval.x86_64.<id>`)."""
        if self.instance.docker_image:
            return self.instance.docker_image
        spec = self.spec
        return spec.image_for(self.instance) if spec is not None else None

    def missing_image(self) -> str:
        """What to tell the user when `image` is not on this machine: which, and how to
        get it."""
        image = self.image or ""
        return missing_image_message(self.instance, image, self.spec)

    def environment_spec(self) -> EnvironmentSpec:
        return EnvironmentSpec(
            name=self.name.lower()[:100], image=self.image, build_hint=self.missing_image()
        )

    async def prepare(self, sandbox: Sandbox) -> Path:
        """The repository at /testbed (and its dependencies installed): the snapshot of
        the base commit copied in. A record whose repo, commit or diffs are unusable is a
        `TaskError` naming the instance and the field."""
        instance = self.instance
        snapshot = await self.cache.snapshot_async(instance)
        if self._checked != snapshot:  # once per record and snapshot: the warm path runs no git
            await asyncio.to_thread(self._check_patches, snapshot)
            self._checked = snapshot
        if instance.install_cmd:
            await self._install(sandbox, snapshot, instance.install_cmd)
        else:
            await sandbox.upload(snapshot, self.options.testbed)
        return snapshot

    async def _install(self, sandbox: Sandbox, snapshot: Path, install_cmd: str) -> None:
        """Installed once per (repo, commit, install_cmd, sandbox kind) and copied into the
        other rollouts' sandboxes (`install_cache.py`); a failing install_cmd is a
        `TaskError`, a broken sandbox a `SandboxError`, never a reward."""
        what = f"instance {self.instance.instance_id}"
        testbed, timeout = self.options.testbed, self.options.install_timeout_s
        if not self.installs.options.enabled:
            await sandbox.upload(snapshot, testbed)
            await run_install(sandbox, install_cmd, testbed, timeout, what)
            return
        key = install_key(
            source=snapshot.parent.name,  # the snapshot is <cache>/snapshots/<slug>/<commit>
            commit=snapshot.name,
            install_cmd=install_cmd,
            testbed=testbed,
            kind=sandbox_kind(sandbox),
        )
        await self.installs.ensure(
            sandbox, key=key, install_cmd=install_cmd, testbed=testbed, timeout_s=timeout,
            what=what, upload_workspace=lambda: sandbox.upload(snapshot, testbed),
        )  # fmt: skip

    def _check_patches(self, snapshot: Path) -> None:
        for field in ("patch", "test_patch"):
            self.cache.check_patch(snapshot, self.instance, field)

    def rollout(
        self,
        agent: Agent,
        prepared: PreparedEnvironment,
        *,
        timeout_s: float | None = None,
        labels: dict[str, str] | None = None,
        pass_threshold: float = 1.0,
    ) -> RolloutSpec:
        options = self.options
        state: dict[str, object] = {}

        async def prepare(sandbox: Sandbox) -> None:
            state["snapshot"] = await self.prepare(sandbox)
            state["baseline"] = await program_baseline(sandbox)

        async def verify(sandbox: Sandbox, result: AgentResult) -> VerifierOutcome:
            baseline = state.get("baseline")
            return await verify_instance(
                self.instance,
                sandbox,
                state["snapshot"],  # type: ignore[arg-type]
                options,
                baseline if isinstance(baseline, ProgramDigests) else None,
            )

        config = prepared.config.model_copy(update={"workdir": options.testbed})
        limit = options.agent_timeout_s
        return RolloutSpec(
            sandbox=config,
            agent=agent,
            instruction=lambda: instruction(self.instance, options.testbed),
            prepare=prepare,
            verify=verify,
            labels={**(labels or {}), "clotho.task": self.name[:60]},
            timeout_s=timeout_s
            if timeout_s is not None
            else limit + options.install_timeout_s + options.test_timeout_s + SETUP_MARGIN_S,
            agent_time_limit_s=limit,
            solution_dir=solution_dir(self.instance, self.cache.root, options.testbed),
            pass_threshold=pass_threshold,
        )
