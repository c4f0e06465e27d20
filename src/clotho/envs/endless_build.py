"""A generated task made real: a Harbor task directory, its workspace built in a sandbox, and
the two soundness checks (the initial state fails the tests; the reference solution passes).

The task directory is the one form a generated task takes, so what the environment trains on
is exactly what `clotho eval <dir> --agent oracle` (or any Harbor runner) checks later:

  instruction.md     the generator's instruction
  task.toml          category, difficulty, timeouts
  environment/       the workspace: the generator's files after its setup script ran
  tests/test.sh      writes 0 to /logs/verifier/reward.txt, then 1 when the generator's
                     final-state checks (inlined, so the verifier watches the programs they
                     name) exit 0 within their time limit
  solution/solve.sh  the generator's reference solution
  generator/         what the generator wrote (setup.sh, task.json), for the record

The setup script runs once per task in a sandbox from the pool, in a fresh process; whatever
it started is stopped, and the workspace it left is copied out as a tar with only regular
files, folders and links that stay inside (`check_members`, then tarfile's `data` filter),
under a size cap.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import json
import os
import posixpath
import shutil
import tarfile
import textwrap
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from clotho.agent.base import AgentContext
from clotho.agent.reference import NopAgent, OracleAgent
from clotho.agent.result import AgentResult
from clotho.envs.endless_spec import GeneratedTask, Rejected
from clotho.errors import InfraError
from clotho.rollout import RolloutOutcome
from clotho.sandbox import SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.environment import BUILD_FILES
from clotho.tasks.harbor import AgentSettings, Task, load_task
from clotho.tasks.trial import HarborTrial, run_trial

_MARGIN_S = 60.0


@dataclass(frozen=True)
class BuildSettings:
    setup_timeout_s: float
    test_timeout_s: float
    solution_timeout_s: float
    agent_timeout_s: float
    max_workspace_bytes: int
    base_image: str | None = None


def task_digest(task: GeneratedTask) -> str:
    """Identifies a task's content: equal tasks get the same folder name."""
    blob = json.dumps(task.model_dump(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def _delimiter(script: str) -> str:
    lines = set(script.splitlines())
    marker = "CLOTHO_FINAL_STATE_CHECKS"
    while marker in lines:
        marker += "_"
    return marker


def verifier_script(checks: str, timeout_s: float) -> str:
    """tests/test.sh: reward 0 unless the checks exit 0 in time. The checks are inlined (a
    quoted here-document, never expanded) so the verifier's program baseline covers every
    command they name, as for any Harbor task."""
    end = _delimiter(checks)
    body = checks if checks.endswith("\n") else checks + "\n"
    return (
        "#!/bin/bash\n"
        "# Verifier of a generated task (clotho endless): reward 1 only when the generator's\n"
        "# final-state checks exit 0 within their time limit.\n"
        "mkdir -p /logs/verifier\n"
        "echo 0 > /logs/verifier/reward.txt\n"
        f"CHECKS=$(cat <<'{end}'\n{body}{end}\n)\n"
        f'if timeout {max(1, int(timeout_s))} bash -c "$CHECKS" final-state-checks; then\n'
        "  echo 1 > /logs/verifier/reward.txt\n"
        "fi\n"
    )


def toml_string(value: str) -> str:
    """A TOML basic string. Not `json.dumps`: it writes characters beyond the BMP (an emoji)
    as surrogate pairs, `"\\ud83d\\udc0d"`, which TOML rejects. Only the quote, the backslash
    and control characters need escapes; the rest is written as it is (UTF-8)."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in ('"', "\\"):
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def write_task_dir(task: GeneratedTask, folder: Path, limits: BuildSettings) -> None:
    """Everything of the Harbor directory except environment/ (built in a sandbox)."""
    (folder / "tests").mkdir(parents=True)
    (folder / "solution").mkdir()
    (folder / "generator").mkdir()
    (folder / "instruction.md").write_text(task.instruction.strip() + "\n")
    (folder / "task.toml").write_text(
        textwrap.dedent(
            f"""\
            version = "1.0"

            [metadata]
            author_name = "clotho endless generator"
            category = {toml_string(task.category or "generated")}
            difficulty = {toml_string(task.difficulty or "medium")}
            tags = ["generated"]

            [verifier]
            timeout_sec = {limits.test_timeout_s + 30:.1f}

            [agent]
            timeout_sec = {limits.agent_timeout_s:.1f}
            """
        )
    )
    (folder / "tests" / "test.sh").write_text(verifier_script(task.tests, limits.test_timeout_s))
    solution = task.solution if task.solution.endswith("\n") else task.solution + "\n"
    if not solution.startswith("#!"):
        solution = "#!/bin/bash\n" + solution
    (folder / "solution" / "solve.sh").write_text(solution)
    (folder / "generator" / "setup.sh").write_text(task.setup)
    (folder / "generator" / "task.json").write_text(json.dumps(task.model_dump(), indent=1))


def _files_tar(task: GeneratedTask) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path, content in sorted(task.files.items()):
            data = content.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755 if content.startswith("#!") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def build_workspace(
    task: GeneratedTask,
    environment_dir: Path,
    base: SandboxConfig,
    pool: SlotPool,
    limits: BuildSettings,
) -> None:
    """Write the files into /app, run the setup script, copy /app out to `environment_dir`."""
    sandbox = await pool.acquire(base, labels={"clotho.endless": "build"})
    try:
        workdir = sandbox.workdir
        written = await sandbox.exec_fresh(
            f"mkdir -p {workdir} && tar -x --no-same-owner -C {workdir}",
            timeout=60,
            stdin=_files_tar(task),
        )
        if not written.ok:
            raise Rejected("setup_failed", f"cannot write the files: {written.stderr[-300:]!r}")
        if task.setup.strip():
            result = await sandbox.exec_fresh(
                # the script is saved first: read from stdin, it could consume itself
                'exec 2>&1; f=$(mktemp); cat > "$f"; bash "$f" < /dev/null; rc=$?; '
                'rm -f -- "$f"; exit $rc',
                timeout=limits.setup_timeout_s,
                cwd=workdir,
                stdin=task.setup.encode(),
            )
            if result.timed_out:
                raise Rejected(
                    "setup_failed", f"setup timed out after {limits.setup_timeout_s:g} s"
                )
            if not result.ok:
                tail = result.stdout[-300:]
                raise Rejected("setup_failed", f"setup exit code {result.exit_code}: {tail!r}")
        await sandbox.stop_agent()  # whatever setup started in the background
        cap = limits.max_workspace_bytes
        packed = await sandbox.exec_fresh(
            # no pipefail: past the cap head stops reading, and tar's SIGPIPE is no failure
            f"tar -c -f - -C {workdir} . | head -c {cap + 1} | base64 -w0",
            timeout=120,
            max_output_bytes=(cap + 1) * 4 // 3 + 16,
        )
        if not packed.ok:
            raise Rejected("setup_failed", f"cannot pack the workspace: {packed.stderr[-300:]!r}")
        # decoding up to 16 MiB of base64 takes the loop for tens of milliseconds: a thread
        await asyncio.to_thread(unpack_workspace, packed.stdout, cap, environment_dir)
        built = [name for name in BUILD_FILES if os.path.lexists(environment_dir / name)]
        if built:  # the generator's own Dockerfile would be built by a container backend
            raise Rejected("invalid", f"the setup left container build files: {built}")
    finally:
        await asyncio.shield(pool.release(sandbox))


def unpack_workspace(packed: str, cap: int, folder: Path) -> None:
    """The base64 tar the build sandbox printed, checked and unpacked into `folder`."""
    try:
        data = base64.b64decode(packed.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Rejected("setup_failed", f"cannot read the packed workspace: {exc}") from exc
    if len(data) > cap:
        raise Rejected("workspace_too_large", f"the workspace is over {cap} bytes")
    _unpack(data, folder)


def _inside(path: str) -> bool:
    """A normalized relative path that names the folder or something in it."""
    return not (path.startswith("/") or path == ".." or path.startswith("../"))


def check_members(members: list[tarfile.TarInfo]) -> None:
    """Every member of the workspace tar, before anything is extracted. The tar comes from a
    sandbox the setup script ran in (it may have replaced `tar` itself), so it is hostile;
    tarfile's `data` filter alone is not enough on Pythons before the 2025 fixes (links
    chained past PATH_MAX escaped it). Allowed: folders, regular files, symbolic links whose
    target (resolved by name from the link's folder) stays inside, hard links to a regular
    file met earlier. No member may sit under a link, nor replace a link; no devices or
    FIFOs; the links' real targets are checked again after unpacking (`_check_links`)."""
    kinds: dict[str, str] = {}
    for member in members:
        name = posixpath.normpath(member.name)
        what = f"the setup left {member.name[:200]!r}"
        if member.name.startswith("/") or not _inside(name):
            raise Rejected("invalid", f"{what}: a name outside the workspace")
        if member.isdir():
            kind = "dir"
        elif member.isreg():
            kind = "file"
        elif member.issym():
            kind = "link"
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname))
            if member.linkname.startswith("/") or not _inside(target):
                raise Rejected(
                    "invalid", f"{what}: a link out of the workspace ({member.linkname[:200]!r})"
                )
        elif member.islnk():
            kind = "file"
            if kinds.get(posixpath.normpath(member.linkname)) != "file":
                raise Rejected("invalid", f"{what}: a hard link to no file of the workspace")
        else:
            raise Rejected("invalid", f"{what}: a device, FIFO or other special file")
        if name == "." and kind != "dir":
            raise Rejected("invalid", f"{what}: the workspace itself is not a folder")
        parent = posixpath.dirname(name)
        while parent:
            if kinds.get(parent, "dir") != "dir":
                raise Rejected("invalid", f"{what}: under a link or a file ({parent[:200]!r})")
            parent = posixpath.dirname(parent)
        earlier = kinds.get(name)
        if earlier is not None and not (earlier == kind == "dir"):
            raise Rejected("invalid", f"{what}: twice in the workspace tar")
        kinds[name] = kind


