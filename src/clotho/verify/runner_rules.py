"""What the tests' runner relies on, judged from the backend's complete list of changes.

The verifier runs the task's `test.sh` in the sandbox the agent shaped. What the tests are
meant to judge (the workspace, what the agent built or installed for the task) must stay
visible to them; what runs them must be the image's. The runner's start-up surface is small
and fixed by the programs themselves, not by the agent's spelling of a file:

- the dynamic loader: its preload file, its configuration and, for musl, its path file
  (the cache is derived and rebuilt by `ldconfig` before the tests where there is one);
  shared libraries of the system library folders the image had (and, `loader_rules.py`,
  none of the agent's named like them);
- each Python interpreter's standard library (`lib/python3.N/` outside its site folders),
  its `python3N.zip`, the start-up hooks every interpreter imports (`sitecustomize`,
  `usercustomize`, anywhere) and `/etc/python3*`; the bytecode the agent left in those
  folders is removed before the tests (`bytecode`: derived, compiled again from source);
- pytest's configuration above /tests (`/` is the only folder above it: its ini files and
  `conftest.py`), plugins installed where pytest loads them by entry point, and the test
  runner's own packages (pytest, pluggy and what they import) in any site folder: each file
  of theirs the agent added or changed must be an installer's (listed in a `RECORD` with
  its sha256), so a hand-made `pytest.py` shadowing the image's, or an edited `_pytest`,
  is tampering while an ordinary `pip install pytest` is not; in the tests' working
  directory (the workspace, first on `sys.path` for `python3 -m pytest`) a module named
  like them is tampering too.

- where the installers a test script runs fetch from: pip's and uv's configuration, curl's
  and wget's, apt's (a package's own new apt configuration is dpkg's).
- the modules the C library, OpenSSL, PAM and p11-kit load because a configuration names
  them, and those configurations (`module_rules.py`).

A virtual environment the agent made is the agent's work, judged like its programs when the
tests run it; the image's interpreters are the runner. Only the site folders of a new folder
holding a new `pyvenv.cfg`, away from where image interpreters look (`_venv_sites`), are
exempt: a `pyvenv.cfg` written at `/`, in /etc or above a site folder exempts nothing.

A change there is `tamper`. Three kinds of file are judged on their content: a `.pth` in a
site folder with a code line (which `site` runs in every interpreter), an `entry_points.txt`
declaring `pytest11` plugins (loaded into every pytest) and a file of the runner's own
packages are the agent's tampering unless a package installer put them there (a
distribution's `RECORD` in that folder lists them with the same sha256: `pip install` of
setuptools, eigenpy, pytest-json-ctrf or pytest itself writes such files). A file the image's package manager owns
(dpkg's lists) may be added to a standard library folder or the loader's configuration: an
`apt-get install python3-venv` is the task's business, not tampering.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from clotho.sandbox.base import PathChange, Sandbox
from clotho.verify import module_rules
from clotho.verify.loader_rules import LOADER_DIRS

_PY_LIB = re.compile(r"^(?P<lib>/(?:.*/)?lib(?:64)?/python3(?:\.\d+)?)(?:/(?P<rest>.*))?$")
_PY_ZIP = re.compile(r"^/(?:.*/)?lib(?:64)?/python3\d+\.zip$")
_SITE = re.compile(r"^(?:site|dist)-packages(?:/|$)")
_SYSTEM_LIBS = re.compile(r"^/(?:usr/)?lib(?:64|32|x32)?/")
_SHARED_OBJECT = re.compile(r"\.so(?:\.|$)")
# The test runner's own packages (top-level names in a site folder).
RUNNER_PACKAGES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig", "pip"})
# What the installers test scripts run read (`pip install pytest`, `uvx`, `apt-get install`,
# `curl ... | sh`): where they fetch from is the runner's.
_INSTALLER_CONFIG = re.compile(
    r"^(?:/etc/(?:pip\.conf|xdg/pip/pip\.conf|uv/uv\.toml|wgetrc|curlrc|apt/.+)"
    r"|/usr(?:/local)?/pip\.conf"  # pip's configuration for its interpreter's prefix
    r"|/root/(?:\.config/(?:pip/pip\.conf|uv/uv\.toml)|\.pip/pip\.conf|\.curlrc|\.wgetrc"
    r"|\.pydistutils\.cfg|\.netrc))$"
)
_HOOKS = re.compile(r"^(?:sitecustomize|usercustomize)(?:\.py[cw]?|\..*\.so|\.so)?$")
# pytest's ini files and conftest.py in the only folder above /tests.
ROOT_RUNNER_FILES = frozenset(
    f"/{name}"
    for name in (
        "pytest.ini",
        ".pytest.ini",
        "pyproject.toml",
        "tox.ini",
        "setup.cfg",
        "conftest.py",
    )
)
_DIGEST = re.compile(r"(?:sha256:)?([0-9a-f]{64})(?::[0-7]+)?")
_LOADER = re.compile(r"^/etc/(?:ld\.so\.preload|ld\.so\.conf(?:\.d(?:/.*)?)?|ld-musl-[^/]+\.path)$")


@dataclass
class RunnerReview:
    """The verdict on the changes: `tampered` says why, `inspect` holds what only the files'
    content (or dpkg) can decide, as (kind, path): `pth`, `entry_points`, `dpkg`."""

    tampered: list[str] = field(default_factory=list)
    inspect: list[tuple[str, str]] = field(default_factory=list)


def _module(name: str) -> bool:
    """Whether a folder entry named `name` is importable as one of the runner's packages
    (`pytest`, `pytest.py`, `pytest.pyc`, `_pytest.cpython-311-x86_64-linux-gnu.so`...)."""
    stem = re.sub(r"(?:\.py[cw]?|(?:\.[^.]+)?\.so)$", "", name)
    return stem in RUNNER_PACKAGES and "." not in stem


def _parents(changes: list[PathChange]) -> set[str]:
    """Folders listed because something under them changed (overlay copies them up)."""
    found: set[str] = set()
    for change in changes:
        parent = posixpath.dirname(change.path)
        while parent not in found and parent != "/":
            found.add(parent)
            parent = posixpath.dirname(parent)
    return found


# Folders whose files the rules judge by their paths: one replaced by a link (to a copy the
# agent edited elsewhere) hides every file in it from the list of changes.
_JUDGED_FOLDERS = frozenset(
    {
        "/etc", "/usr", "/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local",
        "/usr/local/bin", "/usr/local/sbin", "/etc/ld.so.conf.d", "/etc/apt", "/etc/pip",
        *LOADER_DIRS, *module_rules.FOLDERS,
    }
)  # fmt: skip


def _judged_folder(path: str) -> bool:
    if path in _JUDGED_FOLDERS:
        return True
    match = _PY_LIB.match(path)
    rest = (match.group("rest") or "") if match else None
    return rest is not None and (rest == "" or _SITE.fullmatch(rest) is not None)


def review(changes: list[PathChange], workdir: str = "/app") -> RunnerReview:
    """Classify every change (see the module docstring); nothing is read yet. `workdir` is
    the tests' working directory, first on `sys.path` for `python3 -m pytest`."""
    result = RunnerReview()
    folders = _parents(changes)
    workdir = posixpath.normpath(workdir)
    venv_sites = _venv_sites(changes)
    for change in changes:
        path, kind = change.path, change.kind
        if kind == "changed" and path in folders:
            continue  # a folder copied up for what changed inside it: judged by those
        if venv_sites is not None and venv_sites.match(path):
            continue  # a virtualenv's own packages: its interpreter is the agent's program
        base = posixpath.basename(path)
        if change.link and kind == "changed" and _judged_folder(path):
            result.tampered.append(f"{path} (a folder whose files the runner relies on) {kind}")
        elif posixpath.dirname(path) == workdir and kind != "removed" and _module(base):
            result.tampered.append(
                f"{path} (named like the test runner, in the tests' working directory) {kind}"
            )
        elif path in ROOT_RUNNER_FILES and kind != "removed":
            result.tampered.append(f"{path} (pytest's configuration above /tests) {kind}")
        elif (verdict := module_rules.classify(path, kind, workdir, change.link)) is not None:
            if isinstance(verdict, str):
                result.tampered.append(verdict)
            else:
                result.inspect.append(verdict)
        elif _LOADER.match(path):
            if kind == "added" and not path.endswith(("preload", ".path")):
                result.inspect.append(("dpkg", path))
            else:
                result.tampered.append(f"{path} (the dynamic loader's configuration) {kind}")
        elif _INSTALLER_CONFIG.match(path):
            if kind == "added" and path.startswith("/etc/apt/"):
                result.inspect.append(("dpkg", path))  # a package's own apt configuration
            elif kind != "removed":
                result.tampered.append(f"{path} (where the tests' installers fetch from) {kind}")
        elif path.startswith("/etc/python3"):
            result.tampered.append(f"{path} (Python's start-up configuration) {kind}")
        elif _HOOKS.match(base) and kind != "removed":
            result.tampered.append(f"{path} (a Python start-up hook) {kind}")
        elif _PY_ZIP.match(path) and kind != "removed":
            result.tampered.append(f"{path} (ahead of Python's standard library) {kind}")
        elif match := _PY_LIB.match(path):
            _review_python(match.group("rest") or "", path, kind, result)
        elif _SYSTEM_LIBS.match(path) and _SHARED_OBJECT.search(base) and kind != "added":
            result.tampered.append(f"{path} (a system library) {kind}")
    return result


