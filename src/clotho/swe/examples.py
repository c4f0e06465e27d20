"""The bundled SWE examples: small repositories with injected bugs, built from the source
trees in examples/swe/toy/ into git repositories with fixed commit metadata, so their
commits (and the bug commits `clotho swe generate` recorded in examples/swe/toy.jsonl) are
the same on every machine. No network is needed."""

from __future__ import annotations

import shutil
from pathlib import Path

from clotho.errors import ConfigError
from clotho.swe.generate import commit_env, rebuild_bugs
from clotho.swe.repos import git

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "swe"
TOY_SOURCES = EXAMPLES / "toy"
TOY_INSTANCES = EXAMPLES / "toy.jsonl"
REAL_INSTANCES = EXAMPLES / "real.jsonl"


def _git(repo: Path, *args: str) -> str:
    result = git(*args, cwd=repo, env=commit_env())
    if result.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} in {repo}: {result.stderr.strip()[-300:]}")
    return result.stdout


def commit_tree(source: Path, repo: Path, message: str = "initial") -> str:
    """A git repository at `repo` holding `source`'s files in one commit on `main`."""
    if repo.exists():
        shutil.rmtree(repo)
    shutil.copytree(source, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD").strip()


def add_later_commit(repo: Path) -> str:
    """A commit after the bugs' parent: history an agent must not see."""
    (repo / "LATER.md").write_text("Work done after the instances' base commits.\n")
    _git(repo, "add", "LATER.md")
    _git(repo, "commit", "-q", "-m", "later work")
    return _git(repo, "rev-parse", "HEAD").strip()


def build_toys(dest: Path, instances: Path | None = TOY_INSTANCES) -> list[Path]:
    """One repository per toy under `dest` (its bug commits recreated from `instances`,
    then a later commit on main). Raises when a recreated commit differs from the record."""
    dest.mkdir(parents=True, exist_ok=True)
    repos = []
    for source in sorted(p for p in TOY_SOURCES.iterdir() if p.is_dir()):
        repos.append(repo := dest / source.name)
        commit_tree(source, repo)
    if instances is not None and instances.is_file():
        mismatched = rebuild_bugs(instances, repos_root=dest)
        if mismatched:
            raise ConfigError(f"bug commits differ from {instances}: {mismatched}")
    for repo in repos:
        add_later_commit(repo)
    return repos


# Real pure-Python packages whose sdists ship their tests (pinned; sha256 of the sdist).
REAL_PACKAGES = {
    "inflection": ("0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417"),
    "six": ("1.16.0", "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"),
    "toolz": ("1.0.0", "2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02"),
    "more-itertools": (
        "10.5.0",
        "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6",
    ),
}


def build_real(sdists: Path, dest: Path, instances: Path | None = REAL_INSTANCES) -> list[Path]:
    """A git repository per real package under `dest`, from its sdist in `sdists` (fixed
    commit metadata), with the bug commits of `instances` recreated."""
    import hashlib
    import tarfile
    import tempfile

    dest.mkdir(parents=True, exist_ok=True)
    repos = []
    for name, (version, sha256) in REAL_PACKAGES.items():
        archive = sdists / f"{name}-{version}.tar.gz"
        if not archive.is_file():
            archive = sdists / f"{name.replace('-', '_')}-{version}.tar.gz"
        if not archive.is_file():
            raise ConfigError(f"{archive}: missing (scripts/build-swe-real.sh downloads it)")
        if hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
            raise ConfigError(f"{archive}: sha256 differs from the pinned one")
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
            (top,) = Path(tmp).iterdir()
            repos.append(repo := dest / name)
            commit_tree(top, repo, f"{name} {version} (sdist)")
    if instances is not None and instances.is_file():
        mismatched = rebuild_bugs(instances, repos_root=dest)
        if mismatched:
            raise ConfigError(f"bug commits differ from {instances}: {mismatched}")
    return repos
