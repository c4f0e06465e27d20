"""SWE instances end to end: records, the repository cache, verification, the generator.

Real git, real bubblewrap; the bundled toy repositories are built from examples/swe/toy/
(no network). Docker runs are in tests/test_swe_docker.py.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap

from clotho.agent.base import AgentContext
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.agent.result import AgentResult
from clotho.chat.client import ChatClient, ModelConfig
from clotho.errors import TaskError
from clotho.rollout import run_rollout
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.swe.examples import TOY_INSTANCES, build_toys
from clotho.swe.generate import generate
from clotho.swe.instance import SweInstance, SweOptions, load_instances
from clotho.swe.mutate import MUTATORS, mutations
from clotho.swe.repos import RepoCache, git
from clotho.swe.runner import outcomes, parse_junit
from clotho.swe.trial import SweTrial
from clotho.tasks.discover import discover
from clotho.tasks.trial import run_trial

pytest_plugins = ("tests.swe_fixtures",)  # toys, options


def toy_records() -> list[dict]:
    return [json.loads(line) for line in TOY_INSTANCES.read_text().splitlines() if line.strip()]


def trials(options: SweOptions, records: list[dict] | None = None) -> list[SweTrial]:
    cache = RepoCache(options.cache_path(), repos_dir=Path(options.repos_dir or "."))
    cache.network = False
    return [
        SweTrial(SweInstance.model_validate(r), options, cache) for r in records or toy_records()
    ]


class Script:
    """An agent that runs fixed shell commands in the sandbox and keeps their output."""

    def __init__(self, *commands: str, name: str = "script") -> None:
        self.commands = commands
        self.name = name
        self.outputs: list[str] = []

    async def run(self, ctx: AgentContext) -> AgentResult:
        for command in self.commands:
            result = await ctx.sandbox.exec(command, cwd="/testbed")
            self.outputs.append(result.stdout + result.stderr)
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


def report(outcome) -> dict:
    assert outcome.verifier is not None, outcome.error
    return json.loads(outcome.verifier.output)


# -- records -------------------------------------------------------------------------------


def test_records_keep_unknown_fields_and_read_json_string_lists(tmp_path: Path) -> None:
    good = {
        "instance_id": "a__b-1", "repo": "a/b", "base_commit": "abc1234",
        "problem_statement": "broken", "patch": "", "FAIL_TO_PASS": '["t.py::test_x[a b]"]',
        "PASS_TO_PASS": "[]", "environment_setup_commit": "ffff", "version": 1.2,
    }  # fmt: skip
    missing = {k: v for k, v in good.items() if k != "base_commit"} | {"instance_id": "a__b-2"}
    bad_list = good | {"instance_id": "a__b-3", "FAIL_TO_PASS": "not json"}
    path = tmp_path / "instances.jsonl"
    lines = [json.dumps(good), "{not json", json.dumps(missing), json.dumps(bad_list)]
    path.write_text("\n".join(lines) + "\n")
    instances, errors = load_instances(path)
    assert [i.instance_id for i in instances] == ["a__b-1"]
    assert instances[0].FAIL_TO_PASS == ["t.py::test_x[a b]"]
    assert instances[0].model_extra == {"environment_setup_commit": "ffff"}
    assert instances[0].version == "1.2"
    messages = {name: str(e) for name, e in errors}
    assert "valid JSON" in messages["instances.jsonl:2"]
    assert "instance a__b-2" in messages["a__b-2"] and "base_commit" in messages["a__b-2"]
    assert "FAIL_TO_PASS" in messages["a__b-3"]


def test_discover_reads_instance_files_beside_task_directories(
    options: SweOptions, make_task, tmp_path: Path
) -> None:
    task_dir = make_task("harbor-task")
    tasks, errors = discover([TOY_INSTANCES, task_dir], options={"swe": options})
    assert not errors
    names = {t.name for t in tasks}
    assert "harbor-task" in names
    assert {r["instance_id"] for r in toy_records()} <= names
    swe = next(t for t in tasks if isinstance(t, SweTrial))
    assert swe.category in {"calc", "calendar_utils", "intervals", "stackq", "textkit"}


def test_junit_ids_with_parameters_spaces_and_brackets() -> None:
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_a" name="test_x[a b-1]" file="tests/test_a.py"/>
      <testcase classname="tests.test_a.TestC" name="test_y[x[1]]" file="tests/test_a.py">
        <failure message="assert 1 == 2">trace</failure></testcase>
      <testcase classname="tests.test_a" name="test_z" file="tests/test_a.py">
        <skipped type="pytest.skip" message="no"/></testcase>
      <testcase classname="tests.test_a" name="test_z" file="tests/test_a.py">
        <error message="teardown"/></testcase>
    </testsuite></testsuites>"""
    listed = [
        "tests/test_a.py::test_x[a b-1]", "tests/test_a.py::TestC::test_y[x[1]]",
        "tests/test_a.py::test_z", "tests/test_a.py::test_gone",
    ]  # fmt: skip
    got = {k: v["outcome"] for k, v in outcomes(listed, parse_junit(xml)).items()}
    assert got == {
        "tests/test_a.py::test_x[a b-1]": "passed",
        "tests/test_a.py::TestC::test_y[x[1]]": "failed",
        "tests/test_a.py::test_z": "error",
        "tests/test_a.py::test_gone": "not collected",
    }


