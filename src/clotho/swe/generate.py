"""`clotho swe generate`: SWE instances from any git repository with a pytest suite.

The suite runs once in a sandbox at the repository's HEAD; then each sampled bug injection
(`mutate.py`) is written into the sandbox's copy and the suite runs again. A mutation is kept
only when at least one test that passed now fails (its FAIL_TO_PASS) and every other test
that passed still passes (its PASS_TO_PASS). The bug becomes a commit on top of HEAD under
`refs/heads/clotho/bugs/<instance id>` in the repository (objects and a ref only: the
working tree is not touched), made with fixed author and dates so the same bug is always
the same commit; the gold patch is the reverse of the injection; the problem statement is
written from the failing tests (names, assertion messages, a short traceback), never from
the diff.

The repository is read, never worked in: its HEAD is fetched into a private bare clone
(only its upload-pack runs), trees and bug commits are made there, and the kept bugs' refs
are published by one fetch run in the repository. Every git call is `repos.git`, under
`SAFE_CONFIG`: the repository's hooks, fsmonitor and other configured programs never run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clotho.errors import ConfigError, TaskError
from clotho.sandbox import LocalSandboxConfig, Sandbox, SandboxConfig, open_sandbox
from clotho.swe.mutate import Mutation, mutations, sample
from clotho.swe.repos import git, private_clone, publish_refs
from clotho.swe.runner import TestCase, parse_junit, runner_files

log = logging.getLogger(__name__)

BUG_REF = "refs/heads/clotho/bugs"
FIXED_DATE = "2000-01-01T00:00:00+0000"
WORK = "/tmp/clotho-swe-gen"
TESTBED = "/testbed"
SUITE_TIMEOUT_S = 600.0


def commit_env() -> dict[str, str]:
    """Fixed author, committer and dates: the same bug is always the same commit."""
    return {
        "GIT_AUTHOR_DATE": FIXED_DATE,
        "GIT_COMMITTER_DATE": FIXED_DATE,
        "GIT_AUTHOR_NAME": "clotho",
        "GIT_AUTHOR_EMAIL": "clotho@localhost",
        "GIT_COMMITTER_NAME": "clotho",
        "GIT_COMMITTER_EMAIL": "clotho@localhost",
    }


def _git_ok(
    git_dir: Path, *args: str | Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> str:
    """git in our own (private) repository `git_dir`; a failure is a `ConfigError`."""
    result = git("--git-dir", git_dir, *args, stdin=stdin, env=env)
    if result.returncode != 0:
        raise ConfigError(f"git {' '.join(map(str, args))[:200]}: {result.stderr.strip()[-300:]}")
    return result.stdout


def _private(repo: Path, into: Path) -> tuple[Path, str]:
    try:
        return private_clone(repo, into)
    except TaskError as exc:
        raise ConfigError(str(exc)) from None


def _publish(bare: Path, repo: Path, refs: list[str]) -> None:
    try:
        publish_refs(bare, repo, refs)
    except TaskError as exc:
        raise ConfigError(str(exc)) from None


def bug_commit(git_dir: Path, parent: str, instance_id: str, patch_reverse: str) -> str:
    """Commit the bug (the gold patch applied in reverse to `parent`) under BUG_REF in our
    private repository `git_dir`; `publish_refs` copies it to the user's."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**commit_env(), "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git_ok(git_dir, "read-tree", parent, env=env)
        _git_ok(git_dir, "apply", "--cached", "-R", "-", stdin=patch_reverse, env=env)
        tree = _git_ok(git_dir, "write-tree", env=env).strip()
        sha = _git_ok(
            git_dir, "commit-tree", "--no-gpg-sign", tree, "-p", parent, "-m",
            f"clotho bug {instance_id}", env=env,
        ).strip()  # fmt: skip
    _git_ok(git_dir, "update-ref", f"{BUG_REF}/{instance_id}", sha)
    return sha


@dataclass
class SuiteRun:
    cases: list[TestCase]
    output: str

    def passed(self) -> set[str]:
        return {c.nodeid for c in self.cases if c.outcome == "passed"}

    def by_id(self) -> dict[str, TestCase]:
        return {c.nodeid: c for c in self.cases}


