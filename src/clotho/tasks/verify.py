"""A Harbor task's verdict: its `tests/test.sh` run after the agent, in a world the agent did
not shape (the kit: `clotho.verify`).

Before the agent starts, the digests of the programs the tests will run (the shells and
interpreters, and every command `test.sh` names, in every PATH directory) are taken from
outside the sandbox. After the agent, its processes are held and what it changed is judged
(`verify.integrity`, `verify.runner_rules`). Where the backend can hold them (a Docker
container), the tests run in a twin of the sandbox that shares only its network (and Docker's
files for it: hosts, resolv.conf)
(`integrity.verification_world`), and the agent's processes, if it left services, serve
them; elsewhere they are ended and the tests run in place. Either way the reward folder and
`/tests` are made afresh (a link
the agent planted is removed, never followed), links landing there are refused, the tests run
in a fresh process with a clean, pinned environment in the workdir, whatever they started is
stopped, and the reward is read only from a regular file, with a size cap. A reward that is
missing, unreadable or outside the task's range is a `VerifierError`, never 0.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import tarfile
from collections.abc import Awaitable, Callable

from clotho.errors import TamperError, VerifierError
from clotho.rollout.outcome import VerifierOutcome
from clotho.sandbox.base import PathChange, Sandbox
from clotho.sandbox.config import DEFAULT_PATH
from clotho.tasks.harbor import Task
from clotho.verify.integrity import (
    ProgramDigests,
    check_links,
    fresh_exec,
    harness_dirs,
    image_openssl_config,
    named_commands,
    named_paths,
    pin_openssl,
    remove_bytecode,
    remove_setup_leftovers,
    verification_world,
)
from clotho.verify.loader_rules import REBUILD_LOADER_CACHE

TESTS_MOUNT = "/tests"
LOGS_DIR = "/logs/verifier"
REWARD_MAX_BYTES = 64 << 10
_OUTPUT_TAIL = 8000

# What a test script runs besides the commands it names: shells, interpreters, runners.
BASE_PROGRAMS = (
    "bash", "sh", "env", "python3", "python", "pytest", "node", "perl", "uv", "uvx",
    "timeout", "cat", "head", "grep", "sed", "awk", "jq", "diff", "cmp", "test", "mkdir",
    "rm", "tar", "find", "echo", "printf", "sort", "wc", "tr", "git", "sqlite3",
    "chmod", "stat",  # the verifier's own folder preparation and reward inspection run them
    "readlink",  # the check of where the agent's links land (`check_links`)
    "sleep",  # a verification twin's first process, in an image without a shell
    "ldconfig",  # rebuilds the loader's cache before the tests
    "ldconfig.real",  # what Ubuntu's `ldconfig` (a shell script) runs
    "pip", "pip3", "curl", "apt-get", "apt", "dpkg",  # what test scripts install with
    *(f"python3.{m}" for m in range(8, 15)),  # `uvx -p 3.13` finds its interpreter on PATH
)  # fmt: skip
# The verifier's own environment: no user site-packages the agent could have filled, and
# installers' caches of the harness's (a wheel or environment the agent left in ~/.cache is
# never what the tests' `pip install` or `uvx` run), and their system configuration only
# where it is judged. uv prefers the Pythons it manages to
# the system's and `uvx` a tool installed with `uv tool install`: the tests' uv looks for
# both in folders of the harness's, so an interpreter the agent put where uv keeps its own
# (a binary it changed, which no rule reads) is never the tests'.
OPENSSL_PIN = "/logs/.openssl.cnf"
VERIFIER_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PIP_NO_CACHE_DIR": "1",
    "UV_CACHE_DIR": "/logs/.uv-cache",
    "UV_PYTHON_INSTALL_DIR": "/logs/.uv-python",
    "UV_TOOL_DIR": "/logs/.uv-tools",
    # uv reads the system configuration from the first of these that has one, before (and
    # then instead of) /etc/uv/uv.toml, which is judged; pip reads /etc/xdg/pip too.
    "XDG_CONFIG_DIRS": "/logs/.xdg",
    # libcrypto reads the image's configuration, not the agent's (`pin_openssl`).
    "OPENSSL_CONF": OPENSSL_PIN,
}
# Make /logs/verifier and /tests afresh: a link (or a non-folder) is removed, never
# followed; a folder (maybe a mount point) is emptied (by rm -rf, which follows no link: not
# `find -delete`, which busybox's find lacks). Then unpack the tests from stdin.
_PREPARE = f"""set -eu
fresh() {{
  if [ -L "$1" ] || {{ [ -e "$1" ] && [ ! -d "$1" ]; }}; then rm -f -- "$1"; fi
  mkdir -p -- "$1"
  find "$1" -mindepth 1 -maxdepth 1 -exec rm -rf -- {{}} +
}}
fresh /logs
fresh {LOGS_DIR}
fresh {TESTS_MOUNT}
tar -x --no-same-owner -C {TESTS_MOUNT}
chmod -R a+rX {TESTS_MOUNT} {LOGS_DIR}
{REBUILD_LOADER_CACHE}"""
# Which reward file is there, and what it is: nothing is read yet.
_INSPECT = f"""for name in reward.json reward.txt; do
  f={LOGS_DIR}/$name
  if [ -L "$f" ]; then echo "$name link"
  elif [ ! -e "$f" ]; then echo "$name missing"
  elif [ ! -f "$f" ]; then echo "$name special"
  else echo "$name $(stat -c %s -- "$f")"; fi
