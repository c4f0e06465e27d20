"""Third-party agent CLIs run inside the task's sandbox, their model calls through the gateway.

An `InstalledAgent` is a small adapter: how its package is installed on the host (pinned, from
the package registry, once, into the cache under `~/.cache/clotho/agents`), the command that
runs it headless on an instruction, the environment that points it at the gateway, and where
its own trajectory lands. Adapters register by name (`register_agent`), so adding one touches
nothing else. `InstalledAgentRunner` is the `Agent` that runs one: it opens a gateway trial,
links the sandbox to it (`gateway.channel`), exposes the install, runs the command with the
trial's token (never the real key), and returns the conversation the gateway recorded, with
the record itself and the agent's own files (`AgentResult.installed`).

Exposure: the runner asks for the cache's `agents` folder as a read-only mount at
`AGENTS_MOUNT` (`sandbox_mounts`, which the rollout adds to the sandbox's config); the host
backends bind it (no copy, and the agent cannot change it). A backend that cannot bind (a
remote one, unsafe-local) gets the tree uploaded instead (`expose_install`).
"""

from __future__ import annotations

import abc
import asyncio
import fcntl
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from clotho.agent.base import AgentContext
from clotho.agent.result import AgentResult, InstalledAgentTrace, StopReason
from clotho.errors import ConfigError, InfraError, TaskError
from clotho.gateway.channel import link_sandbox
from clotho.gateway.record import GatewayLimits, GatewayRecord
from clotho.gateway.server import Gateway
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import ReadOnlyMount

ModelApiName = Literal["openai-chat", "openai-responses", "anthropic-messages"]
# Adapters of other packages: an entry point in this group names an `InstalledAgent` subclass
# (registered under its `name`) or a module that registers its own on import.
ENTRY_POINTS = "clotho.installed_agents"
# Where installs are exposed inside the sandbox: the cache's `agents` folder, bound read-only.
AGENTS_MOUNT = "/opt/clotho-agents"
# Where an agent's own logs and trajectory go (Harbor's convention).
AGENT_LOGS = "/logs/agent"
MAX_TRAJECTORY_BYTES = 64 << 20

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """`~/.cache/clotho` (XDG_CACHE_HOME if set): installs are kept across runs."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clotho"


class InstallStamp(BaseModel):
    """What an install folder holds, written last: a folder without it is unfinished."""

    schema_version: Literal[1] = 1
    agent: str
    version: str
    python: str = Field(description="the sandbox python (major.minor) the wheels are for")
    requirements: list[str]
    installed: list[str] = Field(description="every distribution installed, name==version")
    bytes: int
    seconds: float


@dataclass(frozen=True)
class AgentInstall:
    """A finished install on the host: `site` is what goes on the agent's PYTHONPATH."""

    root: Path
    stamp: InstallStamp

    @property
    def site(self) -> Path:
        return self.root / "site"


class InstalledAgent(abc.ABC):
    """One third-party agent: subclass, set the class fields, `register_agent(cls)`."""

    name: str
    version: str
    apis: tuple[ModelApiName, ...]
    trajectory_file: str  # inside AGENT_LOGS
    # A Python agent's wheels are built for the sandbox's python3; a native binary needs none.
    needs_python: bool = True

    async def check_image(self, sandbox: Sandbox) -> None:
        """Raise a `TaskError` naming what the image lacks for this agent (default: nothing
        beyond the python3 that `needs_python` asks for)."""
        return None

    @abc.abstractmethod
    async def prepare(self, python: str, cache_dir: Path) -> AgentInstall:
        """Install (once, cached) for a sandbox whose python3 is `python` (major.minor)."""

    @abc.abstractmethod
    def command(self, instruction: str, install_dir: str, workdir: str) -> str:
        """Shell: run the agent headless on `instruction`, its install at `install_dir`."""

    @abc.abstractmethod
    def env(self, gateway_env: dict[str, str], install_dir: str) -> dict[str, str]:
        """The agent's environment: the gateway's (`GatewayTrial.env`) and its own settings."""

    @property
    def trajectory_path(self) -> str:
        return f"{AGENT_LOGS}/{self.trajectory_file}"


