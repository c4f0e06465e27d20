"""Repository specs: the bundled SWE-bench / SWE-smith facts, a user's own spec file, and
records with no test command verified by their repository's spec (on bubblewrap, and in a
small sweb.eval-named image built here on Docker)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from tests.conftest import requires_bwrap
from tests.docker_probe import DOCKER_PROBLEM, requires_docker

from clotho.agent.reference import NopAgent, OracleAgent
from clotho.errors import ConfigError, TaskError
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.swe.examples import TOY_INSTANCES, build_toys
from clotho.swe.instance import SweInstance, SweOptions, parse_record
from clotho.swe.repos import RepoCache
from clotho.swe.specs import read_spec_file, registry
from clotho.swe.trial import SweTrial
from clotho.tasks.trial import run_trial

VERIFIED_REPOS = {
    "astropy/astropy", "django/django", "matplotlib/matplotlib", "mwaskom/seaborn",
    "pallets/flask", "psf/requests", "pydata/xarray", "pylint-dev/pylint",
    "pytest-dev/pytest", "scikit-learn/scikit-learn", "sphinx-doc/sphinx", "sympy/sympy",
}  # fmt: skip


def record(**fields: object) -> SweInstance:
    base = {
        "instance_id": "django__django-11099",
        "repo": "django/django",
        "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
        "problem_statement": "p",
        "FAIL_TO_PASS": [
            "test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"
        ],
        "version": "3.0",
        "test_patch": (
            "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n"
            "diff --git a/tests/auth_tests/fixtures/data.json b/tests/auth_tests/fixtures/data.json\n"
        ),
    }
    return SweInstance.model_validate({**base, **fields})


# -- the bundled specs -------------------------------------------------------------------


def test_bundled_specs_cover_swe_bench_verified_and_swe_smith() -> None:
    specs = registry()
    for repo in VERIFIED_REPOS:
        assert specs.find(repo) is not None, repo
    assert specs.find("swesmith/pallets__click.fde47b4b") is not None
    assert len(specs) >= 100  # SWE-smith's Python profiles


def test_a_spec_resolves_per_version_as_the_reference_harness_runs_it() -> None:
    django = registry().resolve(record())
    assert django is not None
    assert django.test_cmd.startswith("./tests/runtests.py --verbosity 2")
    assert django.log_parser == "django"
    assert "export LANG=en_US.UTF-8" in django.eval_commands
    assert django.install == "python -m pip install -e ." and django.eval_install
    # Django's directives are the test patch's test files as modules, non-test files out.
    assert django.arguments(record()) == ["auth_tests.test_validators"]
    old = registry().resolve(record(version="1.9"))
    assert old is not None and old.test_cmd == "./tests/runtests.py --verbosity 2"
    sympy = registry().resolve(record(repo="sympy/sympy", version="1.1"))
    assert sympy is not None and sympy.log_parser == "sympy" and "bin/test" in sympy.test_cmd
    assert sympy.arguments(record(repo="sympy/sympy")) == ["tests/auth_tests/test_validators.py"]
    # A version the specs do not list runs the repository's usual command.
    unknown = registry().resolve(record(repo="astropy/astropy", version="99.0"))
    assert unknown is not None and unknown.test_cmd.startswith("pytest -rA")
    # A repository without a spec: clotho's own runner, as before.
    assert registry().resolve(record(repo="someone/else")) is None


def test_image_names_follow_swe_bench_and_swe_smith(tmp_path: Path) -> None:
    options = SweOptions(cache_dir=str(tmp_path), network_clone=False)
    trial = SweTrial(record(), options)
    image = "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert trial.environment_spec().image == image
    # SWE-smith records carry their image: it is used as it is.
    smith = record(
        instance_id="pallets__click.fde47b4b.func_basic__abc123",
        repo="swesmith/pallets__click.fde47b4b",
        image_name="jyangballin/swesmith.x86_64.pallets_1776_click.fde47b4b",
        version=None,
    )
    trial = SweTrial(smith, options)
    assert trial.environment_spec().image == smith.image_name
    assert trial.spec is not None and trial.spec.log_parser == "pytest_verbose"


def test_a_missing_image_is_named_with_how_to_build_it(tmp_path: Path) -> None:
    options = SweOptions(cache_dir=str(tmp_path), network_clone=False)
    message = SweTrial(record(), options).missing_image()
    assert "image swebench/sweb.eval.x86_64.django_1776_django-11099:latest" in message
    assert "python -m swebench.harness.prepare_images" in message
    assert "--instance_ids django__django-11099" in message
    assert "docker tag sweb.eval.x86_64.django__django-11099:latest" in message
    smith = record(
        instance_id="pallets__click.fde47b4b.func_basic__abc123",
        repo="swesmith/pallets__click.fde47b4b",
    )
    message = SweTrial(smith, options).missing_image()
    assert "image swebench/swesmith.x86_64.pallets_1776_click.fde47b4b" in message
    assert "python -m swesmith.build_repo.create_images -r pallets__click.fde47b4b" in message


# -- a user's own specs -------------------------------------------------------------------


def test_a_specs_file_adds_and_replaces_entries(tmp_path: Path) -> None:
    extra = tmp_path / "specs.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "repos": [
                    {"repo": "acme/widgets", "test_cmd": "pytest -rA", "log_parser": "pytest"},
                    {
                        "repo": "django/django",
                        "test_cmd": "python runtests.py",
                        "log_parser": "django",
                    },
                ]
            }
        )
    )
    specs = registry([str(extra)])
    widgets = specs.resolve(record(repo="https://github.com/Acme/Widgets.git"))
    assert widgets is not None and widgets.test_cmd == "pytest -rA"
    django = specs.resolve(record())
    assert django is not None and django.test_cmd == "python runtests.py"
    assert registry().resolve(record()).test_cmd != "python runtests.py"  # type: ignore[union-attr]


def test_a_bad_specs_file_names_the_file_and_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"repos": [{"repo": "a/b", "test_cmd": "x", "log_parser": "nose"}]}))
    with pytest.raises(ConfigError, match=r"bad\.json.*unknown log parser 'nose'"):
        read_spec_file(bad)
    bad.write_text(json.dumps({"repos": [{"repo": "a/b", "tset_cmd": "x"}]}))
    with pytest.raises(ConfigError, match=r"bad\.json.*tset_cmd"):
        read_spec_file(bad)
    with pytest.raises(TaskError, match="unknown log parser 'nose'"):
        parse_record({**record().model_dump(), "log_parser": "nose"}, "x.jsonl:1")


# -- verification by a spec -----------------------------------------------------------------


@pytest.fixture(scope="module")
def toys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_toys(tmp_path_factory.mktemp("toys"))[0].parent


def toy_record(name: str = "calc") -> dict:
    for line in TOY_INSTANCES.read_text().splitlines():
        data = json.loads(line)
        if data["repo"] == f"clotho-examples/{name}":
            return data
    raise AssertionError(name)


def spec_file(tmp_path: Path, **fields: object) -> str:
    """A user's spec for the toy repository: SWE-bench style, outcomes from `pytest -rA`."""
    entry = {
        "repo": "clotho-examples/calc",
        "test_cmd": "pytest -rA -p no:cacheprovider",
        "log_parser": "pytest",
        "directives": "listed_files",
        **fields,
    }
    path = tmp_path / "toy-specs.yaml"
    path.write_text(yaml.safe_dump({"repos": [entry]}))
    return str(path)


