"""A repository's own programs never run on the host.

Repositories arrive with their `.git` (datasets, mirror folders), whose hooks and config can
name programs: hooks, an fsmonitor, filters, diff drivers, a signing program, an alternates
command, a credential helper. Here every one of them appends to a marker file; `clotho swe
generate`, the repository cache and `rebuild_bugs` run on such a repository and the marker
stays absent. A control run of plain git first shows the traps do fire.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap

from clotho.swe.examples import build_toys
from clotho.swe.generate import BUG_REF, generate, rebuild_bugs
from clotho.swe.instance import SweInstance
from clotho.swe.repos import RepoCache, git, git_dir_of

HOOKS = (
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite",
    "post-index-change", "fsmonitor-watchman",
)  # fmt: skip


def trap(repo: Path, marker: Path) -> None:
    """Arm every program-running hook and config key of `repo` to write `marker`."""
    script = repo.parent / f"{repo.name}-trap.sh"
    script.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> {marker}\n')
    script.chmod(0o755)
    hooks = git_dir_of(repo) / "hooks"
    hooks.mkdir(exist_ok=True)
    for name in HOOKS:
        (hooks / name).write_text(script.read_text())
        (hooks / name).chmod(0o755)
    # A second repository as an alternate, so the alternates command has a reason to run.
    other = repo.parent / f"{repo.name}-alternate.git"
    subprocess.run(["git", "init", "-q", "--bare", str(other)], check=True)
    (git_dir_of(repo) / "objects" / "info" / "alternates").write_text(f"{other}/objects\n")
    (git_dir_of(repo) / "info").mkdir(exist_ok=True)
    (git_dir_of(repo) / "info" / "attributes").write_text("* filter=trap diff=trap\n")
    settings = {
        "core.fsmonitor": str(script),
        "core.alternateRefsCommand": str(script),
        "core.sshCommand": str(script),
        "core.askPass": str(script),
        "core.pager": str(script),
        "credential.helper": f"!{script}",
        "diff.external": str(script),
        "diff.trap.textconv": str(script),
        "filter.trap.clean": str(script),
        "filter.trap.smudge": str(script),
        "filter.trap.process": str(script),
        "commit.gpgSign": "true",
        "gpg.program": str(script),
        "uploadpack.packObjectsHook": str(script),
        "gc.auto": "1",
        "maintenance.auto": "true",
    }
    for key, value in settings.items():
        subprocess.run(
            ["git", "--git-dir", str(git_dir_of(repo)), "config", key, value], check=True
        )


def plain_git(repo: Path, *args: str) -> None:
    """git as a user would run it in the repository: its own config and hooks apply."""
    subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "HOME": os.devnull},
        check=False,
    )


@pytest.fixture
def trapped(tmp_path: Path) -> tuple[Path, Path]:
    """(a toy repository with a pytest suite, armed; its marker file, absent)."""
    repo = build_toys(tmp_path / "repos", instances=None)[1]  # calendar_utils
    git("reset", "-q", "--hard", "HEAD~1", cwd=repo)
    marker = tmp_path / "ran-on-the-host"
    trap(repo, marker)
    # Control: the traps fire for plain git (fsmonitor on status, a hook on a ref update).
    plain_git(repo, "status")
    plain_git(repo, "update-ref", "refs/heads/control", "HEAD")
    fired = marker.read_text()
    assert "reference-transaction" in fired and "trap.sh" in fired, fired
    plain_git(repo, "update-ref", "-d", "refs/heads/control")
    marker.unlink()
    return repo, marker


@requires_bwrap
async def test_generate_runs_none_of_the_repositorys_programs(
    trapped: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, marker = trapped
    monkeypatch.chdir(repo)  # started from inside the repository, as a user would
    found = await generate(repo, n=1, seed=7, max_tries=8)
    assert found, "no bug was kept"
    assert not marker.exists(), marker.read_text()
    instance = SweInstance.model_validate(found[0])
    # The bug commit was published into the repository (what eval fetches)...
    ref = f"{BUG_REF}/{instance.instance_id}"
    shown = git("--git-dir", git_dir_of(repo), "rev-parse", ref)
    assert shown.stdout.strip() == instance.base_commit
    # ...and the repository was not worked in: no worktree, no index change, no FETCH_HEAD.
    assert not (git_dir_of(repo) / "worktrees").exists()
    assert not (git_dir_of(repo) / "FETCH_HEAD").exists()

    # The repository cache reads it as a folder of its own (eval's path).
    cache = RepoCache(tmp_path / "cache", network=False)
    snapshot = cache.snapshot(instance)
    cache.check_patch(snapshot, instance, "patch")
    assert (snapshot / ".git").is_dir()
    assert not marker.exists(), marker.read_text()

    # Rebuilding the bug commits (what build_toys does) gives the same commit, quietly.
    records = tmp_path / "instances.jsonl"
    records.write_text(json.dumps(found[0]) + "\n")
    assert rebuild_bugs(records) == []
    assert not marker.exists(), marker.read_text()


def test_the_git_helper_ignores_the_repository_it_is_started_in(
    trapped: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A diff of two files outside any repository, run from inside one: its diff.external
    and textconv do not apply."""
    repo, marker = trapped
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("one\n")
    b.write_text("two\n")
    monkeypatch.chdir(repo)
    result = git("diff", "--no-index", a, b)
    assert "+two" in result.stdout
    assert not marker.exists(), marker.read_text()


def test_the_cache_never_runs_a_mirrors_programs(
    trapped: tuple[Path, Path], tmp_path: Path
) -> None:
    """A mirror folder (repos_dir) with armed hooks and config: fetch, snapshot, check."""
    repo, marker = trapped
    head = git("--git-dir", git_dir_of(repo), "rev-parse", "HEAD").stdout.strip()
    instance = SweInstance.model_validate(
        {
            "instance_id": "mirror-1",
            "repo": f"owner/{repo.name}",
            "base_commit": head,
            "problem_statement": "x",
            "patch": "",
            "FAIL_TO_PASS": ["t"],
            "PASS_TO_PASS": [],
        }
    )
    cache = RepoCache(tmp_path / "cache", repos_dir=repo.parent, network=False)
    snapshot = cache.snapshot(instance)
    assert (snapshot / ".git").is_dir() and any(snapshot.iterdir())
    assert cache.fetches == 1
    assert not marker.exists(), marker.read_text()