def _venv_sites(changes: list[PathChange]) -> re.Pattern[str] | None:
    """The site folders of the virtual environments the agent made, or None. A `pyvenv.cfg`
    alone proves nothing (Python reads one only beside its interpreter, and anyone can write
    one): its folder must itself be new, so it holds nothing of the image's, and lie where
    no image interpreter looks for modules (not under /usr or /etc, not a user base
    `.local`, not an interpreter's library folder). Only `lib/python3.N/site-packages`
    inside it is the agent's; everything else there is judged as anywhere."""
    added = {c.path for c in changes if c.kind == "added"}
    roots = []
    for change in changes:
        if change.kind != "added" or posixpath.basename(change.path) != "pyvenv.cfg":
            continue
        root = posixpath.dirname(change.path)
        if (
            root in added
            and not root.startswith(("/usr/", "/etc/"))
            and ".local" not in root.split("/")
            and not _PY_LIB.match(root)
        ):
            roots.append(re.escape(root))
    if not roots:
        return None
    return re.compile(
        rf"^(?:{'|'.join(roots)})/lib(?:64)?/python3(?:\.\d+)?/(?:site|dist)-packages(?:/|$)"
    )


def bytecode(changes: list[PathChange]) -> list[str]:
    """The compiled files the agent left in a Python installation's folders: derived data,
    removed before the tests (Python compiles their sources again), never trusted: a `.pyc`
    whose header matches an untouched source would otherwise run instead of it."""
    return [
        c.path
        for c in changes
        if c.kind != "removed" and c.path.endswith(".pyc") and _PY_LIB.match(c.path)
    ]