async def run_both(trials: list[SweTrial], config, pool: SlotPool) -> list[tuple]:
    async def one(trial: SweTrial, agent) -> tuple:
        outcome = await run_trial(trial, agent, config, pool)
        return trial.name, agent.name, outcome

    return list(
        await asyncio.gather(*(one(t, a) for t in trials for a in (OracleAgent(), NopAgent())))
    )


def make_trials(toys: Path, tmp_path: Path, records: list[dict], specs: list[str]) -> list:
    options = SweOptions(
        repos_dir=str(toys),
        cache_dir=str(tmp_path / "cache"),
        network_clone=False,
        specs_files=specs,
    )
    cache = RepoCache(options.cache_path(), repos_dir=toys, network=False)
    return [SweTrial(SweInstance.model_validate(r), options, cache) for r in records]


def verdict(outcome) -> dict:
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    return json.loads(outcome.verifier.output)


@requires_bwrap
async def test_a_record_without_test_cmd_runs_by_its_repository_spec(
    toys: Path, tmp_path: Path
) -> None:
    """No test command in the record, a spec for its repository: the spec's `pytest -rA`
    runs and the log is read. Oracle passes, nop fails; a listed test that never ran fails
    the oracle too; a record's own SWE-bench-style command (no {junit}) is read alike."""
    calc = toy_record()
    assert "test_cmd" not in calc
    missing = {
        **calc,
        "instance_id": calc["instance_id"] + ".missing",
        "PASS_TO_PASS": [*calc["PASS_TO_PASS"], "tests/test_calc.py::test_not_there"],
    }
    own = {
        **toy_record("textkit"),
        "test_cmd": "pytest -rA -p no:cacheprovider",
    }
    trials = make_trials(toys, tmp_path, [calc, missing, own], [spec_file(tmp_path)])
    assert trials[0].spec is not None and trials[2].spec is None
    async with SlotPool(PoolConfig(max_size=6)) as pool:
        runs = await run_both(trials, LocalSandboxConfig(), pool)
    results = {(name, agent): outcome for name, agent, outcome in runs}

    oracle = verdict(results[calc["instance_id"], "oracle"])
    assert results[calc["instance_id"], "oracle"].reward == 1.0
    assert oracle["log_parser"] == "pytest" and oracle["spec"] == "clotho-examples/calc"
    assert "short test summary info" in oracle["runner_output"]  # pytest -rA's own output
    assert all(t["outcome"] == "passed" for t in oracle["tests"].values())
    nop = verdict(results[calc["instance_id"], "nop"])
    assert results[calc["instance_id"], "nop"].reward == 0.0
    assert {nop["tests"][t]["outcome"] for t in calc["FAIL_TO_PASS"]} == {"failed"}

    gone = verdict(results[missing["instance_id"], "oracle"])
    assert results[missing["instance_id"], "oracle"].reward == 0.0
    assert gone["not_collected"] == ["tests/test_calc.py::test_not_there"]

    assert results[own["instance_id"], "oracle"].reward == 1.0
    assert verdict(results[own["instance_id"], "oracle"])["log_parser"] == "pytest"
    assert results[own["instance_id"], "nop"].reward == 0.0


