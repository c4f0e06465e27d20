"""Every program the verifier's own scripts run in the sandbox is a checked one.

The integrity checks run shell scripts inside the world they judge (reading `.pth` files
with grep, links with readlink, removing leftovers with rm); a program of the agent's first
on PATH under one of those names would answer them as it likes. Each script's commands are
read with the same parser the task format uses for test scripts (`named_commands`); words
that are no program on this host (functions, case labels, variables) are left out.
"""

from __future__ import annotations

import shutil

import pytest

from clotho.swe import verify as swe_verify
from clotho.tasks import verify as tasks_verify
from clotho.verify import integrity, runner_rules
from clotho.verify.integrity import KIT_PROGRAMS, ProgramDigests, named_commands

# The shell's own commands: never looked up on PATH.
BUILTINS = {"read", "printf", "echo", "true", "break", "continue", "set", "cd", "export", "test"}
# `_INSPECT`'s case labels (kinds of item), not commands it runs.
LABELS = {"dpkg", "runner", "pth", "entry_points"}


def programs(script: str) -> set[str]:
    return {
        word
        for word in named_commands(script) - BUILTINS - LABELS
        if shutil.which(word) is not None
    }


KIT_SCRIPTS = {
    "inspect": runner_rules._INSPECT,
    "land": integrity._LAND,
    "remove": integrity._REMOVE,
    "remove leftovers": integrity._REMOVE_LEFTOVERS,
    "changed hooks": integrity._CHANGED_HOOKS,
}


@pytest.mark.parametrize("name", sorted(KIT_SCRIPTS))
def test_the_kits_scripts_run_only_kit_programs(name: str) -> None:
    found = programs(KIT_SCRIPTS[name])
    assert found, f"{name}: no program found: the parser no longer reads the script"
    assert found <= set(KIT_PROGRAMS), found - set(KIT_PROGRAMS)


def test_every_baseline_checks_the_kits_programs() -> None:
    """Whatever names a task format lists, the baseline digests the kit's programs too."""
    baseline = ProgramDigests(path_dirs=["/usr/bin"], names=["python3"], digests={})
    assert set(KIT_PROGRAMS) <= set(baseline.names)
    assert "/usr/bin/grep" in baseline.paths


@pytest.mark.parametrize(
    ("script", "names"),
    [
        (swe_verify._prepare_script(), swe_verify.PROGRAMS),
        (swe_verify._restore_script("/testbed"), swe_verify.PROGRAMS),
        (tasks_verify._PREPARE, tasks_verify.BASE_PROGRAMS),
        (tasks_verify._INSPECT, tasks_verify.BASE_PROGRAMS),
    ],
    ids=["swe-prepare", "swe-restore", "tasks-prepare", "tasks-inspect"],
)
def test_each_formats_scripts_run_only_its_checked_programs(script: str, names) -> None:
    found = programs(script)
    assert found, "no program found: the parser no longer reads the script"
    missing = found - set(names) - set(KIT_PROGRAMS)
    assert not missing, missing
