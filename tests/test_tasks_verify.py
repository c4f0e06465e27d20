"""The verifier: tests enter after the agent, the reward file is cleared, bad rewards are errors."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import fail_without_docker_in_ci, requires_docker

from clotho.agent.base import AgentContext
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.agent.result import AgentResult
from clotho.errors import VerifierError
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig, open_sandbox
from clotho.sandbox.config import DEFAULT_PATH
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial
from clotho.tasks.verify import parse_reward_json, parse_reward_txt, run_verifier


@pytest.mark.parametrize(("text", "value"), [("1", 1.0), ("0\n", 0.0), (" 0.25 ", 0.25)])
def test_reward_txt_numbers(text: str, value: float) -> None:
    assert parse_reward_txt(text) == value


@pytest.mark.parametrize("text", ["", "pass", "1 1", "nan", "inf"])
def test_reward_txt_garbage_is_an_error_not_zero(text: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward_txt(text)


def test_reward_json_named_rewards() -> None:
    assert parse_reward_json('{"reward": 0.5, "style": 1}') == (0.5, {"reward": 0.5, "style": 1.0})
    reward, named = parse_reward_json('{"tests": 1, "lint": 0}')
    assert math.isclose(reward, 0.5)
    assert named == {"tests": 1.0, "lint": 0.0}


@pytest.mark.parametrize("text", ["{", "[]", "{}", '{"reward": "high"}', '{"reward": true}'])
def test_reward_json_garbage(text: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward_json(text)


class _CheatingAgent:
    """Looks for the tests and pre-writes a passing reward: both must come to nothing."""

    name = "cheater"

    def __init__(self) -> None:
        self.saw_tests: str | None = None

    async def run(self, ctx: AgentContext) -> AgentResult:
        listing = await ctx.sandbox.exec("ls /tests 2>&1; echo 1 > /logs/verifier/reward.txt")
        await ctx.sandbox.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
        self.saw_tests = listing.stdout
        return AgentResult(messages=[])


@requires_bwrap
async def test_agent_cannot_see_tests_nor_plant_a_reward(make_task) -> None:
    task = load_task(make_task(test_sh="echo 'tests ran but wrote nothing'\n"))
    agent = _CheatingAgent()
    async with SlotPool() as pool:
        outcome = await run_trial(HarborTrial(task), agent, LocalSandboxConfig(), pool)
    assert agent.saw_tests is not None and "test.sh" not in agent.saw_tests
    assert outcome.error is not None and outcome.error.kind == "verifier"
    assert outcome.reward is None and not outcome.passed
    assert "tests ran but wrote nothing" in outcome.error.message


@requires_bwrap
@pytest.mark.parametrize(
    ("script", "reward", "named"),
    [
        ("echo 1 > /logs/verifier/reward.txt", 1.0, {}),
        ('echo \'{"a": 1, "b": 0.5}\' > /logs/verifier/reward.json', 0.75, {"a": 1.0, "b": 0.5}),
    ],
)
async def test_run_verifier_reads_rewards(make_task, script: str, reward: float, named) -> None:
    task = load_task(make_task(test_sh=script + "\n"))
    async with await open_sandbox(LocalSandboxConfig()) as sandbox:
        outcome = await run_verifier(task, sandbox)
    assert outcome.reward == reward
    assert outcome.rewards == named
    assert outcome.exit_code == 0


@requires_bwrap
async def test_verifier_timeout_is_a_verifier_error(make_task) -> None:
    task = load_task(make_task(test_sh="sleep 30\n"))
    async with await open_sandbox(LocalSandboxConfig()) as sandbox:
        with pytest.raises(VerifierError, match="timed out"):
            await run_verifier(task, sandbox, timeout_s=0.5)


@requires_bwrap
async def test_verifier_env_and_workdir(make_task) -> None:
    script = 'mkdir -p /logs/verifier; [ "$PWD" = /app ] && [ "$MODE" = strict ] && echo 1 > /logs/verifier/reward.txt\n'
    task = load_task(make_task(test_sh=script, toml_extra='[verifier.env]\nMODE = "strict"\n'))
    async with await open_sandbox(LocalSandboxConfig()) as sandbox:
        outcome = await run_verifier(task, sandbox)
    assert outcome.reward == 1.0


@requires_bwrap
async def test_environment_files_become_the_workspace(make_task) -> None:
    task = load_task(
        make_task(
            env_files={"data/in.txt": "hello\n", "Dockerfile": "FROM scratch\n"},
            test_sh=(
                "mkdir -p /logs/verifier\n"
                "[ -f /app/data/in.txt ] && [ ! -e /app/Dockerfile ] && echo 1 > /logs/verifier/reward.txt"
                " || echo 0 > /logs/verifier/reward.txt\n"
            ),
        )
    )
    async with SlotPool() as pool:
        outcome = await run_trial(HarborTrial(task), NopAgent(), LocalSandboxConfig(), pool)
    assert outcome.error is None
    assert outcome.reward == 1.0


@pytest.mark.parametrize(
    "text", ["1" * 5000, '{"reward": ' + "1" * 5000 + "}", "[" * 200_000 + "]" * 200_000]
)
def test_huge_or_deep_rewards_are_verifier_errors(text: str) -> None:
    with pytest.raises(VerifierError):
        parse_reward_json(text)


@requires_bwrap
@pytest.mark.parametrize(("extra", "ok"), [("", False), ("reward_range = [0, 10]\n", True)])
async def test_a_reward_outside_the_tasks_range_is_a_verifier_error(make_task, extra, ok) -> None:
    toml = f"[verifier]\ntimeout_sec = 30.0\n{extra}" if extra else ""
    path = make_task(test_sh="mkdir -p /logs/verifier; echo 2 > /logs/verifier/reward.txt\n")
    if toml:  # the factory writes a [verifier] table already: replace it
        text = (path / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 30.0\n", toml)
        (path / "task.toml").write_text(text)
    task = load_task(path)
    async with await open_sandbox(LocalSandboxConfig()) as sandbox:
        if ok:
            assert (await run_verifier(task, sandbox)).reward == 2.0
        else:
            with pytest.raises(VerifierError, match="outside the task's reward range"):
                await run_verifier(task, sandbox)


# -- a find without -newerct (busybox) --------------------------------------------------------
# The check for changed Python start-up hooks asks `find -newerct`; busybox's find does not
# know it. The promise (docs/security.md): such images skip that check, and verification
# works as everywhere else. Both backends are tried with busybox's find as `find`: in a Docker
# image built offline from the base image, and locally first on the sandbox's PATH.
BUSYBOX = shutil.which("busybox")
requires_busybox = pytest.mark.skipif(
    BUSYBOX is None, reason="busybox is not installed (make test installs busybox-static)"
)
BUSYBOX_DOCKERFILE = """\
FROM clotho/base:bookworm
COPY busybox /usr/local/lib/clotho-busybox
RUN ln -sf /usr/local/lib/clotho-busybox /usr/bin/find && find --help 2>&1 | grep -q BusyBox
WORKDIR /app
"""
# The agent does the task, then adds a .pth with an import line to a watched site folder
# (the interpreter's own when it can write there, else one a local sandbox can make).
PLANT_HOOK = """\
echo ok > /app/done.txt
for d in "$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \\
         /usr/local/lib/python3.13/site-packages; do
  if mkdir -p "$d" 2>/dev/null && echo 'import os' > "$d/zz-hook.pth" 2>/dev/null; then
    echo "planted $d/zz-hook.pth"; break
  fi