_REGISTRY: dict[str, Callable[[], InstalledAgent]] = {}


def register_agent(name: str, factory: Callable[[], InstalledAgent]) -> None:
    _REGISTRY[name] = factory


_PLUGINS: list[str] = []  # entry points loaded (once per process)


def _load_adapters() -> None:
    """The bundled adapters (registered when the package is imported) and, once, those other
    packages declare (`ENTRY_POINTS`); one that fails to load is said, never fatal."""
    import clotho.installed_agents  # noqa: F401

    if _PLUGINS:
        return
    _PLUGINS.append("loaded")
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS):
        try:
            found = point.load()
        except Exception as exc:
            log.warning("the installed agent %s (%s) did not load: %s", point.name, point.value,
                        exc)  # fmt: skip
            continue
        if isinstance(found, type) and issubclass(found, InstalledAgent):
            register_agent(found.name, found)


def installed_agent(name: str) -> InstalledAgent:
    _load_adapters()
    try:
        return _REGISTRY[name]()
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ConfigError(f"unknown installed agent {name!r}; known: {known}") from None


def agent_names() -> list[str]:
    _load_adapters()
    return sorted(_REGISTRY)


# --- installing from the package registry ---------------------------------------------------


async def pip_install(
    agent: str,
    version: str,
    requirements: list[str],
    *,
    python: str,
    cache_dir: Path,
    no_deps: Sequence[str] = (),
) -> AgentInstall:
    """`requirements` (pinned) installed with pip as wheels for CPython `python` on x86-64
    Linux into `cache_dir/agents/<agent>-<version>-py<python>/site`, once (`cached_install`).
    `no_deps` are installed without their own
    dependencies (for a package whose full set holds what a headless run never imports).
    Modules are byte-compiled here (by the host's python: used where the sandbox's has the
    same minor version), so an agent that imports litellm starts in seconds, not twenty."""

    async def build(work: Path) -> tuple[list[str], list[str]]:
        platform = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64",
                    "linux_x86_64"]  # fmt: skip
        base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                "--target", str(work / "site"), "--only-binary=:all:",
                "--implementation", "cp", "--python-version", python]  # fmt: skip
        for tag in platform:
            base += ["--platform", tag]
        if no_deps:
            await run_installer(agent, "pip", [*base, "--no-deps", *no_deps])
            await run_installer(agent, "pip", [*base, "--upgrade", *requirements])
        else:
            await run_installer(agent, "pip", [*base, *requirements])
        installed = sorted(
            f"{p.name.removesuffix('.dist-info').replace('-', '==', 1)}"
            for p in (work / "site").glob("*.dist-info")
        )
        return [*no_deps, *requirements], installed

    return await cached_install(agent, version, python, f"{agent}-{version}-py{python}",
                                cache_dir, build)  # fmt: skip