done
"""

# Where the harness writes after the agent: a link of the agent's landing there makes the tests
# read the harness's own files (their expected output, the reward) as the agent's work.
HARNESS_ROOTS = (TESTS_MOUNT, "/logs", "/solution")
# Made afresh by `_PREPARE` before the check: what is in them now is the harness's.
FRESH_ROOTS = (TESTS_MOUNT, "/logs")


def _verifier_path(task: Task) -> list[str]:
    path = task.config.verifier.env.get("PATH", DEFAULT_PATH)
    return [d.rstrip("/") for d in path.split(":") if d.startswith("/")]


async def program_digests(task: Task, sandbox: Sandbox) -> ProgramDigests:
    """Taken before the agent starts, from outside the sandbox."""
    script = task.tests_dir / "test.sh"
    text = await asyncio.to_thread(script.read_text, errors="replace") if script.is_file() else ""
    names = sorted(set(BASE_PROGRAMS) | named_commands(text))
    files, folders = named_paths(text)
    dirs = _verifier_path(task)
    dirs = [*folders, *(d for d in dirs if d not in folders)]  # sourced: ahead on PATH
    baseline = ProgramDigests(
        path_dirs=dirs,
        names=names,
        digests={},
        files=files,
        harness_dirs=harness_dirs(sandbox),
        runner=list(BASE_PROGRAMS),
        workdir=sandbox.workdir,
    )
    baseline.digests = await sandbox.digests(baseline.paths)
    baseline.openssl_conf = await image_openssl_config(sandbox)
    return baseline


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"{where}: reward must be a number, got {str(value)[:100]!r}")
    try:
        number = float(value)
    except OverflowError as exc:
        raise VerifierError(f"{where}: reward is too large to be a number") from exc
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
    rewards = {str(k)[:200]: _number(v, f"{where} [{str(k)[:200]}]") for k, v in data.items()}
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


def _in_range(task: Task, reward: float, rewards: dict[str, float]) -> None:
    low, high = task.config.verifier.reward_range
    for name, value in {"reward": reward, **rewards}.items():
        if not low <= value <= high:
            raise VerifierError(
                f"{LOGS_DIR}: {name} {value:g} is outside the task's reward range "
                f"[{low:g}, {high:g}] (declare [verifier] reward_range to allow it)"
            )


def _tests_tar(task: Task) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(task.tests_dir, arcname=".")
    return buffer.getvalue()


async def _read_reward(sandbox: Sandbox, test_exit: int, output: str) -> tuple[float, dict]:
    """The one reward of the verification. Both files may be written (Harbor reads
    reward.json first); when both are, they must agree: a program the tests ran (the agent's
    own, judged by them) could have written one of them, and two verdicts that differ are
    not the tests' verdict (`TamperError`), whichever file the forger chose."""
    kinds = dict(
        line.split(" ", 1)
        for line in (await fresh_exec(sandbox, _INSPECT, "inspect the reward folder")).splitlines()
    )
    found: dict[str, tuple[float, dict[str, float]]] = {}
    for name in ("reward.json", "reward.txt"):
        kind = kinds.get(name, "missing")
        if kind == "missing":
            continue
        if kind in ("link", "special"):
            raise VerifierError(f"{LOGS_DIR}/{name} is a {kind}, not a regular file")
        if int(kind) > REWARD_MAX_BYTES:
            raise VerifierError(f"{LOGS_DIR}/{name} has {kind} bytes (at most {REWARD_MAX_BYTES})")
        text = await fresh_exec(
            sandbox, f"head -c {REWARD_MAX_BYTES} -- {LOGS_DIR}/{name}", f"read {name}"
        )
        found[name] = (
            parse_reward_json(text) if name == "reward.json" else (parse_reward_txt(text), {})
        )
    if not found:
        raise VerifierError(
            f"tests/test.sh (exit code {test_exit}) wrote neither {LOGS_DIR}/reward.txt nor "
            f"reward.json; its output ends with: {output[-500:]!r}"
        )
    if len(found) == 2 and not math.isclose(
        found["reward.json"][0], found["reward.txt"][0], rel_tol=1e-9, abs_tol=1e-9
    ):
        raise TamperError(
            f"{LOGS_DIR} holds two rewards that disagree (reward.json "
            f"{found['reward.json'][0]:g}, reward.txt {found['reward.txt'][0]:g}): a program "
            "the tests ran wrote one of them; the verdict is not the tests'"
        )
    return found.get("reward.json") or found["reward.txt"]