@pytest.mark.parametrize("kind", sorted(MUTATORS))
def test_every_mutator_injects_a_bug(kind: str) -> None:
    source = (
        "def f(a, b, items):\n"
        "    total = 0\n"
        "    if a < b and b > 0:\n"
        "        total += max(a, b)\n"
        "    for i in range(len(items)):\n"
        "        total += items[i]\n"
        "    return total + len(items[1:b])\n"
    )
    found = mutations("m.py", source, [kind])
    assert found, kind
    namespace: dict = {}
    exec(compile(found[0].source, "m.py", "exec"), namespace)  # the mutant still runs
    assert found[0].source != source
    assert all(m.kind == kind for m in found)


# -- rollouts on the local backend ---------------------------------------------------------


@requires_bwrap
async def test_oracle_scores_1_and_nop_0_on_every_bundled_instance(options: SweOptions) -> None:
    """The bundled toy instances on the local backend: gold patch passes, nothing fails."""
    cases = trials(options)
    assert len(cases) >= 10 and len({t.instance.repo for t in cases}) >= 5
    await assert_oracle_1_and_nop_0(cases, pool_size=8, at_once=4)


async def assert_oracle_1_and_nop_0(cases: list[SweTrial], pool_size: int, at_once: int) -> None:
    """Every case run by the oracle (reward 1) and by nop (reward 0) on the local backend,
    `at_once` trials at a time; none fails."""
    async with SlotPool(PoolConfig(max_size=pool_size)) as pool:
        sem = asyncio.Semaphore(at_once)

        async def one(trial: SweTrial, agent) -> tuple[str, str, float | None, object]:
            async with sem:
                o = await run_trial(trial, agent, LocalSandboxConfig(), pool)
            return trial.name, agent.name, o.reward, o.error

        runs = await asyncio.gather(
            *(one(t, a) for t in cases for a in (OracleAgent(), NopAgent()))
        )
    for name, agent, reward, error in runs:
        assert error is None, (name, agent, error)
        assert reward == (1.0 if agent == "oracle" else 0.0), (name, agent)


@requires_bwrap
async def test_the_agent_sees_the_base_commit_only(options: SweOptions, toys: Path) -> None:
    """No later commit, no gold patch, no remote; git works for the agent at /testbed."""
    trial = trials(options)[0]
    later = git("rev-parse", "main", cwd=toys / trial.instance.repo.split("/")[1]).stdout.strip()
    agent = Script(
        "git status --porcelain && echo status-ok",
        "git log --all --oneline | wc -l",
        f"git cat-file -e {later} 2>/dev/null && echo LEAK || echo no-later-commit",
        "git remote -v | wc -l; git rev-parse HEAD",
        "ls -a /testbed; git for-each-ref | wc -l",
    )
    async with SlotPool() as pool:
        outcome = await run_trial(trial, agent, LocalSandboxConfig(), pool)
    assert outcome.error is None
    status, log, later_commit, remote, listing = agent.outputs
    assert "status-ok" in status and "dubious" not in status
    assert log.strip() == "1"
    assert later_commit.strip() == "no-later-commit"
    assert remote.split() == ["0", trial.instance.base_commit]
    assert "LATER.md" not in listing and listing.split()[-1] == "0"


