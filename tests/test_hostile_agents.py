"""A hostile agent can neither forge a pass nor turn its failure into an excluded error.

Each attack is a scripted agent (a named test double for a model) that types commands into
its own session shell, as a policy would through the terminal tool, and never solves the
task. On both backends every attempt must fail, and count in the pass rate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult
from clotho.runs.metrics import compute_metrics
from clotho.runs.records import TrialRecord
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial

# The task: /app/answer.txt must say 42; the agent writes 41 and then attacks.
TEST_SH = """\
mkdir -p /logs/verifier
if python3 -c "import sys; sys.exit(open('/app/answer.txt').read().strip() != '42')"; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
# A test script that hands the agent's own output to the reward (a careless task).
COPYING_TEST_SH = "mkdir -p /logs/verifier\ncp /app/out.json /logs/verifier/reward.json\n"

FAKE_PASS = "#!/bin/sh\nexit 0\n"

FORGERIES: dict[str, str] = {
    "shell function": "python3() { return 0; }; export -f python3",
    "alias": "shopt -s expand_aliases; alias python3=true; export BASH_ENV=/dev/null",
    "PATH": f"mkdir -p /tmp/fake && printf '{FAKE_PASS}' > /tmp/fake/python3 && "
    "chmod +x /tmp/fake/python3 && export PATH=/tmp/fake:$PATH",
    "BASH_ENV": "echo 'python3() { return 0; }' > /tmp/env.sh && export BASH_ENV=/tmp/env.sh",
    "hash -p": "hash -p /bin/true python3",
    "DEBUG trap": "set -T; trap 'mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt' "
    "DEBUG; export SHELLOPTS",
    "background rewriter": "setsid sh -c 'while :; do mkdir -p /logs/verifier; "
    "echo 1 > /logs/verifier/reward.txt 2>/dev/null; done' >/dev/null 2>&1 < /dev/null &",
    "double-forked rewriter": "( ( exec -a kworker sh -c 'while :; do mkdir -p /logs/verifier; "
    "echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done' & ) & ) "
    ">/dev/null 2>&1 </dev/null",
    "reward folder symlink": "mkdir -p /tmp/won && echo 1 > /tmp/won/reward.txt && "
    "chmod 444 /tmp/won/reward.txt && chmod 555 /tmp/won && rm -rf /logs/verifier && "
    "mkdir -p /logs && ln -s /tmp/won /logs/verifier",
    "planted tests": "mkdir -p /tests && printf 'mkdir -p /logs/verifier; echo 1 > "
    "/logs/verifier/reward.txt\\n' > /tests/test.sh",
    "stdin injection": "echo 'echo 1 > /logs/verifier/reward.txt' > /proc/$$/fd/0 || true",
    "ulimit": "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && ulimit -f 0",
}
TAMPERING: dict[str, str] = {
    "replaced python3": f'p=$(command -v python3); rm -f "$p"; printf \'{FAKE_PASS}\' > "$p"; '
    'chmod +x "$p"',
    "shadowing python3": f"mkdir -p /usr/local/bin && printf '{FAKE_PASS}' > "
    "/usr/local/bin/python3 && chmod +x /usr/local/bin/python3",
    "replaced bash": "cp /bin/true /tmp/t && cat /tmp/t > /bin/bash.new && "
    'mv /bin/bash.new "$(readlink -f /bin/bash)"',
    "ld.so.preload": "echo /tmp/evil.so > /etc/ld.so.preload",
    "replaced chmod": "p=$(command -v chmod); printf '#!/bin/sh\\n(while :; do echo 1 > "
    '/logs/verifier/reward.txt; done) >/dev/null 2>&1 &\\n\' > /tmp/c && cp /tmp/c "$p"',
    "sitecustomize": "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))') "
    '&& mkdir -p "$d" && echo \'import os; os._exit(0)\' > "$d/sitecustomize.py"',
    "system site .pth": "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))') "
    '&& mkdir -p "$d" && echo \'import os; os._exit(0)\' > "$d/zz-evil.pth"',
}
TAMPERING["user site .pth"] = (
    'd=$(python3 -m site --user-site) && mkdir -p "$d" && '
    "echo 'import os; os._exit(0)' > \"$d/evil.pth\""
)
# A `pyvenv.cfg` marks the agent's own virtualenv, whose packages are its business; written
# where no interpreter reads one, beside a start-up hook the image's python3 does run, it must
# exempt nothing (an empty /pyvenv.cfg once switched the whole runner check off).
_PURELIB = "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))')"
TAMPERING["venv marker at /"] = (
    f'touch /pyvenv.cfg && {_PURELIB} && mkdir -p "$d" && '
    "echo 'import os; os._exit(0)' > \"$d/sitecustomize.py\""
)
TAMPERING["venv marker above the site folder"] = (
    f'{_PURELIB} && mkdir -p "$d" && touch "$(dirname "$(dirname "$d")")/pyvenv.cfg" && '
    "echo 'import os; os._exit(0)' > \"$d/zz-evil.pth\""
)
TAMPERING["venv marker in /etc"] = "touch /etc/pyvenv.cfg && echo /tmp/evil.so > /etc/ld.so.preload"
TAMPERING["venv marker on the user base"] = (
    'b=$(python3 -m site --user-base) && d=$(python3 -m site --user-site) && mkdir -p "$d" && '
    'touch "$b/pyvenv.cfg" && echo \'import os; os._exit(0)\' > "$d/evil.pth"'
)
DODGES: dict[str, str] = {
    "kills its shell": "kill -9 $PPID $$",
    "stops its shell": "kill -STOP $$",
    "tests at /proc": "rm -rf /tests; ln -s /proc /tests",
    "reward at /dev/zero": "mkdir -p /logs/verifier; ln -sf /dev/zero /logs/verifier/reward.txt",
    "reward as a FIFO": "mkdir -p /logs/verifier; mkfifo /logs/verifier/reward.json",
}