async def cached_install(
    agent: str,
    version: str,
    python: str,
    name: str,
    cache_dir: Path,
    build: Callable[[Path], Awaitable[tuple[list[str], list[str]]]],
) -> AgentInstall:
    """The install `cache_dir/agents/<name>`, made once by `build(work)` (which fills
    `work/site` and returns the requirements asked for and the packages installed): a lock
    makes concurrent runs wait for the first, the stamp is written last and the folder
    renamed into place, so a half-made install is never used."""
    folder = cache_dir / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / name
    found = _read_stamp(root)
    if found is not None:
        return AgentInstall(root, found)
    lock = os.open(folder / f".{agent}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        found = _read_stamp(root)
        if found is not None:
            return AgentInstall(root, found)
        work = folder / f".{root.name}.partial"
        await asyncio.to_thread(shutil.rmtree, work, True)
        work.mkdir(parents=True)
        started = time.monotonic()
        requirements, installed = await build(work)
        stamp = InstallStamp(
            agent=agent,
            version=version,
            python=python,
            requirements=requirements,
            installed=installed,
            bytes=await asyncio.to_thread(_tree_bytes, work / "site"),
            seconds=time.monotonic() - started,
        )
        (work / "install.json").write_text(stamp.model_dump_json(indent=2))
        if root.exists():  # a folder without a stamp is no install: replaced, under the lock
            await asyncio.to_thread(shutil.rmtree, root)
        os.rename(work, root)
        return AgentInstall(root, stamp)
    finally:
        os.close(lock)  # releases the lock


def _read_stamp(root: Path) -> InstallStamp | None:
    try:
        return InstallStamp.model_validate_json((root / "install.json").read_text())
    except (OSError, ValueError):
        return None


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


async def run_installer(agent: str, tool: str, argv: list[str], cwd: Path | None = None) -> None:
    """Run an installer (`tool`: pip, npm); its failure is infra, with its output's end."""
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
        raise InfraError(f"installing the {agent} agent failed ({tool}): {tail}")


# --- in the sandbox -----------------------------------------------------------------------


async def sandbox_python(sandbox: Sandbox, agent: str, minimum: tuple[int, int]) -> str:
    """The sandbox image's python3 as major.minor; a `TaskError` naming what the agent needs
    when it is missing or too old."""
    found = await sandbox.exec(
        "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'", timeout=60
    )
    text = found.stdout.strip()
    need = f"{minimum[0]}.{minimum[1]}"
    if found.exit_code != 0 or not text:
        raise TaskError(
            f"the {agent} agent needs python3 >= {need} in the task's image; it has none"
        )
    major, minor = (int(x) for x in text.split("."))
    if (major, minor) < minimum:
        raise TaskError(
            f"the {agent} agent needs python3 >= {need} in the task's image; it has {text}"
        )
    return text


def agents_mount(cache_dir: Path) -> ReadOnlyMount:
    """The cache's installs, read-only at `AGENTS_MOUNT` (made if missing: a bind needs it)."""
    folder = cache_dir / "agents"
    folder.mkdir(parents=True, exist_ok=True)
    return ReadOnlyMount(source=str(folder.resolve()), target=AGENTS_MOUNT)


async def bound_install(sandbox: Sandbox, install: AgentInstall, cache_dir: Path) -> str | None:
    """The install's folder where the backend bound the cache (`agents_mount`), if it did:
    finished installs show there (stamp included) even when made after the sandbox started."""
    if install.root.parent.resolve() != (cache_dir / "agents").resolve():
        return None
    inner = f"{AGENTS_MOUNT}/{install.root.name}"
    probe = await sandbox.exec(
        f"test -f {shlex.quote(inner)}/install.json && test ! -w {shlex.quote(inner)}", timeout=60
    )
    return inner if probe.ok else None


async def expose_install(sandbox: Sandbox, install: AgentInstall, name: str) -> str:
    """The install's folder inside the sandbox, uploaded (the fallback where the backend bound
    nothing): into `AGENTS_MOUNT/<name>`, or /tmp's where /opt is read-only. The agent can
    change its own copy, never the host's cache, and nothing of it is on the verifier's path."""
    for parent in (AGENTS_MOUNT, "/tmp/clotho-agents"):
        probe = await sandbox.exec(f"mkdir -p {parent} && test -w {parent}", timeout=60)
        if probe.ok:
            target = f"{parent}/{name}"
            await sandbox.upload(install.site, f"{target}/site")
            return target
    raise InfraError("no writable folder in the sandbox to put the agent's install in")


@dataclass
class InstalledRun:
    """What one installed agent's run left: the gateway's record and the agent's own files."""

    record: GatewayRecord
    exit_code: int
    timed_out: bool
    output: str  # the command's stdout and stderr tails
    trajectory: str | None  # the agent's own trajectory file, if it wrote one
    prepare_s: float
    agent_s: float
    exposure: Literal["bind", "upload"] = "upload"


_STOP: dict[str, StopReason] = {
    "turns": "max_turns",
    "tokens": "token_limit",
    "context": "token_limit",
    "wall_clock": "time_limit",
}


@dataclass
class InstalledAgentRunner:
    """The `Agent` that runs an installed agent in the rollout's sandbox, through `gateway`.

    `runs` keeps each run's `InstalledRun` (the gateway record and the agent's trajectory)
    until the rollout stores it with the trial."""

    agent: InstalledAgent
    gateway: Gateway
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    cache_dir: Path = field(default_factory=default_cache_dir)
    minimum_python: tuple[int, int] = (3, 10)
    runs: list[InstalledRun] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.agent.name

    def sandbox_mounts(self) -> list[ReadOnlyMount]:
        """What the rollout binds into this agent's sandboxes: the installs, read-only."""
        return [agents_mount(self.cache_dir)]

    async def run(self, ctx: AgentContext) -> AgentResult:
        started = time.monotonic()
        sandbox = ctx.sandbox
        await self.agent.check_image(sandbox)
        python = "any"
        if self.agent.needs_python:
            python = await sandbox_python(sandbox, self.agent.name, self.minimum_python)
        install = await self.agent.prepare(python, self.cache_dir)
        exposure: Literal["bind", "upload"] = "bind"
        inner = await bound_install(sandbox, install, self.cache_dir)
        if inner is None:
            exposure = "upload"
            name = f"{self.agent.name}-{self.agent.version}"
            inner = await expose_install(sandbox, install, name)
        limits = self.limits
        if ctx.time_limit_s is not None and limits.timeout_s is None:
            limits = limits.model_copy(update={"timeout_s": ctx.time_limit_s})
        trial = self.gateway.open_trial(limits)
        link = None
        prepare_s = time.monotonic() - started
        try:
            link = await link_sandbox(self.gateway, trial, sandbox)
            env = self.agent.env(trial.env(link.base_url), inner)
            await sandbox.exec(f"mkdir -p {AGENT_LOGS}", timeout=60)
            command = self.agent.command(ctx.instruction, inner, sandbox.workdir)
            ran = time.monotonic()
            result = await sandbox.exec(command, env=env, timeout=ctx.time_limit_s)
            agent_s = time.monotonic() - ran
            trajectory, unread = await _read_text(sandbox, self.agent.trajectory_path)
        finally:
            record = self.gateway.close_trial(trial)
            if link is not None:
                await self.gateway.close_listener(link.listener)
        output = (result.stdout[-4000:] + "\n" + result.stderr[-4000:]).strip()
        if unread:  # said with the output: an agent that wrote none, or a read that failed
            output += f"\n[clotho: no trajectory read from {self.agent.trajectory_path}: {unread}]"
        self.runs.append(InstalledRun(record, result.exit_code, result.timed_out, output,
                                      trajectory, prepare_s, agent_s, exposure))  # fmt: skip
        stop: StopReason = "finished"
        if record.limit is not None:
            stop = _STOP[record.limit]
        elif result.timed_out:
            stop = "time_limit"
        elif record.infra_errors and result.exit_code != 0:
            stop = "model_error"
        return AgentResult(
            messages=conversation(record),
            turns=record.turns,
            stop_reason=stop,
            usage=record.usage,
            duration_s=time.monotonic() - started,
            sequences=record.sequences,
            installed=InstalledAgentTrace(
                agent=self.agent.name,
                version=self.agent.version,
                gateway=record,
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                output=output,
                trajectory=trajectory,
                exposure=exposure,
                prepare_s=prepare_s,
                agent_s=agent_s,
            ),
        )


async def _read_text(sandbox: Sandbox, path: str) -> tuple[str | None, str]:
    """The file's text, or None and why not."""
    try:
        data = await sandbox.read_file(path, max_bytes=MAX_TRAJECTORY_BYTES)
    except OSError as exc:  # FileNotFoundError, IsADirectoryError, ...
        return None, f"{type(exc).__name__}: {exc}"
    return data.decode(errors="replace"), ""


def conversation(record: GatewayRecord) -> list[dict[str, Any]]:
    """The last conversation the model saw, with its reply (OpenAI form): what the viewer and
    training read as the trial's messages."""
    for exchange in reversed(record.exchanges):
        if exchange.forwarded is not None and exchange.turn is not None:
            reply: dict[str, Any] = {"role": "assistant", "content": exchange.turn.content}
            if exchange.turn.tool_calls:
                reply["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": c.text}}
                    for c in exchange.turn.tool_calls
                ]  # fmt: skip
            return [*exchange.forwarded, reply]
    return []