def _review_python(rest: str, path: str, kind: str, result: RunnerReview) -> None:
    if "__pycache__" in rest.split("/"):
        return  # removed before the tests (`bytecode`): Python compiles their sources again
    if _SITE.match(rest):
        inside = rest.split("/", 1)[1] if "/" in rest else ""
        if not inside:
            return
        if kind == "removed":
            if inside.split("/", 1)[0].removesuffix(".py") in RUNNER_PACKAGES:
                result.tampered.append(f"{path} (the test runner's own package) removed")
            return
        top = inside.split("/", 1)[0]
        if _module(top):
            result.inspect.append(("runner", path))
        elif "/" not in inside and inside.endswith(".pth"):
            result.inspect.append(("pth", path))
        elif re.fullmatch(r"[^/]+\.(?:dist|egg)-info/entry_points\.txt", inside):
            result.inspect.append(("entry_points", path))
        return
    if not rest:
        return
    if kind != "added":
        result.tampered.append(f"{path} (Python's standard library) {kind}")
    elif "/" not in rest or rest.startswith("lib-dynload/"):
        result.inspect.append(("dpkg", path))  # a new top-level module: dpkg's, or tampering


# Reads NUL-separated "<kind>\t<path>" items; prints NUL-separated records, nothing run that
# the agent wrote: "code\t<pth>" for a .pth with a line `site` executes, "rec\t<pth>\t<line>"
# for each RECORD line naming it (also for pytest11 entry points and the runner's own files),
# "owned\t<path>" for dpkg's.
_INSPECT = r"""records() {  # the RECORD lines of the site folder naming $1's relative path
  site=$1; rel=$2
  for r in "$site"/*.dist-info/RECORD; do
    [ -f "$r" ] || continue
    grep -D skip -F -- "$rel," "$r" | while IFS= read -r line; do
      printf 'rec\t%s/%s\t%s\0' "$site" "$rel" "$line"
    done
  done
}
site_of() {  # the site folder a path is in, and the path relative to it
  case $1 in
    */site-packages/*) site=${1%%/site-packages/*}/site-packages ;;
    */dist-packages/*) site=${1%%/dist-packages/*}/dist-packages ;;
  esac
  rel=${1#"$site"/}
}
while IFS= read -r -d '' item; do
  kind=${item%%	*}; p=${item#*	}
  case $kind in
    pth|runner)
      if [ -L "$p" ]; then printf 'code\t%s\0' "$p"; continue; fi
      [ -f "$p" ] || continue
      if [ "$kind" = pth ]; then grep -D skip -qE '^import[ 	]' -- "$p" || continue; fi
      printf 'code\t%s\0' "$p"
      site_of "$p"; records "$site" "$rel" ;;
    entry_points)
      if [ -L "$p" ]; then printf 'code\t%s\0' "$p"; continue; fi
      [ -f "$p" ] && grep -D skip -q '^\[pytest11\]' -- "$p" || continue
      printf 'code\t%s\0' "$p"
      site_of "$p"; records "$site" "$rel" ;;
    dpkg)  # on a merged /usr, dpkg may list the file under /lib, /bin or /sbin
      alias=$p
      case $p in
        /usr/lib/*|/usr/lib64/*|/usr/lib32/*|/usr/bin/*|/usr/sbin/*)
          [ "$(readlink -f /lib)" = /usr/lib ] && alias=${p#/usr} ;;
        /lib/*|/lib64/*|/lib32/*|/bin/*|/sbin/*)
          [ "$(readlink -f /lib)" = /usr/lib ] && alias=/usr$p ;;
      esac
      for l in /var/lib/dpkg/info/*.list; do
        [ -f "$l" ] || continue
        if grep -D skip -qxF -e "$p" -e "$alias" -- "$l"; then printf 'owned\t%s\0' "$p"; break; fi
      done ;;
  esac
done
true
"""