done
"""


class _Script:
    """A named test double for a model: runs fixed commands, keeps their output."""

    name = "script"

    def __init__(self, command: str) -> None:
        self.command = command
        self.output = ""

    async def run(self, ctx: AgentContext) -> AgentResult:
        result = await ctx.sandbox.exec(self.command)
        self.output = result.stdout + result.stderr
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


@pytest.fixture
def busybox_find(make_task, request: pytest.FixtureRequest) -> tuple[Path, SandboxConfig]:
    """(the task folder, a sandbox config) whose `find` is busybox's, for the backend asked."""
    assert BUSYBOX is not None
    if request.param == "docker":
        fail_without_docker_in_ci()
        task = make_task("busybox-find", env_files={"Dockerfile": BUSYBOX_DOCKERFILE})
        shutil.copy(BUSYBOX, task / "environment" / "busybox")
        return task, DockerSandboxConfig()
    # The workspace brings busybox as bin/find (busybox runs the applet its name says), and
    # the sandbox's PATH has that folder first, so every `find` of the harness is busybox's.
    task = make_task("busybox-find")
    (task / "environment" / "bin").mkdir()
    shutil.copy(BUSYBOX, task / "environment" / "bin" / "find")
    return task, LocalSandboxConfig(env={"PATH": f"/app/bin:{DEFAULT_PATH}"})


BUSYBOX_BACKENDS = [
    pytest.param("local", marks=[requires_bwrap, requires_busybox]),
    pytest.param("docker", marks=[requires_docker, requires_busybox]),
]


@pytest.mark.parametrize("busybox_find", BUSYBOX_BACKENDS, indirect=True)
async def test_verification_works_with_a_busybox_find(busybox_find) -> None:
    """Its find is the one the tests see, and the harness's own uses of find (the fresh
    reward and tests folders, the hook check) work with it: oracle 1, nop 0, no error."""
    task_dir, config = busybox_find
    task = load_task(task_dir)
    probe = _Script("find --help 2>&1 | head -1")
    async with SlotPool() as pool:
        oracle = await run_trial(HarborTrial(task), OracleAgent(), config, pool)
        nop = await run_trial(HarborTrial(task), NopAgent(), config, pool)
        await run_trial(HarborTrial(task), probe, config, pool)
    assert "BusyBox" in probe.output
    assert oracle.error is None and oracle.reward == 1.0, oracle.error
    assert nop.error is None and nop.reward == 0.0, nop.error


@pytest.mark.parametrize("busybox_find", BUSYBOX_BACKENDS, indirect=True)
async def test_a_planted_hook_is_tamper_whatever_find_the_image_has(
    make_task, busybox_find
) -> None:
    """The same planted `import` .pth is tampering with GNU find and with busybox's (which
    lacks -newerct): the changes come from the backend's list, seen from outside, not from a
    search inside the sandbox."""
    busybox_dir, busybox_config = busybox_find
    gnu_config: SandboxConfig = LocalSandboxConfig()
    if isinstance(busybox_config, DockerSandboxConfig):
        gnu_config = DockerSandboxConfig()
    runs = {
        "gnu": (load_task(make_task("gnu-find")), gnu_config),
        "busybox": (load_task(busybox_dir), busybox_config),
    }
    outcomes = {}
    async with SlotPool() as pool:
        for name, (task, config) in runs.items():
            agent = _Script(PLANT_HOOK)
            outcomes[name] = await run_trial(HarborTrial(task), agent, config, pool)
            assert "planted" in agent.output and "zz-hook.pth" in agent.output, agent.output
    for outcome in outcomes.values():
        assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
        assert "zz-hook.pth" in outcome.error.message and outcome.reward is None