@requires_bwrap
async def test_eight_rollouts_on_one_repository_do_not_interfere(options: SweOptions) -> None:
    """Eight concurrent rollouts of instances of one repository: one bare repository, one
    fetch, each rollout's own copy; odd ones fix the bug, even ones break a passing test,
    and each is verified alone (its reward and its diff are its own)."""
    records = [r for r in toy_records() if r["repo"].endswith("/calc")]
    cases = [trials(options, [records[i % len(records)]])[0] for i in range(8)]
    cache = cases[0].cache
    for t in cases:
        t.cache = cache
    agents = []
    for i, trial in enumerate(cases):
        marker = f"echo '# rollout {i}' >> calc/__init__.py"
        if i % 2:
            fix = f"git apply <<'EOF'\n{trial.instance.patch}EOF"
            agents.append(Script(fix, marker, name=f"fix{i}"))
        else:
            agents.append(Script("sed -i 's/return base\\*\\*exponent/return 0/' calc/__init__.py",
                                 marker, name=f"break{i}"))  # fmt: skip
    async with SlotPool(PoolConfig(max_size=8)) as pool:
        outcomes_ = await asyncio.gather(
            *(
                run_trial(t, a, LocalSandboxConfig(), pool)
                for t, a in zip(cases, agents, strict=True)
            )
        )
    assert cache.fetches == 1
    assert len(list((cache.root / "repos").iterdir())) == 1
    for i, outcome in enumerate(outcomes_):
        assert outcome.error is None, outcome.error
        assert outcome.reward == (1.0 if i % 2 else 0.0), i
        diff = report(outcome)["agent_diff"]
        assert f"# rollout {i}\n" in diff
        assert all(f"# rollout {j}\n" not in diff for j in range(8) if j != i)
        if not i % 2:
            assert report(outcome)["tests"]["tests/test_calc.py::test_power"]["outcome"] == "failed"


@requires_bwrap
async def test_bad_records_are_task_errors_and_the_rest_goes_on(options: SweOptions) -> None:
    good, *_ = toy_records()
    unapplicable = good | {"instance_id": "bad-patch", "patch": good["patch"].replace("-", "+")}
    unknown = good | {
        "instance_id": "bad-commit",
        "base_commit": "0123456789abcdef" * 2 + "01234567",
    }
    missing_test = good | {
        "instance_id": "missing-test",
        "FAIL_TO_PASS": [*good["FAIL_TO_PASS"], "tests/test_calc.py::test_does_not_exist[x y]"],
    }
    cases = trials(options, [unapplicable, unknown, missing_test, good])
    async with SlotPool() as pool:
        runs = await asyncio.gather(
            *(run_trial(t, OracleAgent(), LocalSandboxConfig(), pool) for t in cases)
        )
    patch_run, commit_run, missing_run, good_run = runs
    assert patch_run.error is not None and patch_run.error.kind == "task"
    assert (
        "bad-patch" in patch_run.error.message and "patch does not apply" in patch_run.error.message
    )
    assert commit_run.error is not None and commit_run.error.kind == "task"
    assert "bad-commit" in commit_run.error.message and "base_commit" in commit_run.error.message
    assert missing_run.error is None and missing_run.reward == 0.0
    missing = report(missing_run)
    assert missing["not_collected"] == ["tests/test_calc.py::test_does_not_exist[x y]"]
    assert good_run.reward == 1.0