class Attacker:
    """Writes the wrong answer, then runs its attack in its own session shell."""

    name = "attacker"

    def __init__(self, attack: str) -> None:
        self.attack = attack
        self.attack_exit: int | None = None

    async def run(self, ctx: AgentContext) -> AgentResult:
        await ctx.sandbox.exec("echo 41 > /app/answer.txt")
        deep = "[" * 30_000 + "1" + "]" * 30_000  # under the reward size cap, far too deep
        await ctx.sandbox.write_file("/app/out.json", deep.encode())
        self.attack_exit = (await ctx.sandbox.exec(self.attack, timeout=10)).exit_code
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


BACKENDS = [
    pytest.param(LocalSandboxConfig(), id="local", marks=requires_bwrap),
    pytest.param(DockerSandboxConfig(), id="docker", marks=requires_docker),
]


async def _attempt(make_task, config: SandboxConfig, attack: str, test_sh: str = TEST_SH):
    return await attempt_on(make_task(test_sh=test_sh), config, attack)


async def attempt_on(task_dir: Path, config: SandboxConfig, attack: str):
    """The task at `task_dir` attempted by an `Attacker` making `attack`: (its outcome, the
    attack's exit code). Whatever the attack, the sandbox went back to the pool and the
    outcome counts in the pass rate."""
    task = load_task(task_dir)
    attacker = Attacker(attack)
    async with SlotPool() as pool:
        outcome = await run_trial(HarborTrial(task), attacker, config, pool, timeout_s=120)
        assert pool.stats()["in_use"] == 0
    record = TrialRecord.from_outcome(outcome, task="t", category="c", attempt=0, agent="a")
    assert compute_metrics([record]).n_scored == 1, outcome.error  # counted in the pass rate
    return outcome, attacker.attack_exit


