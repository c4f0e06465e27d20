"""SWE instances on the Docker backend: a container per rollout and several slots per
container (the seed's --slots-per-container run). Skipped with the reason shown when no
Docker daemon answers (a failure in CI)."""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
from pathlib import Path

import pytest
from tests.docker_probe import DOCKER_PROBLEM, requires_docker

from clotho.agent.base import AgentContext
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.agent.result import AgentResult
from clotho.sandbox import DockerSandboxConfig
from clotho.sandbox.docker import sandbox as docker_sandbox
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.swe.examples import TOY_INSTANCES, TOY_SOURCES, build_toys
from clotho.swe.instance import SweInstance, SweOptions
from clotho.swe.repos import RepoCache, git
from clotho.swe.trial import SweTrial
from clotho.tasks.trial import run_trial

pytestmark = requires_docker


@pytest.fixture(autouse=True)
def _docker_answers() -> None:
    if DOCKER_PROBLEM is not None:  # only reached in CI: elsewhere the module is skipped
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> list[SweTrial]:
    toys = build_toys(tmp_path_factory.mktemp("toys"))[0].parent
    options = SweOptions(
        repos_dir=str(toys),
        cache_dir=str(tmp_path_factory.mktemp("cache")),
        network_clone=False,
    )
    cache = RepoCache(options.cache_path(), repos_dir=toys, network=False)
    records = [json.loads(x) for x in TOY_INSTANCES.read_text().splitlines() if x.strip()]
    return [SweTrial(SweInstance.model_validate(r), options, cache) for r in records]


async def _run_all(
    cases: list[SweTrial], config: DockerSandboxConfig, concurrency: int = 1
) -> list[tuple]:
    async with SlotPool(PoolConfig(max_size=10)) as pool:
        sem = asyncio.Semaphore(concurrency)

        async def one(trial: SweTrial, agent) -> tuple:
            async with sem:
                o = await run_trial(trial, agent, config, pool)
            return trial.name, agent.name, o.reward, o.error

        return list(
            await asyncio.gather(*(one(t, a) for t in cases for a in (OracleAgent(), NopAgent())))
        )


async def test_oracle_1_and_nop_0_in_containers(cases: list[SweTrial]) -> None:
    for name, agent, reward, error in await _run_all(cases, DockerSandboxConfig()):
        assert error is None, (name, agent, error)
        assert reward == (1.0 if agent == "oracle" else 0.0), (name, agent)


async def test_oracle_1_and_nop_0_in_shared_containers(cases: list[SweTrial]) -> None:
    """Ten slots per container, each with its own /testbed."""
    config = DockerSandboxConfig(slots_per_container=10)
    for name, agent, reward, error in await _run_all(cases[:4], config, concurrency=4):
        assert error is None, (name, agent, error)
        assert reward == (1.0 if agent == "oracle" else 0.0), (name, agent)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and ".git" not in f.parts and "__pycache__" not in f.parts
    }


def test_module_uses_the_toy_sources(cases: list[SweTrial], tmp_path: Path) -> None:
    """The containers above ran every bundled toy instance, each from the repository built
    from its examples/swe/toy/ source: at the record's base commit, the gold patch gives back
    exactly that source tree (so the oracle's 1 and nop's 0 judged the bundled bugs)."""
    records = [json.loads(x) for x in TOY_INSTANCES.read_text().splitlines() if x.strip()]
    assert [t.name for t in cases] == [r["instance_id"] for r in records]
    sources = {p.name: p for p in TOY_SOURCES.iterdir() if p.is_dir()}
    assert {t.instance.repo.rsplit("/", 1)[-1] for t in cases} == set(sources)
    for trial in cases:
        snapshot = trial.cache.snapshot(trial.instance)
        head = git("rev-parse", "HEAD", cwd=snapshot).stdout.strip()
        assert head == trial.instance.base_commit, trial.name
        work = tmp_path / trial.name
        shutil.copytree(snapshot, work)
        source = _tree(sources[trial.instance.repo.rsplit("/", 1)[-1]])
        assert _tree(work) != source, trial.name  # the bug is there before the fix
        applied = git("apply", "-", cwd=work, stdin=trial.instance.patch)
        assert applied.returncode == 0, (trial.name, applied.stderr)
        assert _tree(work) == source, trial.name