@requires_bwrap
async def test_agents_that_touch_the_tests_gain_nothing(options: SweOptions) -> None:
    """Deleting the tests, rewriting a failing test, or a conftest.py that passes everything:
    the test files are put back as they were at the base commit before the tests run."""
    trial = trials(options)[0]
    fix = f"git apply <<'EOF'\n{trial.instance.patch}EOF"
    hook = (
        "cat > conftest.py <<'EOF'\nimport pytest\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    out = yield\n"
        "    out.get_result().outcome = 'passed'\nEOF"
    )
    cases = {
        "delete-and-fix": (Script("rm -rf tests", fix), 1.0),
        "delete-only": (Script("rm -rf tests"), 0.0),
        "rewrite-test": (Script("sed -i 's/assert /assert True or /' tests/test_calc.py"), 0.0),
        "conftest": (Script(hook, "mkdir -p tests && cp conftest.py tests/"), 0.0),
        "pytest-ini": (Script("printf '[pytest]\\naddopts = -k nothing\\n' > pytest.ini"), 0.0),
    }
    async with SlotPool() as pool:
        runs = await asyncio.gather(
            *(run_trial(trial, agent, LocalSandboxConfig(), pool) for agent, _ in cases.values())
        )
    for (name, (_, expected)), outcome in zip(cases.items(), runs, strict=True):
        assert outcome.error is None, (name, outcome.error)
        assert outcome.reward == expected, (name, report(outcome)["tests"])


@requires_bwrap
async def test_shaped_reward_counts_fixed_tests_unless_one_broke(options: SweOptions) -> None:
    record = next(r for r in toy_records() if len(r["FAIL_TO_PASS"]) >= 2)
    shaped = options.model_copy(update={"reward": "shaped"})
    trial = trials(shaped, [record])[0]
    async with SlotPool() as pool:
        nop = await run_trial(trial, NopAgent(), LocalSandboxConfig(), pool)
        oracle = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
    assert nop.reward == 0.0 and oracle.reward == 1.0
    assert oracle.rewards == {"fail_to_pass": 1.0, "pass_to_pass": 1.0}


@requires_bwrap
async def test_generate_validates_bugs_in_a_sandbox(tmp_path: Path) -> None:
    """A fresh repository: every kept bug breaks a passing test and keeps the others; the
    problem statement names failing tests and is not the diff."""
    repo = build_toys(tmp_path / "repos", instances=None)[1]  # calendar_utils
    git("reset", "-q", "--hard", "HEAD~1", cwd=repo)
    found = await generate(repo, n=2, seed=7, max_tries=8)
    assert found
    for record in found:
        instance = SweInstance.model_validate(record)
        assert instance.FAIL_TO_PASS and instance.PASS_TO_PASS
        assert not set(instance.FAIL_TO_PASS) & set(instance.PASS_TO_PASS)
        assert git("cat-file", "-e", instance.base_commit, cwd=repo).returncode == 0
        assert instance.FAIL_TO_PASS[0] in instance.problem_statement
        assert "@@" not in instance.problem_statement  # written from the tests, not the diff
        applied = git("apply", "--check", "-", cwd=repo, stdin=instance.patch)
        assert applied.returncode != 0  # it fixes the bug commit, not HEAD (already fixed)


def test_unknown_repo_without_network_names_the_instance(options: SweOptions) -> None:
    record = toy_records()[0] | {"instance_id": "nowhere", "repo": "nobody/nothing"}
    trial = trials(options, [record])[0]
    with pytest.raises(TaskError, match=r"nowhere.*nobody/nothing.*no mirror"):
        trial.cache.snapshot(trial.instance)


# A listed id that is shell code: quoted, it reaches pytest as one argument and runs nothing.
HOSTILE_ID = (
    "tests/test_calc.py::test_mean[it's $(echo INJECTED1) `echo INJECTED2`; echo INJECTED3]"
)
# An instance's own test command (as SWE-bench-style records carry): our pytest, JUnit XML
# at {junit}; every argument it receives is printed first, one per line, between < and >.
ECHOING_TEST_CMD = (
    "printf 'ARG<%s>\\n' {tests}; PYTHONPATH=/tmp/clotho-swe/runner python3 -m pytest -q "
    "-p no:cacheprovider -p no:randomly -o addopts= -o junit_family=xunit1 --rootdir=. "
    "--junitxml={junit} {tests}"
)


