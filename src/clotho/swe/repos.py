"""The host's repository cache: one bare repository per `repo`, shared by every rollout, and
one snapshot per (repo, commit) that rollouts copy into their sandboxes.

A bare repository is fetched once, under a file lock (concurrent processes and rollouts wait
for one fetch), and fetched again only for a commit it lacks. A snapshot is a shallow
one-commit clone of the bare repository at the base commit: its files and a `.git` holding
that commit alone, with no remote, no other refs and no later objects, so an agent that
gets a copy sees neither the future of the repository nor the gold patch. Snapshots are
made once (in a temporary folder renamed into place) and never changed afterwards; every
rollout gets its own copy (`Sandbox.upload`), so rollouts never see each other's edits.

Blocking (git, file locks): callers run it in a thread (`RepoCache.snapshot_async`).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clotho.errors import TaskError
from clotho.swe.install_cache import InstallCache, InstallCacheOptions
from clotho.swe.instance import SweInstance

_OWNER_NAME = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
BUNDLED_OWNER = "clotho-examples"
REAL_OWNER = "clotho-pypi"
# Where scripts/build-swe-examples.sh puts the real packages' repositories.
REAL_REPOS = Path.home() / ".cache" / "clotho" / "swe" / "pypi"
_SHA = re.compile(r"^[0-9a-fA-F]{4,40}$")
GIT_TIMEOUT_S = 900.0
# A git that reads no user or system configuration and never asks for credentials.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "clotho",
    "GIT_AUTHOR_EMAIL": "clotho@localhost",
    "GIT_COMMITTER_NAME": "clotho",
    "GIT_COMMITTER_EMAIL": "clotho@localhost",
    "LC_ALL": "C",
}
# Repositories arrive with their own `.git` (datasets, mirror folders), and its config can
# name programs: hooks, an fsmonitor, filters, a signing program, credential helpers, an
# alternates command, a transport rewritten to ssh or ext. Given on the command line, these
# outrank the repository's config in every git call on the host. (Filters, diff drivers and
# `uploadpack.packObjectsHook` are only honoured from our own repositories' config and the
# command line, which name none.) A local push would run the target's hooks in its own
# receive-pack, which does not see these: refs are published by a fetch run in the target.
SAFE_CONFIG = (
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.alternateRefsCommand=true",
    "core.askPass=",
    "credential.helper=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gc.auto=0",
    "maintenance.auto=false",
    "submodule.recurse=false",
    "fetch.recurseSubmodules=false",
    "protocol.allow=never",
    "protocol.file.allow=always",
    "protocol.https.allow=always",
)
_SAFE_ARGS = [arg for pair in SAFE_CONFIG for arg in ("-c", pair)]


def git(
    *args: str | Path,
    cwd: Path | None = None,
    stdin: str | None = None,
    timeout: float = GIT_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run git on the host: no user or system configuration, and none of the programs a
    repository's own config names (`SAFE_CONFIG`); never raises for a failing command.
    Without `cwd` it runs in `/`, never in a repository it happens to be started from."""
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.devnull, **GIT_ENV}
    return subprocess.run(
        ["git", *_SAFE_ARGS, *map(str, args)],
        cwd=cwd or "/",
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,  # never the harness's own
        capture_output=True,
        text=True,
        env={**full, **(env or {})},
        timeout=timeout,
        check=False,
    )


def git_dir_of(repo: Path) -> Path:
    """The git directory of a repository folder (its `.git`, or the folder when bare)."""
    return repo / ".git" if (repo / ".git").exists() else repo


def private_clone(repo: Path, into: Path, ref: str = "HEAD") -> tuple[Path, str]:
    """(a bare repository of ours under `into` holding `repo`'s `ref`, its commit id).
    Only `repo`'s upload-pack reads it; everything else runs on the copy."""
    bare = into / "private.git"
    _check(git("init", "-q", "--bare", bare), f"cannot make {bare}")
    fetched = git(
        "--git-dir", bare, "fetch", "-q", "--no-tags", "--no-write-fetch-head",
        git_dir_of(repo), f"+{ref}:refs/clotho/base",
    )  # fmt: skip
    if fetched.returncode != 0:
        raise TaskError(f"{repo}: cannot read {ref}: {fetched.stderr.strip()[-300:]}")
    commit = _check(
        git("--git-dir", bare, "rev-parse", "--verify", "refs/clotho/base^{commit}"),
        f"{repo}: {ref} is not a commit",
    ).strip()
    return bare, commit