@requires_bwrap
async def test_a_spec_command_that_cannot_run_is_a_verifier_error(
    toys: Path, tmp_path: Path
) -> None:
    """A test command the sandbox does not have gives no verdict (never a 0)."""
    specs = [spec_file(tmp_path, test_cmd="no-such-test-runner -rA")]
    (trial,) = make_trials(toys, tmp_path, [toy_record()], specs)
    async with SlotPool(PoolConfig(max_size=1)) as pool:
        outcome = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
    assert outcome.reward is None
    assert "could not run (exit code 127)" in str(outcome.error)


FAKE_CONDA = """\
conda() { [ "$1" = activate ] && export CONDA_DEFAULT_ENV="$2"; }
"""


@requires_docker
async def test_a_sweb_eval_image_built_here_runs_the_spec(toys: Path, tmp_path: Path) -> None:
    """A small image under SWE-bench's instance-image name, with a conda-style activate
    script: the spec's command runs in it, in the activated environment; an instance
    whose image is not here fails naming it."""
    if DOCKER_PROBLEM is not None:
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
    import aiodocker

    from clotho.sandbox.docker.images import build_image

    calc = toy_record()
    image = "clotho-test/sweb.eval.x86_64.{id_1776}:latest"
    specs = [
        spec_file(
            tmp_path,
            image=image,
            # Only inside the activated environment do the tests run at all.
            test_cmd='[ "$CONDA_DEFAULT_ENV" = testbed ] && pytest -rA -p no:cacheprovider',
        )
    ]
    absent = {**calc, "instance_id": "calc__absent-1"}
    trial, gone = make_trials(toys, tmp_path, [calc, absent], specs)
    tag = trial.environment_spec().image
    assert tag == f"clotho-test/sweb.eval.x86_64.{calc['instance_id'].lower()}:latest"
    context = tmp_path / "image"
    context.mkdir()
    (context / "activate").write_text(FAKE_CONDA)
    (context / "Dockerfile").write_text(
        f"FROM {DockerSandboxConfig().image}\n"
        "COPY activate /opt/miniconda3/bin/activate\n"
        'LABEL clotho.test="swe-specs"\n'
    )
    docker = aiodocker.Docker()
    try:
        await build_image(docker, context, tag, timeout_s=300)
        async with SlotPool(PoolConfig(max_size=2)) as pool:
            runs = await run_both([trial], DockerSandboxConfig(), pool)
            rewards = {agent: outcome.reward for _, agent, outcome in runs}
            for _, _, outcome in runs:
                assert outcome.error is None, outcome.error
            assert rewards == {"oracle": 1.0, "nop": 0.0}
            missing = await run_trial(gone, OracleAgent(), DockerSandboxConfig(), pool)
        assert missing.reward is None
        assert "clotho-test/sweb.eval.x86_64.calc_1776_absent-1:latest" in str(missing.error)
        assert "clotho-test/sweb.eval.x86_64.calc_1776_absent-1:latest" in gone.missing_image()
    finally:
        try:
            await docker.images.delete(tag, force=True)
        finally:
            await docker.close()
