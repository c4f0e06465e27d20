"""Agents from the npm registry: installed once on the host, pinned, into the agents cache.

`npm_install` runs the machine's own `npm` (its configured registry; nothing here names a
host) for linux x64 with install scripts off, into a scratch folder, then keeps only the files
the adapter names (`keep`: a path inside `node_modules` → a path inside the install's `site`),
so the install holds the agent's native binary and what it runs, not a JavaScript tree. The
folder is `cache_dir/agents/<agent>-<version>`, stamped last and renamed into place under a
lock, like `pip_install`'s: a half-made install is never used, concurrent runs wait for the
first. The npm agents bundled here ship self-contained binaries, so no Node runtime is needed
in the sandbox (and none is installed in the task's image).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from clotho.errors import ConfigError, InfraError
from clotho.installed_agents.base import AgentInstall, cached_install, run_installer

# The stamp's `python` field: these installs do not depend on the sandbox's python.
ANY_PYTHON = "any"


async def npm_install(
    agent: str,
    version: str,
    packages: list[str],
    keep: Mapping[str, str],
    *,
    cache_dir: Path,
) -> AgentInstall:
    """`packages` (pinned `name@version`) installed for linux x64 (glibc), the `keep` files
    moved into `site`, once."""

    async def build(work: Path) -> tuple[list[str], list[str]]:
        npm = shutil.which("npm")
        if npm is None:
            raise ConfigError(f"the {agent} agent is installed with npm, which is not on this PATH")
        (work / "npm").mkdir()
        argv = [npm, "install", "--prefix", str(work / "npm"), "--no-save", "--ignore-scripts",
                "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error",
                "--os=linux", "--cpu=x64", "--libc=glibc", *packages]  # fmt: skip
        await run_installer(agent, "npm", argv, cwd=work / "npm")
        modules = work / "npm" / "node_modules"
        installed = sorted(_installed(modules))
        for source, target in keep.items():
            path = modules / source
            if not path.exists():
                raise InfraError(f"the {agent} agent's npm install has no {source}")
            (work / "site" / target).parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, work / "site" / target)
        await asyncio.to_thread(shutil.rmtree, work / "npm")
        return list(packages), installed

    return await cached_install(agent, version, ANY_PYTHON, f"{agent}-{version}", cache_dir, build)


def _installed(modules: Path) -> list[str]:
    """name==version of every package npm put in `modules` (scoped ones included)."""
    import json

    found = []
    for manifest in [*modules.glob("*/package.json"), *modules.glob("@*/*/package.json")]:
        try:
            data = json.loads(manifest.read_text())
            found.append(f"{data['name']}=={data['version']}")
        except (OSError, ValueError, KeyError):
            continue
    return found