async def _run_suite(sandbox: Sandbox, timeout_s: float) -> SuiteRun:
    junit = f"{WORK}/junit.xml"
    result = await sandbox.exec(
        f"rm -f {junit}; exec 2>&1; exec python3 -I {WORK}/run_tests.py {WORK}/ids.json {junit}",
        cwd=TESTBED,
        timeout=timeout_s,
        env={"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    try:
        xml = (await sandbox.read_file(junit)).decode(errors="replace")
        cases = parse_junit(xml)
    except (OSError, ValueError) as exc:
        log.debug("no readable report: %s", exc)
        cases = []
    return SuiteRun(cases, result.stdout[-4000:])


def problem_statement(repo_name: str, failing: list[str], cases: dict[str, TestCase]) -> str:
    """From the failing tests only: names, assertion messages, a short traceback. A test
    that is no longer even collected is named as such."""
    n = len(failing)
    lines = [
        f"Some behaviour of {repo_name} is broken: {n} test{'s' if n != 1 else ''} that "
        f"used to pass now fail{'s' if n == 1 else ''}.",
        "",
    ]
    for test in failing[:5]:
        case = cases.get(test)
        if case is None:
            lines.append(f"- `{test}`: no longer runs (it is not collected)")
            continue
        message = case.message.strip().splitlines()[0][:300] if case.message.strip() else ""
        lines.append(f"- `{test}`" + (f": {message}" if message else ""))
    if n > 5:
        lines.append(f"- ... and {n - 5} more")
    first = next((cases[t] for t in failing if t in cases and cases[t].text.strip()), None)
    if first is not None:
        trace = "\n".join(first.text.strip().splitlines()[-15:])
        lines += ["", f"Traceback of `{first.nodeid}` (shortened):", "```", trace, "```"]
    lines += ["", "Find the cause in the source code and fix it without changing the tests."]
    return "\n".join(lines)


def _is_test_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    parts = path.split("/")
    return (
        name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
        or any(p in ("tests", "test", "testing") for p in parts[:-1])
    )  # fmt: skip


def source_files(git_dir: Path, commit: str) -> list[str]:
    """Regular Python files of the commit that are not tests (nor setup scripts, docs,
    examples); links and submodules are never candidates."""
    listing = _git_ok(git_dir, "ls-tree", "-r", "-z", "--full-tree", commit)
    names = []
    for entry in listing.split("\0"):
        meta, _, name = entry.partition("\t")
        if meta.split(" ")[:2] in (["100644", "blob"], ["100755", "blob"]):
            names.append(name)
    skip = ("docs/", "doc/", "examples/", "benchmarks/", "setup.py", "noxfile.py")
    return [
        n for n in names
        if n.endswith(".py") and not _is_test_file(n) and not n.startswith(skip)
    ]  # fmt: skip


def _check_out(git_dir: Path, commit: str, dest: Path) -> None:
    """The commit's files into `dest` (no `.git`), from our private repository."""
    dest.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git_ok(git_dir, "--work-tree", dest, "read-tree", commit, env=env)
        _git_ok(git_dir, "--work-tree", dest, "checkout-index", "-a", "-f", env=env)


async def generate(
    repo: Path,
    *,
    n: int = 10,
    seed: int = 0,
    sandbox_config: SandboxConfig | None = None,
    repo_field: str | None = None,
    max_tries: int | None = None,
    timeout_s: float = SUITE_TIMEOUT_S,
    max_fail_fraction: float = 0.5,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Up to `n` validated instances of `repo` (a git repository whose HEAD is the fixed
    code). Each candidate costs one run of the suite; at most `max_tries` (default 6n). A bug
    that breaks more than `max_fail_fraction` of the passing tests (an import-time failure
    breaks them all) is dropped: it says nothing about where the bug is."""
    repo = repo.resolve()
    if not (repo / ".git").exists() and not (repo / "HEAD").exists():
        raise ConfigError(f"{repo}: not a git repository")
    config = sandbox_config or LocalSandboxConfig(workdir=TESTBED)
    config = config.model_copy(update={"workdir": TESTBED})
    name = repo.name
    instances: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        bare, parent = _private(repo, Path(tmp))
        candidates: list[Mutation] = []
        for path in source_files(bare, parent):
            text = _git_ok(bare, "show", f"{parent}:{path}")
            candidates += mutations(path, text)
        chosen = sample(candidates, max_tries or 6 * n, seed)
        snapshot = Path(tmp) / "tree"
        _check_out(bare, parent, snapshot)
        runner = Path(tmp) / "runner"
        for rel, data in {**runner_files(), "ids.json": b"[]"}.items():
            (runner / rel).parent.mkdir(parents=True, exist_ok=True)
            (runner / rel).write_bytes(data)
        try:
            async with await open_sandbox(config) as sandbox:
                await sandbox.upload(snapshot, TESTBED)
                await sandbox.exec(f"rm -f {TESTBED}/.git")
                await sandbox.upload(runner, WORK)
                before = await _run_suite(sandbox, timeout_s)
                passing = before.passed()
                if not passing:
                    raise ConfigError(
                        f"{repo}: no test passes at HEAD; the suite said: {before.output[-800:]}"
                    )
                if progress:
                    progress(f"{name}: {len(passing)} tests pass at HEAD; "
                             f"{len(candidates)} candidate bugs, trying {len(chosen)}")  # fmt: skip
                for mutation in chosen:
                    if len(instances) >= n:
                        break
                    target = f"{TESTBED}/{mutation.path}"
                    await sandbox.write_file(target, mutation.source.encode())
                    after = await _run_suite(sandbox, timeout_s)
                    original = (snapshot / mutation.path).read_bytes()
                    await sandbox.write_file(target, original)
                    now = after.passed()
                    f2p = sorted(passing - now)
                    p2p = sorted(passing & now)
                    if not f2p or not p2p or len(f2p) > max_fail_fraction * len(passing):
                        continue  # nothing broke, or (nearly) everything did: no clue where
                    instance = _instance(bare, repo, name, parent, mutation, f2p, p2p, after,
                                         repo_field)  # fmt: skip
                    instances.append(instance)
                    if progress:
                        progress(f"kept {instance['instance_id']}: {len(f2p)} fail to pass")
        finally:
            kept = [f"{BUG_REF}/{i['instance_id']}" for i in instances]
            _publish(bare, repo, kept)
    return instances


def _instance(
    bare: Path, repo: Path, name: str, parent: str, mutation: Mutation, f2p: list[str],
    p2p: list[str], after: SuiteRun, repo_field: str | None,
) -> dict:  # fmt: skip
    digest = hashlib.sha256(mutation.source.encode()).hexdigest()[:8]
    instance_id = f"{name}.{mutation.kind}.{digest}"
    with tempfile.TemporaryDirectory() as tmp:
        fixed, broken = Path(tmp) / "a", Path(tmp) / "b"
        fixed.write_text(_git_ok(bare, "show", f"{parent}:{mutation.path}"))
        broken.write_text(mutation.source)
        raw = git(
            "diff", "--no-index", "--no-color", "--no-ext-diff", "--no-textconv", broken, fixed,
            cwd=Path(tmp),
        ).stdout  # fmt: skip
    gold = _relabel(raw, str(broken), str(fixed), mutation.path)
    base = bug_commit(bare, parent, instance_id, gold)
    cases = after.by_id()
    return {
        "instance_id": instance_id,
        "repo": repo_field or str(repo),
        "base_commit": base,
        "problem_statement": problem_statement(name, f2p, cases),
        "patch": gold,
        "test_patch": "",
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
        "mutation": {"kind": mutation.kind, "path": mutation.path, "line": mutation.line},
        "created_by": "clotho swe generate",
    }


def _relabel(diff: str, old: str, new: str, path: str) -> str:
    """`git diff --no-index` of two temp files as a diff of `path` in the repository."""
    out = []
    for line in diff.splitlines(keepends=True):
        if line.startswith("diff --git "):
            line = f"diff --git a/{path} b/{path}\n"
        elif line.startswith("--- "):
            line = f"--- a/{path}\n"
        elif line.startswith("+++ "):
            line = f"+++ b/{path}\n"
        out.append(line)
    return "".join(out)


def write_jsonl(instances: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in instances))


def rebuild_bugs(instances_file: Path, repos_root: Path | None = None) -> list[str]:
    """Recreate each instance's bug commit in its repository (fixed metadata: the same
    commit id as when it was generated); returns the ids whose commit did not match.
    `repo` is taken relative to `repos_root` (default: the instance file's folder)."""
    mismatched = []
    for line in instances_file.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        repo = Path(record["repo"])
        if repos_root is not None:  # a folder of mirrors: owner/name is found by its name
            repo = repos_root / record["repo"].rsplit("/", 1)[-1]
        elif not repo.is_absolute():
            repo = instances_file.parent / repo
        with tempfile.TemporaryDirectory() as tmp:
            bare, parent = _private(repo, Path(tmp))
            sha = bug_commit(bare, parent, record["instance_id"], record["patch"])
            _publish(bare, repo, [f"{BUG_REF}/{record['instance_id']}"])
        if sha != record["base_commit"]:
            mismatched.append(record["instance_id"])
    return mismatched
