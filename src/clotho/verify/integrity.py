"""The integrity kit every verifier uses, whatever the task format: the world the tests
run in must be the one the agent did not shape.

Before the agent starts, the digests of the programs the tests will run are taken from
outside the sandbox (`ProgramDigests`). After the agent, its processes are stopped or held
(`stop_and_check`, `check_runner`) and what it changed is judged from the backend's complete
list of changes (`runner_rules.py`): a replaced or shadowed program, or a change to what the
runner relies on (loader, standard library, start-up hooks, pytest's configuration and
plugins), is a `TamperError` and the tests never run. Links the agent left that land where
the harness writes after it are refused (`check_links`), and the bytecode it left in the
runner's folders is removed (`remove_bytecode`). Commands of the harness run through
`fresh` (`Sandbox.exec_fresh`: a new process, nothing of the agent's session); one that fails
is a `VerifierError`. The task formats (`tasks/verify.py`, `swe/verify.py`) say which
programs, which folders and which tests.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from clotho.errors import TamperError, VerifierError
from clotho.sandbox.base import PathChange, Sandbox
from clotho.sandbox.config import DEFAULT_PATH
from clotho.verify import loader_rules, runner_rules

PREP_TIMEOUT_S = 120.0

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
# The programs the kit's own checks run in the sandbox (`_INSPECT`, `_LAND`, `_REMOVE*`,
# `_CHANGED_HOOKS`, reading a report): checked in every baseline, whatever a task format
# lists, or a `grep` of the agent's first on PATH would read its own `.pth` as harmless
# (an SWE instance's wrong answer scored 1.0 so).
KIT_PROGRAMS = ("sh", "bash", "env", "grep", "find", "readlink", "rm", "head", "cat", "tail")
# Where OpenSSL reads its configuration by default (Debian's OPENSSLDIR, Alpine's and
# python-build-standalone's, Fedora's, a build in /usr/local): the first the image has, as
# it was before the agent, is what every test process's libcrypto reads (`OPENSSL_CONF`,
# `pin_openssl`). A configuration loads providers and engines by path as soon as a process
# initialises libcrypto (`import hashlib`); the agent's edits stay the work's to read.
OPENSSL_DEFAULTS = (
    "/usr/lib/ssl/openssl.cnf",
    "/etc/ssl/openssl.cnf",
    "/etc/pki/tls/openssl.cnf",
    "/usr/local/ssl/openssl.cnf",
)
OPENSSL_MAX_BYTES = 1 << 20
# Words of a test script that name a file by its path (`source $HOME/.local/bin/env`, `/opt/x/run`).
_PATH_WORD = re.compile(r"(?<![:\w/.])(?:\$HOME|\$\{HOME\}|~)?/[A-Za-z0-9_.+/-]+")
_COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
_NOT_COMMANDS = {
    "if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case",
    "esac", "in", "function", "select", "time", "exec", "command", "sudo", "nohup", "!",
}  # fmt: skip

# Remove the NUL-separated files named on stdin (regular files or links, never a folder).
_REMOVE = """while IFS= read -r -d '' p; do
  if [ -L "$p" ] || [ -f "$p" ]; then rm -f -- "$p"; fi
done
true
"""
# Each path, removed whole where its folder is itself (no link on the way, which would
# make it remove something else); a path still there afterwards is printed.
_REMOVE_LEFTOVERS = """while IFS= read -r -d '' p; do
  d=$(readlink -f -- "${p%/*}" 2>/dev/null) || d=
  if [ "$d" = "${p%/*}" ]; then rm -rf -- "$p"; fi
  if [ -e "$p" ] || [ -L "$p" ]; then printf '%s\\n' "$p"; fi