async def run_verifier(
    task: Task,
    sandbox: Sandbox,
    baseline: ProgramDigests | None = None,
    timeout_s: float | None = None,
) -> VerifierOutcome:
    """The task's verdict on what the agent left in `sandbox` (see the module docstring)."""
    timeout_s = timeout_s or task.config.verifier.timeout_sec
    async with verification_world(sandbox, baseline) as world:
        return await _judge(
            task, world.sandbox, baseline, world.changes, timeout_s, world.before_tests
        )


async def _judge(
    task: Task,
    world: Sandbox,
    baseline: ProgramDigests | None,
    changes: list[PathChange] | None,
    timeout_s: float,
    before_tests: Callable[[], Awaitable[None]] | None = None,
) -> VerifierOutcome:
    """Prepare /tests and the reward folder in `world`, refuse planted links, run the tests
    there (in the workdir, as Harbor does, with the pinned environment) and read the one
    reward."""
    tests = await asyncio.to_thread(_tests_tar, task)
    await remove_bytecode(world, changes)  # derived: compiled again
    await remove_setup_leftovers(world, baseline)  # the tests' set-up makes its own
    await fresh_exec(world, _PREPARE, "prepare /tests and the reward folder", stdin=tests)
    await pin_openssl(world, baseline, OPENSSL_PIN)
    await check_links(world, baseline, changes, HARNESS_ROOTS, FRESH_ROOTS)
    if before_tests is not None:
        await before_tests()
    result = await world.exec_fresh(
        f"exec 2>&1; exec bash {TESTS_MOUNT}/test.sh",
        timeout=timeout_s,
        env={**VERIFIER_ENV, **task.config.verifier.env},
        cwd=world.workdir,  # Harbor's: the image's WORKDIR (tests use relative paths)
    )
    await world.stop_agent()  # whatever the tests started (the agent's code among it)
    output = (result.stdout + result.stderr)[-_OUTPUT_TAIL:]
    if result.timed_out:
        raise VerifierError(f"tests/test.sh timed out after {timeout_s:g} s")
    reward, rewards = await _read_reward(world, result.exit_code, output)
    _in_range(task, reward, rewards)
    return VerifierOutcome(
        reward=reward,
        rewards=rewards,
        exit_code=result.exit_code,
        output=output,
        duration_s=result.duration_s,
    )