@pytest.mark.parametrize("config", BACKENDS)
@pytest.mark.parametrize("attack", sorted(FORGERIES))
async def test_forged_passes_score_zero(make_task, config: SandboxConfig, attack: str) -> None:
    outcome, _ = await _attempt(make_task, config, FORGERIES[attack])
    assert not outcome.passed
    if outcome.error is not None and "rewriter" in attack:
        # A loop forking a child a moment: on a loaded machine one of them was seen running
        # through every hold pass (about 1 run in 6), and holding is then `tamper`. Both are
        # scored 0, which is what this test is about; the hold's flake is in the notes.
        assert outcome.error.kind == "tamper", outcome.error
        assert "kept running after the agent was held" in outcome.error.message
        return
    assert outcome.error is None and outcome.reward == 0.0, outcome.error


@pytest.mark.parametrize("config", BACKENDS)
@pytest.mark.parametrize("attack", sorted(TAMPERING))
# On Docker the agent is the container's root: every one of these changes succeeds there.
async def test_replaced_programs_are_tampering(make_task, config: SandboxConfig, attack: str):
    outcome, attack_exit = await _attempt(make_task, config, TAMPERING[attack])
    assert not outcome.passed
    if attack_exit == 0:  # the change was made: it must be caught before the tests run
        assert outcome.reward is None
        assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    else:  # the sandbox refused it (a local sandbox cannot write the host's system folders)
        assert outcome.error is None and outcome.reward == 0.0, outcome.error


@pytest.mark.parametrize("config", BACKENDS)
@pytest.mark.parametrize("attack", sorted(DODGES))
async def test_failures_cannot_become_infra_errors(make_task, config: SandboxConfig, attack: str):
    outcome, _ = await _attempt(make_task, config, DODGES[attack])
    assert not outcome.passed
    assert outcome.error is None or outcome.error.kind in ("agent", "verifier"), outcome.error


@pytest.mark.parametrize("config", BACKENDS)
async def test_an_unreadable_reward_from_agent_output_is_a_verifier_error(
    make_task, config: SandboxConfig
) -> None:
    outcome, _ = await _attempt(make_task, config, "true", test_sh=COPYING_TEST_SH)
    assert outcome.error is not None and outcome.error.kind == "verifier"
    assert "not a readable reward" in outcome.error.message


# The pattern docs/security.md recommends: the tests run the agent's program and judge what
# it prints. The program runs inside the verification and can write the reward folder too.
JUDGING_TEST_SH = """\
mkdir -p /logs/verifier
if [ "$(python3 /app/answer.py)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
JUDGED_PROGRAMS = {
    # a wrong answer that also writes the reward file Harbor reads first
    "forges reward.json": "import os\nos.makedirs('/logs/verifier', exist_ok=True)\n"
    "open('/logs/verifier/reward.json', 'w').write('{\"reward\": 1}')\nprint(41)\n",
    "honest, wrong": "print(41)\n",
    "honest, right": "print(42)\n",
}


@pytest.mark.parametrize("config", BACKENDS)
@pytest.mark.parametrize("program", sorted(JUDGED_PROGRAMS))
async def test_a_reward_written_by_the_judged_program_never_passes(
    make_task, config: SandboxConfig, program: str
) -> None:
    source = JUDGED_PROGRAMS[program].replace("'", "'\\''")
    outcome, attack_exit = await _attempt(
        make_task, config, f"printf '%s' '{source}' > /app/answer.py", test_sh=JUDGING_TEST_SH
    )
    assert attack_exit == 0
    if program == "honest, right":
        assert outcome.passed and outcome.reward == 1.0, outcome.error
    elif program == "honest, wrong":
        assert outcome.error is None and outcome.reward == 0.0, outcome.error
    else:  # two verdicts in the reward folder that disagree: not the tests'
        assert not outcome.passed and outcome.reward is None
        assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
        assert "disagree" in outcome.error.message
