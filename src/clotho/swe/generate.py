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
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clotho.errors import ConfigError
from clotho.sandbox import LocalSandboxConfig, Sandbox, SandboxConfig, open_sandbox
from clotho.swe.mutate import Mutation, mutations, sample
from clotho.swe.repos import git
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
    *args: str | Path, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> str:
    result = git(*args, cwd=cwd, stdin=stdin, env=env)
    if result.returncode != 0:
        raise ConfigError(f"git {' '.join(map(str, args))[:200]}: {result.stderr.strip()[-300:]}")
    return result.stdout


def bug_commit(repo: Path, parent: str, instance_id: str, patch_reverse: str) -> str:
    """Commit the bug (the gold patch applied in reverse to `parent`) under BUG_REF."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**commit_env(), "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git_ok("read-tree", parent, cwd=repo, env=env)
        _git_ok("apply", "--cached", "-R", "-", cwd=repo, stdin=patch_reverse, env=env)
        tree = _git_ok("write-tree", cwd=repo, env=env).strip()
        sha = _git_ok(
            "commit-tree", tree, "-p", parent, "-m", f"clotho bug {instance_id}", cwd=repo, env=env
        ).strip()
    _git_ok("update-ref", f"{BUG_REF}/{instance_id}", sha, cwd=repo)
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


def source_files(repo: Path, commit: str) -> list[str]:
    """Python files of the commit that are not tests (nor setup scripts, docs, examples)."""
    names = _git_ok("ls-tree", "-r", "--name-only", commit, cwd=repo).splitlines()
    skip = ("docs/", "doc/", "examples/", "benchmarks/", "setup.py", "noxfile.py")
    return [
        n for n in names
        if n.endswith(".py") and not _is_test_file(n) and not n.startswith(skip)
    ]  # fmt: skip


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
    parent = _git_ok("rev-parse", "HEAD^{commit}", cwd=repo).strip()
    files = source_files(repo, parent)
    candidates: list[Mutation] = []
    for path in files:
        text = _git_ok("show", f"{parent}:{path}", cwd=repo)
        candidates += mutations(path, text)
    chosen = sample(candidates, max_tries or 6 * n, seed)
    config = sandbox_config or LocalSandboxConfig(workdir=TESTBED)
    config = config.model_copy(update={"workdir": TESTBED})
    name = repo.name
    instances: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "tree"
        _git_ok("worktree", "add", "-q", "--detach", snapshot, parent, cwd=repo)
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
                    instance = _instance(repo, name, parent, mutation, f2p, p2p, after,
                                         repo_field)  # fmt: skip
                    instances.append(instance)
                    if progress:
                        progress(f"kept {instance['instance_id']}: {len(f2p)} fail to pass")
        finally:
            git("worktree", "remove", "--force", snapshot, cwd=repo)
            git("worktree", "prune", cwd=repo)
    return instances


def _instance(
    repo: Path, name: str, parent: str, mutation: Mutation, f2p: list[str], p2p: list[str],
    after: SuiteRun, repo_field: str | None,
) -> dict:  # fmt: skip
    digest = hashlib.sha256(mutation.source.encode()).hexdigest()[:8]
    instance_id = f"{name}.{mutation.kind}.{digest}"
    with tempfile.TemporaryDirectory() as tmp:
        fixed, broken = Path(tmp) / "a", Path(tmp) / "b"
        fixed.write_text(_git_ok("show", f"{parent}:{mutation.path}", cwd=repo))
        broken.write_text(mutation.source)
        raw = git("diff", "--no-index", "--no-color", broken, fixed).stdout
    gold = _relabel(raw, str(broken), str(fixed), mutation.path)
    base = bug_commit(repo, parent, instance_id, gold)
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
        parent = _git_ok("rev-parse", "HEAD^{commit}", cwd=repo).strip()
        sha = bug_commit(repo, parent, record["instance_id"], record["patch"])
        if sha != record["base_commit"]:
            mismatched.append(record["instance_id"])
    return mismatched
