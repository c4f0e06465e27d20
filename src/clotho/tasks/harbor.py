"""Harbor / Terminal-Bench 2.0 task directories.

task-name/
  task.toml          metadata, agent and verifier timeouts, environment settings
  instruction.md     what the agent is asked to do
  environment/       workspace files (and a Dockerfile for container backends)
  tests/test.sh      the verifier; writes /logs/verifier/reward.txt or reward.json
  solution/solve.sh  the reference solution (for the oracle agent)
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clotho.errors import TaskError


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class TaskMetadata(_Section):
    category: str = "uncategorized"
    difficulty: str | None = None
    tags: list[str] = Field(default_factory=list)
    author_name: str | None = None
    author_email: str | None = None


class VerifierSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = Field(default_factory=dict)


class AgentSettings(_Section):
    timeout_sec: float = Field(600.0, gt=0)


class EnvironmentSettings(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    storage_mb: int | None = Field(None, gt=0)
    allow_internet: bool = False


class TaskConfig(_Section):
    version: str = "1.0"
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    environment: EnvironmentSettings = Field(default_factory=EnvironmentSettings)


@dataclass(frozen=True)
class Task:
    name: str
    path: Path
    config: TaskConfig
    instruction: str

    @property
    def category(self) -> str:
        return self.config.metadata.category

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        where = f"[{loc[0]}].{'.'.join(loc[1:])}" if len(loc) > 1 else (loc[0] if loc else "?")
        got = err.get("input")
        parts.append(
            f"{where}: {err['msg']}" + (f" (got {got!r})" if not isinstance(got, dict) else "")
        )
    return "; ".join(parts)


def load_task(path: Path) -> Task:
    """Load and check one task directory; a `TaskError` names the file and the field."""
    path = path.resolve()
    if not path.is_dir():
        raise TaskError(f"{path}: not a task directory")
    toml_path = path / "task.toml"
    if not toml_path.is_file():
        raise TaskError(f"{toml_path}: missing")
    try:
        raw: dict[str, Any] = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"{toml_path}: invalid TOML: {exc}") from exc
    try:
        config = TaskConfig.model_validate(raw)
    except ValidationError as exc:
        raise TaskError(f"{toml_path}: {_describe(exc)}") from exc
    instruction_path = path / "instruction.md"
    if not instruction_path.is_file():
        raise TaskError(f"{instruction_path}: missing")
    instruction = instruction_path.read_text(encoding="utf-8").strip()
    if not instruction:
        raise TaskError(f"{instruction_path}: empty")
    if not (path / "tests" / "test.sh").is_file():
        raise TaskError(f"{path / 'tests' / 'test.sh'}: missing (the verifier entry point)")
    env_dir = path / "environment"
    if env_dir.exists() and not env_dir.is_dir():
        raise TaskError(f"{env_dir}: must be a directory")
    return Task(name=path.name, path=path, config=config, instruction=instruction)


def _looks_like_task(path: Path) -> bool:
    return any((path / name).exists() for name in ("task.toml", "instruction.md", "tests"))


def default_rows_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clotho" / "rows"


def discover_tasks(
    paths: list[Path], rows_cache: Path | None = None
) -> tuple[list[Task], list[tuple[Path, TaskError]]]:
    """Tasks under `paths` (task directories, folders of them, or .jsonl/.json files of
    Terminal-Bench 2.0 rows), and the ones that failed."""
    from clotho.tasks.rows import ROW_SUFFIXES, load_rows

    tasks: list[Task] = []
    errors: list[tuple[Path, TaskError]] = []
    seen: set[Path] = set()
    expanded: list[Path] = []
    for p in paths:
        if p.is_file() and p.suffix in ROW_SUFFIXES:
            dirs, row_errors = load_rows(p, rows_cache or default_rows_cache())
            expanded += dirs
            errors += row_errors
        else:
            expanded.append(p)
    paths = expanded

    def visit(path: Path, top: bool) -> None:
        path = path.resolve()
        if path in seen:
            return
        seen.add(path)
        if _looks_like_task(path):
            try:
                tasks.append(load_task(path))
            except TaskError as exc:
                errors.append((path, exc))
            return
        if not path.is_dir():
            if top:
                errors.append((path, TaskError(f"{path}: no such task directory")))
            return
        for child in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
            visit(child, False)

    for p in paths:
        visit(p, True)
    names: dict[str, Path] = {}
    unique: list[Task] = []
    for task in tasks:
        if task.name in names:
            errors.append(
                (
                    task.path,
                    TaskError(
                        f"{task.path}: task name {task.name!r} also used by {names[task.name]}"
                    ),
                )
            )
            continue
        names[task.name] = task.path
        unique.append(task)
    return unique, errors
