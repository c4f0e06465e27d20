"""What a native agent binary linked to glibc needs of the task's image, checked before it
runs: glibc's loader and a glibc of the binary's minimum version. A missing one is the task's
error (`TaskError`), named, not a crash of the agent scored as its failure."""

from __future__ import annotations

import shlex

from clotho.errors import TaskError
from clotho.sandbox.base import Sandbox

LOADER = "/lib64/ld-linux-x86-64.so.2"  # the ELF interpreter of glibc binaries on x86-64


def glibc_problem(said: str, agent: str, minimum: tuple[int, int]) -> str | None:
    """What the image lacks, from the probe's line ("none", "glibc 2.36", "glibc unknown")."""
    need = f"glibc >= {minimum[0]}.{minimum[1]}"
    parts = said.split()
    if not parts or parts[0] != "glibc":
        return (
            f"the {agent} agent needs {need} in the task's image (its native binary); "
            "the image has no glibc (e.g. Alpine's musl, a static image)"
        )
    try:
        major, minor = (int(x) for x in parts[-1].split(".")[:2])
    except ValueError:
        return None  # a loader, no getconf: the binary itself will say
    if (major, minor) < minimum:
        return f"the {agent} agent needs {need} in the task's image; it has {parts[-1]}"
    return None


async def check_glibc(
    sandbox: Sandbox, agent: str, minimum: tuple[int, int], *, loader: str = LOADER
) -> None:
    """A `TaskError` naming what `sandbox`'s image lacks for a binary needing glibc `minimum`."""
    probe = (
        f"if [ ! -e {shlex.quote(loader)} ]; then echo none; "
        "else getconf GNU_LIBC_VERSION 2>/dev/null || echo 'glibc unknown'; fi"
    )
    found = await sandbox.exec(probe, timeout=60)
    problem = glibc_problem(found.stdout.strip() if found.exit_code == 0 else "", agent, minimum)
    if problem is not None:
        raise TaskError(problem)