done
true
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
    files: list[str] = field(default_factory=list)  # named by path in the test script
    # The PATH the harness's own commands (and a verification twin's first process) are
    # found on, when it is not the tests' (`harness_dirs`): its programs are checked too.
    harness_dirs: list[str] = field(default_factory=list)
    # The runner's own programs (`uvx`): where the tests' set-up installs them, one the agent
    # left first is removed before the tests (`setup_leftovers`).
    runner: list[str] = field(default_factory=list)
    # The tests' working directory: what the agent made there (a `venv/bin/activate` the
    # tests source) is the work they judge, never a set-up leftover.
    workdir: str | None = None
    # Host clock when taken: a start-up hook changed after it is the agent's (the sandbox
    # shares the host's clock; nobody in it can set a file's ctime back).
    taken_at: float = field(default_factory=time.time)
    # The image's OpenSSL configuration (`image_openssl_config`), empty when it has none.
    openssl_conf: bytes = b""

    def __post_init__(self) -> None:
        self.names = sorted({*self.names, *KIT_PROGRAMS})

    @property
    def paths(self) -> list[str]:
        dirs = dict.fromkeys([*self.path_dirs, *self.harness_dirs])
        programs = (f"{d}/{n}" for n in self.names for d in dirs)
        return list(dict.fromkeys([*ALWAYS_WATCHED, *self.files, *programs]))

    def changes(self, now: dict[str, str | None]) -> list[str]:
        """What differs: a program that resolved before must resolve to the same file with
        the same content (a new one earlier in PATH shadows it); a program that did not exist
        before may appear (the agent installed it). Preload files must not change at all."""
        found = [f"{p} changed" for p in ALWAYS_WATCHED if now.get(p) != self.digests.get(p)]
        # What the tests' set-up makes for itself is removed before they run: not theirs.
        tests_see = {**now, **dict.fromkeys(self.setup_leftovers())}
        found += [  # a file test.sh names that existed must stay as it was; a new one may appear
            f"{p} (named by test.sh) changed"
            for p in self.files
            if self.digests.get(p) is not None and now.get(p) != self.digests.get(p)
        ]
        for name in self.names:
            for dirs, seen in ((self.path_dirs, tests_see), (self.harness_dirs, now)):
                before = _resolve(self.digests, dirs, name)
                if before is None:
                    continue
                after = _resolve(seen, dirs, name)
                if (
                    after != before
                    and (change := _describe_change(name, before, after)) not in found
                ):
                    found.append(change)
        return found

    def setup_leftovers(self) -> list[str]:
        """What the test script sets up for itself that was not there before the agent: a
        file it sources (`source $HOME/.local/bin/env`, which an installer writes only when
        absent, so the agent's would run in the tests' shell) and a `runner` program in that
        file's folder (`uvx`, which a failed installer would leave as the agent's). The
        tests' own set-up makes them again. Nothing under the workdir: that is the work."""
        work = posixpath.join(self.workdir, "") if self.workdir else None
        files = [f for f in self.files if work is None or not f.startswith(work)]
        found = [f for f in files if self.digests.get(f) is None]
        for folder in dict.fromkeys(posixpath.dirname(f) for f in files):
            found += [
                path
                for name in sorted(set(self.runner))
                if (path := f"{folder}/{name}") in self.digests and self.digests[path] is None
            ]
        return found


def harness_dirs(sandbox: Sandbox) -> list[str]:
    """The folders of the PATH the harness's commands run with in `sandbox` (its config's,
    else the default)."""
    env = getattr(getattr(sandbox, "config", None), "env", None) or {}
    path = env.get("PATH", DEFAULT_PATH) if isinstance(env, dict) else DEFAULT_PATH
    return [d.rstrip("/") for d in str(path).split(":") if d.startswith("/")]


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


