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
import fcntl
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

from clotho.errors import ConfigError, InfraError
from clotho.installed_agents.base import AgentInstall, InstallStamp

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
    folder = cache_dir / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / f"{agent}-{version}"
    found = _read_stamp(root)
    if found is not None:
        return AgentInstall(root, found)
    npm = shutil.which("npm")
    if npm is None:
        raise ConfigError(f"the {agent} agent is installed with npm, which is not on this PATH")
    lock = os.open(folder / f".{agent}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        found = _read_stamp(root)
        if found is not None:
            return AgentInstall(root, found)
        work = folder / f".{root.name}.partial"
        await asyncio.to_thread(shutil.rmtree, work, True)
        (work / "npm").mkdir(parents=True)
        started = time.monotonic()
        argv = [npm, "install", "--prefix", str(work / "npm"), "--no-save", "--ignore-scripts",
                "--no-audit", "--no-fund", "--no-package-lock", "--loglevel=error",
                "--os=linux", "--cpu=x64", "--libc=glibc", *packages]  # fmt: skip
        await _run(agent, argv, cwd=work / "npm")
        modules = work / "npm" / "node_modules"
        installed = sorted(_installed(modules))
        for source, target in keep.items():
            path = modules / source
            if not path.exists():
                raise InfraError(f"the {agent} agent's npm install has no {source}")
            (work / "site" / target).parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, work / "site" / target)
        await asyncio.to_thread(shutil.rmtree, work / "npm")
        size = sum(p.stat().st_size for p in (work / "site").rglob("*") if p.is_file())
        stamp = InstallStamp(
            agent=agent,
            version=version,
            python=ANY_PYTHON,
            requirements=list(packages),
            installed=installed,
            bytes=size,
            seconds=time.monotonic() - started,
        )
        (work / "install.json").write_text(stamp.model_dump_json(indent=2))
        if root.exists():  # a folder without a stamp is no install: replaced, under the lock
            await asyncio.to_thread(shutil.rmtree, root)
        os.rename(work, root)
        return AgentInstall(root, stamp)
    finally:
        os.close(lock)


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


def _read_stamp(root: Path) -> InstallStamp | None:
    try:
        return InstallStamp.model_validate_json((root / "install.json").read_text())
    except (OSError, ValueError):
        return None


async def _run(agent: str, argv: list[str], *, cwd: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        tail = output.decode(errors="replace")[-2000:]
        raise InfraError(f"installing the {agent} agent failed (npm): {tail}")
