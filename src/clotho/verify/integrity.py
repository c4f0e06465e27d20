"""Run a task's tests after the agent is done, in a world the agent did not shape.

Before the agent starts, the digests of the programs the tests will run (the shells and
interpreters, and every command `test.sh` names, in every PATH directory) are taken from
outside the sandbox. After the agent, its processes are held (frozen) and what it changed
is judged from the backend's complete list of changes (`runner_rules.py`): a replaced or
shadowed program, or a change to what the runner relies on (loader, standard library,
start-up hooks, pytest's configuration and plugins), is a `TamperError` and the tests never
run. When the agent left processes (services a task asked for), the tests run in a twin of
the sandbox that shares only its network (`Sandbox.verification_twin`) and the agent's
processes serve them; otherwise they are ended and the tests run in place. Either way the
reward folder and `/tests` are made afresh (a link the agent planted is removed, never
followed), links landing there are refused, the tests run in a fresh process with a clean,
pinned environment in the workdir, whatever they started is stopped, and the reward is read only
from a regular file, with a size cap. A reward that is missing, unreadable or outside the
task's range is a `VerifierError`, never 0.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import posixpath
import re
import shlex
import tarfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from clotho.errors import TamperError, VerifierError
from clotho.rollout.outcome import VerifierOutcome
from clotho.sandbox.base import PathChange, Sandbox
from clotho.sandbox.config import DEFAULT_PATH
from clotho.verify import runner_rules
from clotho.tasks.harbor import Task

TESTS_MOUNT = "/tests"
LOGS_DIR = "/logs/verifier"
REWARD_MAX_BYTES = 64 << 10
_OUTPUT_TAIL = 8000
_PREP_TIMEOUT_S = 120.0

# What a test script runs besides the commands it names: shells, interpreters, runners.
BASE_PROGRAMS = (
    "bash", "sh", "env", "python3", "python", "pytest", "node", "perl", "uv", "uvx",
    "timeout", "cat", "head", "grep", "sed", "awk", "jq", "diff", "cmp", "test", "mkdir",
    "rm", "tar", "find", "echo", "printf", "sort", "wc", "tr", "git", "sqlite3",
    "chmod", "stat",  # the verifier's own folder preparation and reward inspection run them
    "readlink",  # the check of where the agent's links land (`check_links`)
    "ldconfig",  # rebuilds the loader's cache before the tests
    "pip", "pip3", "curl", "apt-get", "apt", "dpkg",  # what test scripts install with
    *(f"python3.{m}" for m in range(8, 15)),  # `uvx -p 3.13` finds its interpreter on PATH
)  # fmt: skip
# Python's start-up hooks: code in them runs inside every test interpreter.
_SITE_DIRS = (
    "/usr/lib/python3/dist-packages",
    *(f"/usr/lib/python3.{m}" for m in range(8, 15)),
    *(f"/usr/local/lib/python3.{m}/{k}" for m in range(8, 15) for k in ("dist-packages", "site-packages")),
)  # fmt: skip
# Files that change what every program does (any change at all is tampering).
ALWAYS_WATCHED = (
    "/etc/ld.so.preload",
    *(f"{d}/{hook}" for d in _SITE_DIRS for hook in ("sitecustomize.py", "usercustomize.py")),
)
# The verifier's own environment: no user site-packages the agent could have filled, and
# installers' caches of the harness's (a wheel or environment the agent left in ~/.cache is
# never what the tests' `pip install` or `uvx` run).
VERIFIER_ENV = {
    "PYTHONNOUSERSITE": "1",
    "PIP_NO_CACHE_DIR": "1",
    "UV_CACHE_DIR": "/logs/.uv-cache",
}
# Words of test.sh that name a file by its path (`source $HOME/.local/bin/env`, `/opt/x/run`).
_PATH_WORD = re.compile(r"(?<![:\w/.])(?:\$HOME|\$\{HOME\}|~)?/[A-Za-z0-9_.+/-]+")
_COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_NOT_COMMANDS = {
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
    "esac", "in", "function", "select", "time", "exec", "command", "sudo", "nohup", "!",
}  # fmt: skip

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
# The loader's cache is derived: rebuilt from its (checked) configuration, never the agent's.
if command -v ldconfig >/dev/null 2>&1; then ldconfig 2>/dev/null || true; fi
"""
# Remove the NUL-separated files named on stdin (regular files or links, never a folder).
_REMOVE = """while IFS= read -r -d '' p; do
  if [ -L "$p" ] || [ -f "$p" ]; then rm -f -- "$p"; fi
done
true
"""
# Which reward file is there, and what it is: nothing is read yet.
_INSPECT = f"""for name in reward.json reward.txt; do
  f={LOGS_DIR}/$name
  if [ -L "$f" ]; then echo "$name link"
  elif [ ! -e "$f" ]; then echo "$name missing"
  elif [ ! -f "$f" ]; then echo "$name special"
  else echo "$name $(stat -c %s -- "$f")"; fi
done
"""