def named_paths(script: str, home: str = "/root") -> tuple[list[str], list[str]]:
    """(files, bin folders) of the runner that a test script names by path: a file it sources
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

    script = script.replace("${HOME}", "$HOME")  # its braces are no command group
    for piece in re.split(r"[;&|\n(){}`]|\$\(", script):
        try:  # quotes removed as the shell removes them: `source "$HOME/.local/bin/env"`
            words = shlex.split(piece, comments=True)
        except ValueError:
            words = piece.split()
        while words and words[0] in _NOT_COMMANDS:  # `then source ...`, `do . ...`
            words = words[1:]
        if len(words) > 1 and words[0] in ("source", ".") and (path := expand(words[1])):
            files.add(path)
        # Folders named anywhere, inside a quoted command too (`bash -c "/opt/x/bin/y"`).
        for word in {*words, *(w.strip("'\"") for w in piece.split())}:
            if (path := expand(word)) is None:
                continue
            for folder in (posixpath.dirname(path), path):
                if posixpath.basename(folder) == "bin":
                    folders.add(folder)
    return sorted(files), sorted(folders)


async def fresh_exec(sandbox: Sandbox, cmd: str, what: str, **kwargs: object) -> str:
    """A harness command in a fresh process (`exec_fresh`, `PREP_TIMEOUT_S` unless `timeout`
    says otherwise): its stdout, or a `VerifierError` saying what could not be done."""
    kwargs.setdefault("timeout", PREP_TIMEOUT_S)
    result = await sandbox.exec_fresh(cmd, **kwargs)  # type: ignore[arg-type]
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        raise VerifierError(f"cannot {what} (exit code {result.exit_code}): {detail}")
    return result.stdout


async def image_openssl_config(sandbox: Sandbox) -> bytes:
    """The first of `OPENSSL_DEFAULTS` the sandbox has (read before the agent starts), or
    nothing: OpenSSL's defaults, which load no code."""
    for path in OPENSSL_DEFAULTS:
        try:
            return await sandbox.read_file(path, max_bytes=OPENSSL_MAX_BYTES)
        except OSError:  # missing, a folder, too large: the next place
            continue
    return b""


async def pin_openssl(world: Sandbox, baseline: ProgramDigests | None, path: str) -> None:
    """Write the image's OpenSSL configuration to `path` (a harness folder's, made afresh),
    which the tests' `OPENSSL_CONF` names."""
    config = baseline.openssl_conf if baseline is not None else b""
    await fresh_exec(
        world, f"cat > {shlex.quote(path)}", "pin OpenSSL's configuration", stdin=config
    )


async def remove_setup_leftovers(sandbox: Sandbox, baseline: ProgramDigests | None) -> None:
    """Remove what the test script sets up for itself and the agent left first
    (`ProgramDigests.setup_leftovers`), before the tests: the tests' set-up makes its own.
    One that cannot be removed (a link the agent made on the way) is `TamperError`."""
    if baseline is None or not (paths := baseline.setup_leftovers()):
        return
    stdin = b"".join(p.encode(errors="surrogateescape") + b"\0" for p in paths)
    behind = await fresh_exec(sandbox, _REMOVE_LEFTOVERS, "remove the agent's set-up", stdin=stdin)
    _refuse(
        [f"{p} (the tests' set-up, the agent's) cannot be removed" for p in behind.splitlines()]
    )


async def remove_bytecode(sandbox: Sandbox, changes: list[PathChange] | None) -> None:
    """Remove the Python bytecode the agent left in the runner's folders (derived: compiled
    again from source by the tests' interpreters; `runner_rules.bytecode`)."""
    if compiled := runner_rules.bytecode(changes or []):
        stdin = b"".join(p.encode(errors="surrogateescape") + b"\0" for p in compiled)
        await fresh_exec(sandbox, _REMOVE, "remove the agent's Python bytecode", stdin=stdin)


@dataclass
class VerifyWorld:
    """Where the tests run (`sandbox`), the agent's changes they are judged by, and what to
    call just before they run (`before_tests`: continue the agent's services)."""

    sandbox: Sandbox
    changes: list[PathChange] | None
    before_tests: Callable[[], Awaitable[None]] | None = None