async def test_workspace_upload_passes_the_fifo_folder_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree upload (a SWE workspace) goes through the bind-mounted FIFO folder, not the
    archive API: what arrives is the tree with its modes, nothing is left in the folder,
    and the agent cannot plant links there (to a host file): the folder is a read-only bind
    in the container (the host also never follows links there: `XferDir`)."""
    victim = tmp_path / "victim"
    victim.write_text("host file\n")
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "pkg" / "run.sh").chmod(0o755)
    (tree / "README").write_text("hello\n")
    async with SlotPool(PoolConfig(max_size=1)) as pool:
        box = await pool.acquire(DockerSandboxConfig(workdir="/testbed"))
        try:
            io_dir = box.io_dir  # type: ignore[attr-defined]
            assert io_dir is not None
            before = {p.name for p in io_dir.iterdir()}
            planted = await box.exec(
                f"for i in $(seq 50); do ln -s {victim} /.clotho-io/upload-$i 2>/dev/null; done; "
                f"ln -s {victim} /.clotho-io/upload- 2>/dev/null || echo refused"
            )
            assert planted.stdout.strip() == "refused"

            async def no_archive_request(*_: object) -> None:
                raise AssertionError("the upload used the archive API")

            monkeypatch.setattr(docker_sandbox, "put_archive", no_archive_request)
            await box.upload(tree, "/testbed")
            ran = await box.exec("./pkg/run.sh && cat README && stat -c %a pkg/run.sh")
            assert ran.stdout.split() == ["ran", "hello", "755"]
            assert {p.name for p in io_dir.iterdir()} == before
        finally:
            await pool.release(box)
    assert victim.read_text() == "host file\n"


class Script:
    """An agent that runs fixed shell commands in the sandbox (a named test double)."""

    name = "script"

    def __init__(self, *commands: str) -> None:
        self.commands = commands
        self.exits: list[int] = []

    async def run(self, ctx: AgentContext) -> AgentResult:
        for command in self.commands:
            self.exits.append((await ctx.sandbox.exec(command, cwd="/testbed")).exit_code)
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


# A start-up hook that, at the runner's exit, deletes every failure from its JUnit reports;
# and a `grep` first on PATH that finds nothing, so a check reading the hook with grep would
# see no code in it.
FORGE_AT_EXIT = (
    "import atexit; atexit.register(lambda re=__import__('re'), glob=__import__('glob'): "
    "[(lambda text, f=f: open(f, 'w').write(re.sub(r'<(failure|error)\\b.*?(/>|</\\1>)', '', "
    "text, flags=re.S)))(open(f).read()) for f in glob.glob('/tmp/clotho-swe/out/junit-*.xml')])"
)
BLIND_GREP = "printf '#!/bin/sh\\nexit 1\\n' > /usr/local/bin/grep && chmod +x /usr/local/bin/grep"
PLANT_HOOK = (
    "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))') && "
    f'mkdir -p "$d" && printf \'%s\\n\' {shlex.quote(FORGE_AT_EXIT)} > "$d/zz-forge.pth"'
)


async def test_the_programs_the_checks_run_are_checked_too(cases: list[SweTrial]) -> None:
    """The checks read the agent's start-up hooks with `grep` in the sandbox: a `grep` of
    the agent's first on PATH that never matches hid a `.pth` that rewrote the reports,
    and a wrong answer passed. Every program the checks themselves run is a checked one;
    the hook alone is tamper too."""
    async with SlotPool() as pool:
        blind = await run_trial(
            cases[0], Script(PLANT_HOOK, BLIND_GREP), DockerSandboxConfig(), pool
        )
        hook = await run_trial(cases[0], Script(PLANT_HOOK), DockerSandboxConfig(), pool)
    assert blind.error is not None and blind.error.kind == "tamper", blind
    assert "/usr/local/bin/grep" in blind.error.message, blind.error.message
    assert hook.error is not None and hook.error.kind == "tamper", hook
    assert "zz-forge.pth" in hook.error.message, hook.error.message
