"""Run a task's tests after the agent is done, and read the reward they wrote.

The tests enter the sandbox only now, the reward folder is emptied first, and a reward that
is missing or cannot be parsed is a `VerifierError`, never 0.
"""

from __future__ import annotations

import json
import math

from clotho.errors import VerifierError
from clotho.rollout.outcome import VerifierOutcome
from clotho.sandbox.base import Sandbox
from clotho.tasks.harbor import Task

TESTS_MOUNT = "/tests"
LOGS_DIR = "/logs/verifier"
_OUTPUT_TAIL = 8000


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"{where}: reward must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise VerifierError(f"{where}: reward must be finite, got {value!r}")
    return number


def parse_reward_json(text: str) -> tuple[float, dict[str, float]]:
    """`{"reward": 1}` or named rewards `{"tests": 1, "style": 0.5}` (their mean is the reward)."""
    where = f"{LOGS_DIR}/reward.json"
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # also: integers past 4300 digits, deep nesting
        raise VerifierError(f"{where}: not a readable reward: {str(exc)[:200]}") from exc
    if isinstance(data, int | float) and not isinstance(data, bool):
        return _number(data, where), {}
    if not isinstance(data, dict) or not data:
        raise VerifierError(f"{where}: expected an object of named rewards, got {text[:100]!r}")
    rewards = {str(k): _number(v, f"{where} [{k}]") for k, v in data.items()}
    if "reward" in rewards:
        return rewards["reward"], rewards
    return sum(rewards.values()) / len(rewards), rewards


def parse_reward_txt(text: str) -> float:
    where = f"{LOGS_DIR}/reward.txt"
    stripped = text.strip()
    try:
        value = float(stripped)
    except (ValueError, OverflowError) as exc:
        raise VerifierError(f"{where}: expected one number, got {stripped[:100]!r}") from exc
    return _number(value, where)


async def run_verifier(
    task: Task, sandbox: Sandbox, timeout_s: float | None = None
) -> VerifierOutcome:
    timeout_s = timeout_s or task.config.verifier.timeout_sec
    prep = await sandbox.exec(
        # Empty the folders rather than remove them: they may be mount points.
        f"mkdir -p {LOGS_DIR} {TESTS_MOUNT} && find {LOGS_DIR} {TESTS_MOUNT} -mindepth 1 -delete",
        timeout=60,
    )
    if prep.exit_code != 0:
        raise VerifierError(f"cannot prepare the verifier folders: {prep.stderr.strip()}")
    await sandbox.upload(task.tests_dir, TESTS_MOUNT)
    result = await sandbox.exec(
        f"exec 2>&1\nbash {TESTS_MOUNT}/test.sh",
        timeout=timeout_s,
        env=task.config.verifier.env or None,
    )
    output = (result.stdout + result.stderr)[-_OUTPUT_TAIL:]
    if result.timed_out:
        raise VerifierError(f"tests/test.sh timed out after {timeout_s:g} s")
    rewards: dict[str, float] = {}
    try:
        reward, rewards = parse_reward_json(
            (await sandbox.read_file(f"{LOGS_DIR}/reward.json")).decode(errors="replace")
        )
    except FileNotFoundError:
        try:
            reward = parse_reward_txt(
                (await sandbox.read_file(f"{LOGS_DIR}/reward.txt")).decode(errors="replace")
            )
        except FileNotFoundError as exc:
            raise VerifierError(
                f"tests/test.sh (exit code {result.exit_code}) wrote neither "
                f"{LOGS_DIR}/reward.txt nor reward.json; its output ends with: {output[-500:]!r}"
            ) from exc
    return VerifierOutcome(
        reward=reward,
        rewards=rewards,
        exit_code=result.exit_code,
        output=output,
        duration_s=result.duration_s,
    )