def publish_refs(source: Path, repo: Path, refs: list[str]) -> None:
    """Copy `refs` (and their objects) from our bare `source` into `repo`, by a fetch run in
    `repo` under `SAFE_CONFIG` (its hooks, auto-gc and alternates command stay off)."""
    if not refs:
        return
    published = git(
        "--git-dir", git_dir_of(repo), "fetch", "-q", "--no-tags", "--no-write-fetch-head",
        source, *(f"+{ref}:{ref}" for ref in refs),
    )  # fmt: skip
    if published.returncode != 0:
        raise TaskError(f"cannot write {len(refs)} refs into {repo}: {published.stderr[-300:]}")


def _check(result: subprocess.CompletedProcess[str], what: str) -> str:
    if result.returncode != 0:
        raise TaskError(f"{what}: {(result.stderr or result.stdout).strip()[-500:]}")
    return result.stdout


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock other processes (and threads, each with its own open) respect."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class RepoCache:
    """Bare repositories under `root/repos`, snapshots under `root/snapshots`."""

    def __init__(self, root: Path, *, repos_dir: Path | None = None, network: bool = True) -> None:
        self.root = root
        self.repos_dir = repos_dir
        self.network = network
        self._locks: dict[str, asyncio.Lock] = {}
        self.fetches = 0  # fetches this cache made (tests and the benchmark read it)
        self._installs: InstallCache | None = None

    def install_cache(self, options: InstallCacheOptions | None = None) -> InstallCache:
        """The install cache beside these repositories (`<root>/installs`), one per
        RepoCache so every trial sharing it shares the install locks; `options` apply when
        given (the first call makes it)."""
        if self._installs is None:
            self._installs = InstallCache(self.root, options)
        elif options is not None:
            self._installs.options = options
        return self._installs

    # -- where a repository comes from ----------------------------------------------------

    def source(self, instance: SweInstance) -> tuple[str, str]:
        """(slug, URL or path to fetch from) for the instance's `repo`."""
        repo = instance.repo.strip()
        if repo.startswith("file://"):
            path = Path(repo.removeprefix("file://"))
            return self._path_slug(path), str(path)
        candidate = Path(repo).expanduser()
        if not candidate.is_absolute() and instance.source is not None:
            relative = instance.source / candidate
            if relative.exists():
                candidate = relative
        if candidate.is_absolute() or candidate.exists():
            if not candidate.exists():
                raise TaskError(f"instance {instance.instance_id}: repo {repo}: no such folder")
            return self._path_slug(candidate), str(candidate.resolve())
        if _OWNER_NAME.match(repo):
            owner, name = repo.split("/")
            slug = f"{owner}__{name.removesuffix('.git')}"
            if self.repos_dir is not None:
                for option in (
                    slug,
                    f"{slug}.git",
                    f"{owner}/{name}",
                    f"{owner}/{name}.git",
                    name,
                    f"{name}.git",
                ):
                    mirror = self.repos_dir / option
                    if mirror.is_dir():
                        return slug, str(mirror.resolve())
            if owner == BUNDLED_OWNER:  # the bundled toys: built here, no network
                built = self.bundled_examples() / name
                if built.is_dir():
                    return slug, str(built)
            if owner == REAL_OWNER and (REAL_REPOS / name).is_dir():  # build-swe-examples.sh
                return slug, str(REAL_REPOS / name)
            if not self.network:
                raise TaskError(
                    f"instance {instance.instance_id}: repo {repo}: no mirror in "
                    f"{self.repos_dir or '(no --repos-dir given)'} and network cloning is off"
                )
            return slug, f"https://github.com/{owner}/{name.removesuffix('.git')}.git"
        raise TaskError(
            f"instance {instance.instance_id}: repo {repo!r}: not a folder, file:// URL or "
            "owner/name"
        )

    def bundled_examples(self) -> Path:
        """examples/swe/toy/ built into git repositories under the cache, once."""
        from clotho.swe.examples import TOY_INSTANCES, build_toys

        version = hashlib.sha256(TOY_INSTANCES.read_bytes()).hexdigest()[:12]
        folder = self.root / "examples" / version
        done = folder / ".built"
        if not done.is_file():
            with file_lock(self.root / "locks" / f"examples-{version}.lock"):
                if not done.is_file():
                    build_toys(folder)
                    done.write_text("ok\n")
        return folder

    @staticmethod
    def _path_slug(path: Path) -> str:
        digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", path.resolve().name.removesuffix(".git"))
        return f"{name}-{digest}"

    # -- the bare repository ------------------------------------------------------------

    def bare_path(self, slug: str) -> Path:
        return self.root / "repos" / f"{slug}.git"

    def _has_commit(self, bare: Path, commit: str) -> str | None:
        result = git("--git-dir", bare, "rev-parse", "-q", "--verify", f"{commit}^{{commit}}")
        return result.stdout.strip() if result.returncode == 0 else None

    def ensure_commit(self, instance: SweInstance) -> tuple[str, Path, str]:
        """(slug, bare repository, full commit id): fetched under the repository's lock,
        only when the commit is missing."""
        if not _SHA.match(instance.base_commit):
            raise TaskError(
                f"instance {instance.instance_id}: base_commit {instance.base_commit!r} is "
                "not a commit id"
            )
        slug, url = self.source(instance)
        bare = self.bare_path(slug)
        full = self._has_commit(bare, instance.base_commit) if bare.is_dir() else None
        if full is not None:
            return slug, bare, full
        with file_lock(self.root / "locks" / f"{slug}.lock"):
            if not bare.is_dir():
                bare.parent.mkdir(parents=True, exist_ok=True)
                _check(git("init", "-q", "--bare", bare), f"cannot make {bare}")
                git("--git-dir", bare, "config", "uploadpack.allowAnySHA1InWant", "true")
            full = self._has_commit(bare, instance.base_commit)
            if full is None:
                self.fetches += 1
                fetched = git(
                    "--git-dir",
                    bare,
                    "fetch",
                    "-q",
                    "--prune",
                    "--no-tags",
                    url,
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                )
                full = self._has_commit(bare, instance.base_commit)
                if full is None and len(instance.base_commit) == 40:
                    git("--git-dir", bare, "fetch", "-q", url, instance.base_commit)
                    full = self._has_commit(bare, instance.base_commit)
                if full is None:
                    why = fetched.stderr.strip()[-300:] if fetched.returncode else "not found"
                    raise TaskError(
                        f"instance {instance.instance_id}: base_commit {instance.base_commit} "
                        f"is not in {instance.repo} ({why})"
                    )
        return slug, bare, full

    # -- snapshots ----------------------------------------------------------------------

    def snapshot(self, instance: SweInstance) -> Path:
        """The repository at the base commit, with a one-commit `.git`; made once."""
        if len(instance.base_commit) == 40:  # the warm case: no git at all
            slug, _ = self.source(instance)
            known = self.root / "snapshots" / slug / instance.base_commit.lower()
            if known.is_dir():
                return known
        slug, bare, commit = self.ensure_commit(instance)
        target = self.root / "snapshots" / slug / commit
        if target.is_dir():
            return target
        with file_lock(self.root / "locks" / f"{slug}-{commit}.lock"):
            if target.is_dir():
                return target
            target.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
            try:
                _check(git("init", "-q", work), "git init")
                _check(
                    git(
                        "fetch",
                        "-q",
                        "--depth",
                        "1",
                        "--no-tags",
                        f"file://{bare}",
                        commit,
                        cwd=work,
                    ),
                    f"instance {instance.instance_id}: cannot take {commit} from {bare}",
                )
                _check(
                    git(
                        "-c",
                        "advice.detachedHead=false",
                        "checkout",
                        "-q",
                        "--detach",
                        commit,
                        cwd=work,
                    ),
                    f"instance {instance.instance_id}: cannot check out {commit}",
                )
                for leftover in ("FETCH_HEAD", "hooks", "logs", "description"):
                    path = work / ".git" / leftover
                    if path.is_dir():
                        shutil.rmtree(path)
                    elif path.exists():
                        path.unlink()
                git("config", "user.name", "clotho", cwd=work)
                git("config", "user.email", "clotho@localhost", cwd=work)
                work.chmod(0o755)
                work.rename(target)
            except BaseException:
                shutil.rmtree(work, ignore_errors=True)
                raise
        return target

    def check_patch(self, snapshot: Path, instance: SweInstance, field: str) -> None:
        """A `TaskError` naming the field when the record's diff does not apply."""
        diff = getattr(instance, field)
        if not diff.strip():
            return
        result = git("apply", "--check", "-", cwd=snapshot, stdin=diff)
        if result.returncode != 0:
            raise TaskError(
                f"instance {instance.instance_id}: {field} does not apply to "
                f"{instance.base_commit}: {result.stderr.strip()[-300:]}"
            )

    async def snapshot_async(self, instance: SweInstance) -> Path:
        """`snapshot` in a thread; rollouts of one repository in this process wait for one."""
        lock = self._locks.setdefault(instance.repo, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self.snapshot, instance)


def patch_files(diff: str) -> list[str]:
    """The paths a unified diff touches (both sides, without a/ b/ and /dev/null)."""
    found: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("--- ", "+++ ")):
            path = line[4:].split("\t", 1)[0].strip()
            if path.startswith('"') and path.endswith('"'):
                path = path[1:-1]
            if path == "/dev/null":
                continue
            if path[:2] in ("a/", "b/"):
                path = path[2:]
            if path not in found:
                found.append(path)
    return found