# `.pth` files in the site folders whose `import` lines Python runs at every interpreter's
# start, changed (ctime) since the baseline: listed, never run (grep skips FIFOs/devices).
# A find without -newerct (busybox) lists nothing: the check is best effort there.
_CHANGED_HOOKS = """for d in {dirs}; do
  [ -d "$d" ] || continue
  find "$d" -maxdepth 1 -name '*.pth' -newerct @{since} 2>/dev/null \\
    | while IFS= read -r f; do
      grep -D skip -d skip -qE '^import[[:space:]]' -- "$f" && echo "$f"
    done
done
true
"""


@dataclass
class ProgramDigests:
    """The verifier's programs as they were before the agent started."""

    path_dirs: list[str]
    names: list[str]
    digests: dict[str, str | None]
    files: list[str] = field(default_factory=list)  # named by path in test.sh
    # Host clock when taken: a start-up hook changed after it is the agent's (the sandbox
    # shares the host's clock; nobody in it can set a file's ctime back).
    taken_at: float = field(default_factory=time.time)

    @property
    def paths(self) -> list[str]:
        programs = (f"{d}/{n}" for n in self.names for d in self.path_dirs)
        return list(dict.fromkeys([*ALWAYS_WATCHED, *self.files, *programs]))

    def changes(self, now: dict[str, str | None]) -> list[str]:
        """What differs: a program that resolved before must resolve to the same file with
        the same content (a new one earlier in PATH shadows it); a program that did not exist
        before may appear (the agent installed it). Preload files must not change at all."""
        found = [f"{p} changed" for p in ALWAYS_WATCHED if now.get(p) != self.digests.get(p)]
        found += [  # a file test.sh names that existed must stay as it was; a new one may appear
            f"{p} (named by test.sh) changed"
            for p in self.files
            if self.digests.get(p) is not None and now.get(p) != self.digests.get(p)
        ]
        for name in self.names:
            before = _resolve(self.digests, self.path_dirs, name)
            if before is None:
                continue
            after = _resolve(now, self.path_dirs, name)
            if after != before:
                found.append(_describe_change(name, before, after))
        return found


def _resolve(digests: dict[str, str | None], dirs: list[str], name: str) -> tuple[str, str] | None:
    for folder in dirs:
        digest = digests.get(f"{folder}/{name}")
        if digest is not None:
            return f"{folder}/{name}", digest
    return None


def _describe_change(name: str, before: tuple[str, str], after: tuple[str, str] | None) -> str:
    if after is None:
        return f"{name}: {before[0]} was removed"
    if after[0] != before[0]:
        return f"{name}: {after[0]} now shadows {before[0]}"
    return f"{name}: {before[0]} was replaced"


