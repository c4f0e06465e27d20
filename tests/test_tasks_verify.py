"""The verifier: tests enter after the agent, the reward file is cleared, bad rewards are errors."""

from __future__ import annotations

import math

import pytest
from tests.conftest import requires_bwrap

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult
from clotho.errors import VerifierError
from clotho.sandbox import LocalSandboxConfig, open_sandbox
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
    from clotho.agent.reference import NopAgent

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