_WHAT = {
    "pth": "a .pth with code lines",
    "runner": "a file of the test runner's own package",
    "entry_points": "a pytest plugin's entry points",
}


def _site_relative(path: str) -> str:
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return posixpath.basename(path)


def _record_digest(line: str, name: str) -> str | None:
    """The sha256 (hex) a RECORD line gives for `name` (`name,sha256=<urlsafe b64>,size`),
    `name` relative to the site folder."""
    fields = line.split(",")
    if len(fields) < 2 or fields[0] != name:
        return None
    algo, _, value = fields[1].partition("=")
    if algo != "sha256" or not value:
        return None
    try:
        return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    except ValueError:
        return None


async def inspect(
    sandbox: Sandbox,
    found: RunnerReview,
    run: Callable[[Sandbox, str, str, bytes], Awaitable[str]],
) -> list[str]:
    """Decide `found.inspect` by reading the files in a fresh process (run after the
    programs it uses, grep among them, were found unchanged): what is tampering."""
    if not found.inspect:
        return []
    stdin = b"".join(f"{k}\t{p}".encode(errors="surrogateescape") + b"\0" for k, p in found.inspect)
    output = await run(sandbox, _INSPECT, "inspect the changes to the tests' runner", stdin)
    kinds = {path: kind for kind, path in found.inspect}
    code: set[str] = set()
    records: dict[str, set[str]] = {}
    owned: set[str] = set()
    for record in output.split("\0"):
        kind, _, rest = record.partition("\t")
        if kind == "code":
            code.add(rest)
        elif kind == "rec":
            path, _, line = rest.partition("\t")
            if digest := _record_digest(line, _site_relative(path)):
                records.setdefault(path, set()).add(digest)
        elif kind == "owned":
            owned.add(rest)
    tampered = [
        f"{p} (not the package manager's) added"
        for k, p in found.inspect
        if k == "dpkg" and p not in owned
    ]
    for kind, path in found.inspect:
        if kind in module_rules.CONTENT_KINDS:
            quoted = shlex.quote(path)
            text = await run(
                sandbox,
                f"if [ -f {quoted} ]; then head -c {module_rules.MAX_CONFIG_BYTES} -- {quoted}; fi",
                f"read {path}",
                b"",
            )
            tampered += module_rules.problems(kind, path, text)
    if code:
        digests = await sandbox.digests(sorted(code))
        for path in sorted(code):
            # Backends spell a digest `<hex>` or `sha256:<hex>:<mode>`; links never match.
            found = _DIGEST.fullmatch(digests.get(path) or "")
            if found is None or found.group(1) not in records.get(path, set()):
                what = _WHAT.get(kinds.get(path, ""), "a file")
                tampered.append(f"{path} ({what}, not written by a package installer) changed")
    return tampered