@requires_bwrap
async def test_shell_quoting_of_ids(options: SweOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an instance's own `test_cmd`, every listed id (spaces, brackets, quotes, `$(...)`)
    reaches the command as one argument and nothing in it runs; ids are split over several
    command lines past the length limit, each with its own JUnit file, and all are judged."""
    from clotho.swe import verify as swe_verify

    spaced = "tests/test_calc.py::test_clamp[high edge]"
    calc = next(r for r in toy_records() if spaced in r["PASS_TO_PASS"])
    hostile = [*calc["PASS_TO_PASS"], HOSTILE_ID]
    record = calc | {"test_cmd": ECHOING_TEST_CMD, "PASS_TO_PASS": hostile}
    listed = record["FAIL_TO_PASS"] + record["PASS_TO_PASS"]
    # About three ids per command line: several lines, so several pytest runs and JUnit files.
    longest = max(len(shlex.quote(t)) for t in listed)
    monkeypatch.setattr(swe_verify, "MAX_COMMAND_CHARS", len(ECHOING_TEST_CMD) + 3 * longest + 3)
    chunks = swe_verify._chunks(listed, ECHOING_TEST_CMD)
    assert len(chunks) >= 3 and [t for c in chunks for t in c] == listed
    async with SlotPool() as pool:
        trial = trials(options, [record])[0]
        outcome = await run_trial(trial, OracleAgent(), LocalSandboxConfig(), pool)
    assert outcome.error is None, outcome.error
    found = report(outcome)
    received = [
        line.removeprefix("ARG<").removesuffix(">")
        for line in found["runner_output"].splitlines()
        if line.startswith("ARG<")
    ]
    assert received == listed  # each id one argument, unchanged, in order, over every chunk
    assert "INJECTED" not in found["runner_output"].replace(HOSTILE_ID, "")
    outcomes_ = {test: entry["outcome"] for test, entry in found["tests"].items()}
    assert outcomes_.pop(HOSTILE_ID) == "not collected"
    assert set(outcomes_.values()) == {"passed"} and len(outcomes_) == len(listed) - 1
    # The gold patch fixed every FAIL_TO_PASS test; the hostile id is listed and not
    # collected, so the instance as a whole is not passed: no id is silently dropped.
    kept = 1 - 1 / len(record["PASS_TO_PASS"])
    assert outcome.rewards == {"fail_to_pass": 1.0, "pass_to_pass": pytest.approx(kept)}
    assert outcome.reward == 0.0


@requires_bwrap
class _Patches:
    """A scripted agent: applies the given patch in the workspace, or does nothing."""

    name = "patches"

    def __init__(self, patch: str | None) -> None:
        self.patch = patch

    async def run(self, ctx: AgentContext) -> AgentResult:
        if self.patch:
            applied = await ctx.sandbox.exec(f"git apply <<'EOF'\n{self.patch}EOF")
            assert applied.ok, applied.stderr
        return AgentResult(messages=[])


async def test_swe_environment_rollout_is_verified_by_its_tests(tmp_path: Path) -> None:
    """The `swe` environment: bundled instances (their toy repositories built on first use,
    no --repos-dir), the workspace at /testbed, the gold patch rewarded 1 and nothing 0."""
    from clotho.envs.swe import SweEnv, SweEnvConfig

    config = SweEnvConfig(
        swe=SweOptions(cache_dir=str(tmp_path / "cache"), network_clone=False), max_items=2
    )
    env = SweEnv(config)
    try:
        await env.setup()
        assert len(env.instances) == 2
        item = await env.get_next_item()
        assert "/testbed" in env.format_prompt(item)
        env.model = ChatClient(ModelConfig(model="unused"))  # the agent below is scripted
        rewards = []
        for fix in (True, False):
            # The environment's own attempt (the one clotho eval makes), with a scripted agent.
            spec = env.rollout_spec(item, [])
            spec.agent = _Patches(item.patch if fix else None)
            outcome = await run_rollout(spec, env._require_pool())
            assert outcome.error is None, outcome.error
            rewards.append(outcome.reward)
        assert rewards == [1.0, 0.0]
    finally:
        await env.close()


@requires_bwrap
def test_clotho_eval_runs_an_instance_file_with_repos_dir(toys: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    out = tmp_path / "run"
    env = {**os.environ, "HOME": str(tmp_path), "COLUMNS": "200"}  # a cache of its own
    result = subprocess.run(
        [sys.executable, "-m", "clotho", "eval", str(TOY_INSTANCES), "--agent", "oracle",
         "--repos-dir", str(toys), "--filter", "stackq.*", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["reward"] == 1.0 for r in records)
    config = json.loads((out / "config.json").read_text())
    assert config["swe"]["repos_dir"] == str(toys.resolve())
    detail = json.loads((out / records[0]["detail"]).read_text())
    verdict = json.loads(detail["verifier"]["output"])
    assert verdict["agent_diff"].startswith("diff --git")
    assert all(t["outcome"] == "passed" for t in verdict["tests"].values())


def test_swe_environment_rollouts_are_bounded_in_time() -> None:
    """The environment's agents get `swe.agent_timeout_s` unless `time_limit_s` is set, as
    `clotho eval` bounds a SWE trial."""
    from clotho.envs.swe import SweEnv, SweEnvConfig

    class NoModel:  # agent() only stores the model
        pass

    default = SweEnv(SweEnvConfig(swe={"agent_timeout_s": 42}), model=NoModel())  # type: ignore[arg-type]
    assert default.agent([]).limits.time_limit_s == 42
    own = SweEnv(SweEnvConfig(time_limit_s=5), model=NoModel())  # type: ignore[arg-type]
    assert own.agent([]).limits.time_limit_s == 5


@requires_bwrap
def test_process_generates_instances_from_a_repository(tmp_path: Path) -> None:
    """`clotho process swe --generate REPO`: instances made on the fly, a group scored (the
    agent is a scripted model, the TEST DOUBLE for a hosted one, that changes nothing)."""
    import json
    import subprocess
    import sys

    from tests.real_tokenizers import QWEN_DIR
    from tests.scripted_openai import ScriptedOpenAIServer, assistant

    repo = build_toys(tmp_path / "repos", instances=None)[1]  # calendar_utils
    git("reset", "-q", "--hard", "HEAD~1", cwd=repo)
    out = tmp_path / "groups.jsonl"
    with ScriptedOpenAIServer(default=assistant("I changed nothing.")) as server:
        proc = subprocess.run(
            [sys.executable, "-m", "clotho", "process", "swe", "--generate", str(repo),
             "--set", "generate_n=1", "--n-groups", "1", "--group-size", "2",
             "--model", "m", "--base-url", server.base_url, "--tokenizer", str(QWEN_DIR),
             "--out", str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert group["scores"] == [0.0, 0.0]  # nothing changed: the generated bug is still there


FORGE_REPORTS = """
try:  # turn every failing test into a pass, from inside the process that records them
    import _pytest.reports as _reports

    _made = _reports.TestReport.from_item_and_call.__func__

    def _passing(cls, item, call):
        report = _made(cls, item, call)
        report.outcome = "passed"
        return report

    _reports.TestReport.from_item_and_call = classmethod(_passing)
except ImportError:
    pass
"""


@requires_bwrap
async def test_a_patch_that_reaches_into_the_test_runner_is_tamper(options: SweOptions) -> None:
    """The code under test runs in the process that records the outcomes: a patch to the
    package that monkeypatches pytest's reports is `tamper`, the lines shown, not a pass."""
    trial = trials(options)[0]
    module = next(
        line[6:] for line in trial.instance.patch.splitlines() if line.startswith("+++ b/")
    )
    forge = f"cat >> {shlex.quote(module)} <<'EOF'\n{FORGE_REPORTS}EOF"
    async with SlotPool() as pool:
        outcome = await run_trial(trial, Script(forge), LocalSandboxConfig(), pool)
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    assert f"{module}: import _pytest.reports as _reports" in outcome.error.message
    assert outcome.reward is None and not outcome.passed


@requires_bwrap
async def test_a_link_into_the_harness_folder_is_tamper(options: SweOptions) -> None:
    """The SWE harness writes its files (the pristine .git, the runner, the reports) into
    its own folder after the agent: a link of the agent's landing there is tamper."""
    trial = trials(options)[0]
    plant = "ln -s /tmp/clotho-swe/out /testbed/harness_out"
    async with SlotPool() as pool:
        outcome = await run_trial(trial, Script(plant), LocalSandboxConfig(), pool)
        honest = await run_trial(trial, Script("true"), LocalSandboxConfig(), pool)
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    assert "/testbed/harness_out -> /tmp/clotho-swe/out" in outcome.error.message
    assert honest.error is None and honest.reward == 0.0, honest.error