def _check_links(folder: Path) -> None:
    """The symbolic links as unpacked, resolved for real (chains included): all inside."""
    root = folder.resolve()
    for path in folder.rglob("*"):
        if path.is_symlink() and not Path(os.path.realpath(path)).is_relative_to(root):
            relative = path.relative_to(folder)
            raise Rejected("invalid", f"the setup left {str(relative)!r}: a link out of it")


def _unpack(data: bytes, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            check_members(tar.getmembers())
            tar.extractall(folder, filter="data")  # and the filter, as a second guard
        _check_links(folder)
    except tarfile.FilterError as exc:  # what check_members missed, the filter refused
        raise Rejected("invalid", f"the setup left {exc}") from exc
    except (tarfile.TarError, OSError) as exc:
        raise Rejected("setup_failed", f"the workspace cannot be unpacked: {exc}") from exc


class ReferenceSolution:
    """The oracle, leaving no trace of itself: solve.sh runs from a random folder that is
    removed afterwards, so checks that look for /solution (which no agent has) cannot pass
    for the reference solution alone."""

    name = "reference"

    async def run(self, ctx: AgentContext) -> AgentResult:
        mount = f"/tmp/.reference-{uuid.uuid4().hex}"
        try:
            return await OracleAgent().run(replace(ctx, solution_mount=mount))
        finally:
            await ctx.sandbox.exec(f"rm -rf -- {mount}", timeout=30)


@dataclass
class Soundness:
    """The two checks of one candidate task."""

    initial: RolloutOutcome
    solved: RolloutOutcome

    def problem(self) -> Rejected | None:
        """Why the task is not sound, if it is not. An infrastructure failure (the backend,
        not the task, broke) is raised as one: the candidate was never judged."""
        for outcome, what in ((self.initial, "initial state"), (self.solved, "solution")):
            if outcome.error is not None and outcome.error.kind == "infra":
                raise InfraError(f"checking a generated task ({what}): {outcome.error.message}")
            if outcome.error is not None:
                return Rejected(
                    "check_error", f"{what}: {outcome.error.kind}: {outcome.error.message[:300]}"
                )
        if self.initial.passed:
            return Rejected("passes_initially", "the tests already pass on the initial state")
        if not self.solved.passed:
            output = self.solved.verifier.output[-300:] if self.solved.verifier else ""
            return Rejected("solution_fails", f"the reference solution fails the tests: {output!r}")
        return None


async def check_soundness(
    task: Task, base: SandboxConfig, pool: SlotPool, limits: BuildSettings
) -> Soundness:
    """The task's own trial path, twice, each in its own sandbox from the pool: doing nothing
    must fail the tests, the reference solution must pass them."""
    # The reference solution gets solution_timeout_s (task.toml's agent limit is the agents').
    agent = AgentSettings(timeout_sec=limits.solution_timeout_s)
    trial = HarborTrial(replace(task, config=task.config.model_copy(update={"agent": agent})))
    timeout = limits.solution_timeout_s + limits.test_timeout_s + _MARGIN_S
    initial, solved = await asyncio.gather(
        run_trial(trial, NopAgent(), base, pool, timeout_s=timeout),
        run_trial(trial, ReferenceSolution(), base, pool, timeout_s=timeout),
    )
    return Soundness(initial=initial, solved=solved)


async def materialize(
    task: GeneratedTask,
    staging: Path,
    base: SandboxConfig,
    pool: SlotPool,
    limits: BuildSettings,
) -> Task:
    """The Harbor directory of `task` at `staging`, its workspace built, loaded back."""
    await asyncio.to_thread(write_task_dir, task, staging, limits)
    await build_workspace(task, staging / "environment", base, pool, limits)
    if limits.base_image:
        await asyncio.to_thread(write_dockerfile, staging / "environment", limits.base_image)
    return await asyncio.to_thread(load_task, staging)


def write_dockerfile(environment_dir: Path, image: str) -> None:
    """For Docker-based Harbor runners: the base image with the workspace copied to /app
    (clotho's own container backends build it too; the local backend only uploads)."""
    (environment_dir / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\nCOPY . /app/\n")
    (environment_dir / ".dockerignore").write_text("Dockerfile\n.dockerignore\n")


def discard(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