def named_commands(script: str) -> set[str]:
    """The command names a shell script runs (first words of its simple commands)."""
    names: set[str] = set()
    for piece in re.split(r"[;&|\n(){}`]|\$\(", script):
        try:
            words = shlex.split(piece, comments=True)
        except ValueError:
            words = piece.split()
        words = [w for w in words if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", w)]
        while words and words[0] in _NOT_COMMANDS:
            words = words[1:]
        if words and _COMMAND_NAME.fullmatch(words[0]):
            names.add(words[0])
    return names


def _verifier_path(task: Task) -> list[str]:
    path = task.config.verifier.env.get("PATH", DEFAULT_PATH)
    return [d.rstrip("/") for d in path.split(":") if d.startswith("/")]


def named_paths(script: str, home: str = "/root") -> tuple[list[str], list[str]]:
    """(files, bin folders) of the runner that test.sh names by path: a file it sources
    (`source $HOME/.local/bin/env`: code the tests' shell runs, which may put its folder on
    PATH) and each `bin` folder it names, searched for the runner's programs. What it runs
    by path otherwise (`/app/run.sh`) may be the agent's work the tests judge."""
    files: set[str] = set()
    folders: set[str] = set()

    def expand(word: str) -> str | None:
        if not _PATH_WORD.fullmatch(word):
            return None
        path = posixpath.normpath(re.sub(r"^(?:\$HOME|\$\{HOME\}|~)", home, word))
        return path if path.startswith("/") and not path.startswith("//") else None

    for piece in re.split(r"[;&|\n(){}`]|\$\(", script):
        words = piece.split()
        if len(words) > 1 and words[0] in ("source", ".") and (path := expand(words[1])):
            files.add(path)
        for word in words:
            if (path := expand(word)) is None:
                continue
            for folder in (posixpath.dirname(path), path):
                if posixpath.basename(folder) == "bin":
                    folders.add(folder)
    return sorted(files), sorted(folders)


async def program_digests(task: Task, sandbox: Sandbox) -> ProgramDigests:
    """Taken before the agent starts, from outside the sandbox."""
    script = task.tests_dir / "test.sh"
    text = await asyncio.to_thread(script.read_text, errors="replace") if script.is_file() else ""
    names = sorted(set(BASE_PROGRAMS) | named_commands(text))
    files, folders = named_paths(text)
    dirs = _verifier_path(task)
    dirs = [*folders, *(d for d in dirs if d not in folders)]  # sourced: ahead on PATH
    baseline = ProgramDigests(path_dirs=dirs, names=names, digests={}, files=files)
    baseline.digests = await sandbox.digests(baseline.paths)
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


async def _fresh(sandbox: Sandbox, cmd: str, what: str, **kwargs: object) -> str:
    result = await sandbox.exec_fresh(cmd, timeout=_PREP_TIMEOUT_S, **kwargs)  # type: ignore[arg-type]
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise VerifierError(f"cannot {what} (exit code {result.exit_code}): {detail}")
    return result.stdout


async def _read_reward(sandbox: Sandbox, test_exit: int, output: str) -> tuple[float, dict]:
    """The one reward of the verification. Both files may be written (Harbor reads
    reward.json first); when both are, they must agree: a program the tests ran (the agent's
    own, judged by them) could have written one of them, and two verdicts that differ are
    not the tests' verdict (`TamperError`), whichever file the forger chose."""
    kinds = dict(
        line.split(" ", 1)
        for line in (await _fresh(sandbox, _INSPECT, "inspect the reward folder")).splitlines()
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
        text = await _fresh(
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


async def stop_and_check(
    sandbox: Sandbox, baseline: ProgramDigests | None
) -> list[PathChange] | None:
    """The first step of every verification in place: stop what the agent left running, then
    refuse to go on (`TamperError`) if what the tests' runner relies on was changed
    (`check_runner`). Returns the backend's list of changes."""
    await sandbox.stop_agent()
    return await check_runner(sandbox, baseline)


async def check_runner(
    sandbox: Sandbox, baseline: ProgramDigests | None
) -> list[PathChange] | None:
    """With the agent's processes stopped or held: the programs the tests run must be the
    baseline's, and nothing the runner relies on may have changed (`runner_rules`), judged on
    the backend's list of changes (or, where it has none, a search of the site folders for
    `.pth` files with code). Returns that list for the other checks."""
    changes = await sandbox.changed_paths()
    if baseline is None:
        return changes
    found = baseline.changes(await sandbox.digests(baseline.paths))
    if not found:  # the programs are the baseline's: what find and grep say can be trusted
        if changes is None:
            script = _CHANGED_HOOKS.format(
                dirs=" ".join(_SITE_DIRS), since=int(baseline.taken_at) - 1
            )
            hooks = await _fresh(sandbox, script, "look for changed Python start-up hooks")
            found = [f"{path} (a .pth with import lines) changed" for path in hooks.splitlines()]
        else:
            review = runner_rules.review(changes, sandbox.workdir)
            found = review.tampered or await runner_rules.inspect(sandbox, review, _fresh_in)
    if found:
        raise TamperError(
            "what the tests' runner relies on was changed during the agent's run ("
            + "; ".join(found[:10])
            + "); the tests were not run"
        )
    return changes


async def _fresh_in(sandbox: Sandbox, cmd: str, what: str, stdin: bytes) -> str:
    return await _fresh(sandbox, cmd, what, stdin=stdin)


# Where the harness writes after the agent: a link of the agent's landing there makes the tests
# read the harness's own files (their expected output, the reward) as the agent's work.
HARNESS_ROOTS = (TESTS_MOUNT, "/logs", "/solution")
# Made afresh by `_PREPARE` before the check: what is in them now is the harness's.
_FRESH_ROOTS = (TESTS_MOUNT, "/logs")
# Where each candidate link lands, resolved in the sandbox (after /tests exists, so a link
# to a test file resolves): `readlink -f`, else `readlink -m` (a missing folder on the way),
# else the link's own text. Input: NUL-separated, "L<path>" a path to test, "D<path>" a
# folder to search whole. Output, NUL-separated pairs (link, landing), only for landings that
# name a harness folder at all (Python decides): the output stays small however many links.
_LAND = r"""land() {
  t=$(readlink -f -- "$1" 2>/dev/null) || t=$(readlink -m -- "$1" 2>/dev/null) || t=
  if [ -z "$t" ]; then
    t=$(readlink -- "$1" 2>/dev/null) || t=
    case $t in /*) ;; *) t=${1%/*}/$t ;; esac
  fi
  case $t in @LANDINGS@) printf '%s\0%s\0' "$1" "$t" ;; esac
}
"""
_LANDINGS = (
    _LAND
    + r"""while IFS= read -r -d '' item; do
  p=${item#?}
  case $item in
    L*) if [ -L "$p" ]; then land "$p"; fi ;;
    D*) if [ -d "$p" ] && [ ! -L "$p" ]; then
          find "$p" -type l -print0 2>/dev/null | while IFS= read -r -d '' l; do land "$l"; done
        fi ;;
  esac
done
true
"""
)
# The backend cannot list what changed (None): every link under the places a task's tests
# read and an agent writes (the workdir, the home and temporary folders, /etc, /opt, /srv,
# /mnt, /run, /usr/local, /var/spool) is resolved, only those whose ctime is after the
# baseline where find has -newerct (nobody in the sandbox can set a ctime back). Not the whole
# file system: on a backend without isolation that is the host's, minutes to walk.
FALLBACK_ROOTS = (
    "/tmp", "/var/tmp", "/root", "/home", "/etc", "/opt", "/srv", "/mnt", "/run",
    "/usr/local", "/var/spool", "/solution",
)  # fmt: skip
_FALLBACK_FIND = (
    _LAND.replace("{", "{{").replace("}", "}}")
    + r"""set --
for d in {roots}; do if [ -d "$d" ]; then set -- "$@" "$d"; fi; done
[ $# -gt 0 ] || exit 0
{{ find "$@" -type l {newer} -print0 2>/dev/null || find "$@" -type l -print0 2>/dev/null; }} \
  | while IFS= read -r -d '' l; do land "$l"; done
true
"""
)


def _under(path: str, roots: Sequence[str]) -> str | None:
    for root in roots:
        if path == root or path.startswith(root + "/"):
            return root
    return None


def _link_candidates(changes: list[PathChange], fresh: Sequence[str] = _FRESH_ROOTS) -> bytes:
    """What to resolve: each changed path that is (or may be) a link, and each folder added
    whole (the top-most ones) to search for links under it, unless the backend already
    listed its entries with their types. The fresh folders hold only the harness's files."""
    present = [c for c in changes if c.kind != "removed" and not _under(c.path, fresh)]
    items: list[str] = [f"L{c.path}" for c in present if c.link is not False]
    searched: list[str] = []
    for change in sorted(present, key=lambda c: c.path):
        if change.kind == "added" and change.link is None and not _under(change.path, searched):
            searched.append(change.path)
            items.append(f"D{change.path}")
    return b"".join(item.encode(errors="surrogateescape") + b"\0" for item in items)


def _planted(
    output: str, roots: Sequence[str] = HARNESS_ROOTS, fresh: Sequence[str] = _FRESH_ROOTS
) -> list[str]:
    """The links (of the landing script's output) that land where the harness writes."""
    fields = output.split("\0")
    found: list[str] = []
    for link, resolved in zip(fields[0::2], fields[1::2], strict=False):
        if _under(link, fresh):
            continue
        landing = posixpath.normpath(resolved)
        root = _under(landing, roots)
        if root is None or (root == "/solution" and _under(link, ("/solution",))):
            continue  # a link inside the oracle's /solution to its own files is its own
        found.append(f"{link} -> {landing}")
    return found


async def check_links(
    sandbox: Sandbox,
    baseline: ProgramDigests | None,
    changes: list[PathChange] | None,
    roots: Sequence[str] = HARNESS_ROOTS,
    fresh: Sequence[str] = _FRESH_ROOTS,
) -> None:
    """Refuse (`TamperError`) a link the agent left that lands in /tests, /logs or /solution
    (`roots`: where the harness writes after the agent; `fresh`: those it made afresh, whose
    links are its own): the tests would compare the harness's own files with themselves (a
    workspace file linked to the expected output passes). Run after the harness made its
    folders (the targets exist), before the tests. Judged on the backend's list of changed
    paths; when it cannot tell (None), on a `find` of every link in the sandbox (see
    `_FALLBACK_FIND`). `sandbox` may be the twin of the one whose `changes` these are: its
    file system is their snapshot."""
    pattern = "|".join(f"*{shlex.quote(root)}*" for root in roots)
    if changes is None:
        newer = f"-newerct @{int(baseline.taken_at) - 1}" if baseline is not None else ""
        places = " ".join(shlex.quote(r) for r in (sandbox.workdir, *FALLBACK_ROOTS))
        script, stdin = _FALLBACK_FIND.format(roots=places, newer=newer), None
    else:
        stdin = _link_candidates(changes, fresh)
        if not stdin:
            return  # no link among the changes (the backend saw every type): nothing to run
        script = _LANDINGS
    script = script.replace("@LANDINGS@", pattern)
    output = await _fresh(sandbox, script, "resolve the agent's links", stdin=stdin)
    if planted := _planted(output, roots, fresh):
        raise TamperError(
            "links the agent left land where the harness writes after it ("
            + "; ".join(planted[:10])
            + "): the tests would read the harness's files as the agent's; the tests were not run"
        )


async def run_verifier(
    task: Task,
    sandbox: Sandbox,
    baseline: ProgramDigests | None = None,
    timeout_s: float | None = None,
) -> VerifierOutcome:
    """The task's verdict on what the agent left in `sandbox` (see the module docstring)."""
    timeout_s = timeout_s or task.config.verifier.timeout_sec
    if await sandbox.hold_agent():  # the agent left processes: they keep serving
        changes = await check_runner(sandbox, baseline)
        twin = await sandbox.verification_twin()
        try:
            return await _judge(task, twin, baseline, changes, timeout_s, sandbox.release_agent)
        finally:
            try:
                await twin.close()
            finally:
                await sandbox.stop_agent()
    changes = await stop_and_check(sandbox, baseline)
    return await _judge(task, sandbox, baseline, changes, timeout_s)


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
    if compiled := runner_rules.bytecode(changes or []):  # derived: compiled again
        stdin = b"".join(p.encode(errors="surrogateescape") + b"\0" for p in compiled)
        await _fresh(world, _REMOVE, "remove the agent's Python bytecode", stdin=stdin)
    await _fresh(world, _PREPARE, "prepare /tests and the reward folder", stdin=tests)
    await check_links(world, baseline, changes)
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