@asynccontextmanager
async def verification_world(
    sandbox: Sandbox, baseline: ProgramDigests | None
) -> AsyncIterator[VerifyWorld]:
    """The world every verifier runs its tests in. Where the backend can hold the agent's
    processes (`hold_agent`: a Docker container, frozen), the checks read the held sandbox
    from outside (`check_programs`) and the tests run in its `verification_twin`, a new
    container from a snapshot of exactly what was checked: nothing of the agent's (not its
    shell, not a process it traced, not pid 1) lives where the tests run; its services, if
    it left any, are continued just before the tests and reach the twin only over the
    shared network. Elsewhere the agent is stopped and the tests run in place
    (`stop_and_check`). Whatever happens, the agent's processes end with the world."""
    held = await sandbox.hold_agent()
    if held is None:
        yield VerifyWorld(sandbox, await stop_and_check(sandbox, baseline))
        return
    try:
        changes = await check_programs(sandbox, baseline)  # held: nothing runs in it
        derived = [loader_rules.CACHE] if loader_rules.cache_changed(changes) else []
        twin = await sandbox.verification_twin(empty=derived)  # `ldconfig` makes it again
        try:
            await check_changes(twin, baseline, changes)  # the twin's files are the snapshot's
            yield VerifyWorld(twin, changes, sandbox.release_agent if held else None)
        finally:
            await twin.close()
    finally:
        await sandbox.stop_agent()


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
    changes = await check_programs(sandbox, baseline)
    await check_changes(sandbox, baseline, changes)
    return changes


async def check_programs(
    sandbox: Sandbox, baseline: ProgramDigests | None
) -> list[PathChange] | None:
    """The part of `check_runner` that runs nothing in the sandbox (its digests and list of
    changes are read from outside), so a held sandbox can stay frozen: a replaced or shadowed
    program, or a change the list alone condemns, is a `TamperError`. Returns the list."""
    changes = await sandbox.changed_paths()
    if baseline is None:
        return changes
    found = baseline.changes(await sandbox.digests(baseline.paths))
    if not found and changes is not None:
        found = runner_rules.review(changes, sandbox.workdir).tampered
        found = found or await loader_rules.shadowing(sandbox, changes)
    _refuse(found)
    return changes


async def check_changes(
    world: Sandbox, baseline: ProgramDigests | None, changes: list[PathChange] | None
) -> None:
    """The rest of `check_runner`, once `check_programs` passed: what only the files' content
    decides, read by fresh processes of `world` (the sandbox itself, or its verification
    twin, whose file system is the snapshot of exactly what was checked)."""
    if baseline is None:
        return
    if changes is None:  # the programs are the baseline's: what find and grep say can be trusted
        script = _CHANGED_HOOKS.format(dirs=" ".join(_SITE_DIRS), since=int(baseline.taken_at) - 1)
        hooks = await fresh_exec(world, script, "look for changed Python start-up hooks")
        _refuse([f"{path} (a .pth with import lines) changed" for path in hooks.splitlines()])
    else:
        review = runner_rules.review(changes, world.workdir)
        _refuse(await runner_rules.inspect(world, review, _fresh_in))


def _refuse(found: list[str]) -> None:
    if found:
        raise TamperError(
            "what the tests' runner relies on was changed during the agent's run ("
            + "; ".join(found[:10])
            + "); the tests were not run"
        )


async def _fresh_in(sandbox: Sandbox, cmd: str, what: str, stdin: bytes) -> str:
    return await fresh_exec(sandbox, cmd, what, stdin=stdin)


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


def _link_candidates(changes: list[PathChange], fresh: Sequence[str]) -> bytes:
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


def _planted(output: str, roots: Sequence[str], fresh: Sequence[str]) -> list[str]:
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
    roots: Sequence[str],
    fresh: Sequence[str],
) -> None:
    """Refuse (`TamperError`) a link the agent left that lands in `roots` (where the harness
    writes after the agent: a Harbor task's /tests, /logs and /solution, a SWE instance's
    harness folder; `fresh`: those it made afresh, whose links are its own): the tests would
    compare the harness's own files with themselves (a workspace file linked to the expected
    output passes). Run after the harness made its
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
    output = await fresh_exec(sandbox, script, "resolve the agent's links", stdin=stdin)
    if planted := _planted(output, roots, fresh):
        raise TamperError(
            "links the agent left land where the harness writes after it ("
            + "; ".join(planted[:10])
            + "): the tests would read the harness's files as the agent's; the tests were not run"
        )
