"""Normal installs are never tampering (docs/security.md): a task whose reference solution
installs a new program, adds a path-only `.pth` file to the system site-packages or makes a
virtualenv passes with the oracle and fails with nop, on the local backend and on Docker.

The tamper check refuses a program the tests run that was replaced or shadowed, and a `.pth`
with `import` lines in a system site folder; a program that did not exist before, a `.pth`
that only adds a path, and a virtualenv's own start-up hooks are the agent's work, judged by
the tests like any other.
"""

from __future__ import annotations

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import fail_without_docker_in_ci, requires_docker

from clotho.agent.reference import NopAgent, OracleAgent
from clotho.sandbox import DockerSandboxConfig, LocalSandboxConfig, SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial


def _reward_if(condition: str) -> str:
    return (
        f"mkdir -p /logs/verifier\nif {condition}; then echo 1; else echo 0; fi "
        "> /logs/verifier/reward.txt\n"
    )


# A new program in /usr/local/bin (first in PATH), run by name by the tests.
NEW_PROGRAM = {
    "solve_sh": """\
cat > /usr/local/bin/clotho-greet <<'EOF'
#!/bin/sh
echo "hello from an installed program"
EOF
chmod 755 /usr/local/bin/clotho-greet
""",
    "test_sh": _reward_if('[ "$(clotho-greet)" = "hello from an installed program" ]'),
}
# A path-only .pth in the interpreter's own site-packages (what most pip installs add).
PATH_PTH = {
    "solve_sh": """\
set -e
mkdir -p /opt/clotho-lib
echo 'WORD = "found through a .pth"' > /opt/clotho-lib/clotho_pth_mod.py
d=$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
mkdir -p "$d"
printf '# a library outside site-packages\\n/opt/clotho-lib\\n' > "$d/clotho-lib.pth"
""",
    "test_sh": _reward_if(
        "python3 -c \"import clotho_pth_mod, sys; sys.exit(clotho_pth_mod.WORD != 'found "
        "through a .pth')\""
    ),
}
# A virtualenv (no pip: the base image has no ensurepip) holding a module, the `import`
# .pth setuptools puts in every venv, and a launcher on PATH that runs the venv's Python.
VENV = {
    "solve_sh": """\
set -e
python3 -m venv --without-pip /opt/clotho-venv
site=$(/opt/clotho-venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo 'WORD = "found in the venv"' > "$site/clotho_venv_mod.py"
echo "import os; os.environ.setdefault('CLOTHO_VENV_HOOK', 'ran')" > "$site/distutils-precedence.pth"
cat > /usr/local/bin/clotho-venv-tool <<'EOF'
#!/opt/clotho-venv/bin/python
import os, sys
import clotho_venv_mod
print(clotho_venv_mod.WORD, sys.prefix != sys.base_prefix, os.environ.get("CLOTHO_VENV_HOOK"))
EOF
chmod 755 /usr/local/bin/clotho-venv-tool
""",
    "test_sh": _reward_if('[ "$(clotho-venv-tool)" = "found in the venv True ran" ]'),
}

CASES = [
    pytest.param(NEW_PROGRAM, LocalSandboxConfig(), id="new-program-local", marks=requires_bwrap),
    pytest.param(
        NEW_PROGRAM, DockerSandboxConfig(), id="new-program-docker", marks=requires_docker
    ),
    # A local sandbox cannot write the host's root-owned site-packages (docs/security.md:
    # tasks that install system packages belong on Docker), so this one is Docker's.
    pytest.param(PATH_PTH, DockerSandboxConfig(), id="path-pth-docker", marks=requires_docker),
    pytest.param(VENV, LocalSandboxConfig(), id="venv-local", marks=requires_bwrap),
    pytest.param(VENV, DockerSandboxConfig(), id="venv-docker", marks=requires_docker),
]


@pytest.mark.parametrize(("task", "config"), CASES)
async def test_a_normal_install_passes_with_the_oracle_and_fails_with_nop(
    make_task, task: dict[str, str], config: SandboxConfig
) -> None:
    if isinstance(config, DockerSandboxConfig):
        fail_without_docker_in_ci()
    loaded = load_task(make_task(**task))
    async with SlotPool() as pool:
        oracle = await run_trial(HarborTrial(loaded), OracleAgent(), config, pool)
        nop = await run_trial(HarborTrial(loaded), NopAgent(), config, pool)
    assert oracle.error is None, oracle.error  # never `tamper`: nothing the tests run changed
    assert oracle.reward == 1.0 and oracle.passed
    assert nop.error is None, nop.error
    assert nop.reward == 0.0 and not nop.passed
