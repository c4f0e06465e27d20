"""Harbor / Terminal-Bench 2.0 task directories.

task-name/
  task.toml          metadata, agent and verifier timeouts, environment settings
  instruction.md     what the agent is asked to do
  environment/       workspace files (and a Dockerfile for container backends)
  tests/test.sh      the verifier; writes /logs/verifier/reward.txt or reward.json
  solution/solve.sh  the reference solution (for the oracle agent)

Task folders come from strangers: a malformed or hostile one is a `TaskError` for that task
(naming the file and the field), never a crash of the whole discovery. Nothing a task
folder holds may point outside it (its files are read and uploaded to sandboxes).
"""

from __future__ import annotations

import errno
import functools
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from clotho.errors import TaskError, describe_validation_error

# Upper bounds: far above any real task, low enough that no later arithmetic overflows.
MAX_TIMEOUT_SEC = 30 * 24 * 3600.0
MAX_CPUS = 1024.0
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_STORAGE_MB = 1024 * 1024 * 1024  # 1 PiB
MAX_GPUS = 1024
# task.toml and instruction.md are read whole: a bigger one is not a task but an accident.
MAX_TEXT_BYTES = 4 * 1024 * 1024
# Linux refuses one environment string (NAME=value) longer than this (MAX_ARG_STRLEN).
MAX_ENV_ENTRY = 128 * 1024


def _no_bool(value: object) -> object:
    # pydantic reads `true` as 1 for numbers; in a task file that is a mistake.
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


_Seconds = Annotated[
    float, BeforeValidator(_no_bool), Field(gt=0, le=MAX_TIMEOUT_SEC, allow_inf_nan=False)
]

# Harbor's deprecated `memory` / `storage` spellings: a number and a unit, K, M, G or T
# (Harbor reads K, M and G, case-insensitive, decimals allowed). `2GB`, `2Gi` and `2GiB`
# are read too and, like Harbor's `G` and Docker's `2g`/`2gb`, all mean 1024-based units.
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([KMGT])(?:IB|I|B)?", re.IGNORECASE | re.ASCII)
_UNIT_MB = {"K": Decimal(1) / 1024, "M": Decimal(1), "G": Decimal(1024), "T": Decimal(1024**2)}


def _size_mb(value: object, cap: int) -> int | None:
    """A size with a unit (`2G`, `512M`, `2GB`, `2Gi`, `0.5G`) in whole MB (rounded down)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(
            "expected a size with a unit like '2G' or '512M' "
            "(a plain number of MB goes in memory_mb / storage_mb)"
        )
    match = _SIZE.fullmatch(value.strip()) if len(value) <= 64 else None
    if match is None:
        raise ValueError("expected a size like '2G', '512M', '2GB' or '2Gi'")
    mb = int(Decimal(match[1]) * _UNIT_MB[match[2].upper()])
    if mb < 1:
        raise ValueError("must be at least 1 MB")
    if mb > cap:
        raise ValueError(f"must be at most {cap} MB")
    return mb


class _Section(BaseModel):
    # Unknown keys are kept (in `model_extra`), not refused: Harbor ignores keys it does
    # not know and adds new ones over time (network_mode, healthcheck, mcp_servers, ...),
    # so a key we do not know yet must not turn a valid Terminal-Bench task invalid.
    model_config = ConfigDict(extra="allow")


class TaskMetadata(_Section):
    category: str = "uncategorized"
    difficulty: str | None = None
    tags: list[str] = Field(default_factory=list)
    author_name: str | None = None
    author_email: str | None = None


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class VerifierSettings(_Section):
    timeout_sec: _Seconds = 600.0
    env: dict[str, str] = Field(default_factory=dict)
    reward_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="a reward outside [low, high] is a verifier error (a 2 must not pass)",
    )

    @field_validator("reward_range")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"must be two finite numbers, low <= high, got {list(value)}")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name[:80]!r} is not an environment variable name "
                    "(letters, digits and _, not starting with a digit)"
                )
            if "\0" in value:
                raise ValueError(f"the value of {name} contains a NUL character")
            if len(name) + len(value) + 2 > MAX_ENV_ENTRY:
                raise ValueError(f"{name} is longer than {MAX_ENV_ENTRY} characters")
        return env


class AgentSettings(_Section):
    timeout_sec: _Seconds = 600.0


_MemoryMB = Annotated[int, BeforeValidator(_no_bool), Field(gt=0, le=MAX_MEMORY_MB)]
_StorageMB = Annotated[int, BeforeValidator(_no_bool), Field(gt=0, le=MAX_STORAGE_MB)]


class EnvironmentSettings(_Section):
    """The `[environment]` table, normalised: whichever spelling a task uses, its limits are
    `cpus`, `memory_mb` and `storage_mb` (None: the task sets no limit)."""

    build_timeout_sec: _Seconds = 600.0
    docker_image: str | None = None
    cpus: Annotated[
        float | None,
        BeforeValidator(_no_bool),
        Field(gt=0, le=MAX_CPUS, allow_inf_nan=False),
    ] = None
    memory_mb: _MemoryMB | None = None
    storage_mb: _StorageMB | None = None
    # gpus > 0 is refused before any sandbox starts: no backend here gives a task GPUs
    # (`tasks.environment.refuse_gpus`).
    gpus: Annotated[int, BeforeValidator(_no_bool), Field(ge=0, le=MAX_GPUS)] = 0
    gpu_types: list[str] | None = None
    # Harbor's default is True; clotho's sandboxes have no network, so a task that does
    # not ask for it explicitly gets none, and one that asks gets one only in a run that
    # gives networks (`--network`), else it is refused (`sandbox.backends.with_task_network`).
    allow_internet: bool = False
    # Harbor's deprecated spellings (`memory = "2G"`, `storage = "10G"`, as Terminal-Bench
    # 2.0 writes them), read into memory_mb / storage_mb and then cleared.
    memory: Annotated[
        int | None, BeforeValidator(functools.partial(_size_mb, cap=MAX_MEMORY_MB))
    ] = Field(None, exclude=True, repr=False)
    storage: Annotated[
        int | None, BeforeValidator(functools.partial(_size_mb, cap=MAX_STORAGE_MB))
    ] = Field(None, exclude=True, repr=False)

    @model_validator(mode="after")
    def _sizes(self) -> EnvironmentSettings:
        for old, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
            mb, current = getattr(self, old), getattr(self, new)
            if mb is None:
                continue
            if current is not None and current != mb:
                raise ValueError(f"{old} ({mb} MB) and {new} ({current}) disagree; keep one")
            setattr(self, new, mb)
            setattr(self, old, None)
        return self


class TaskConfig(_Section):
    version: str = "1.0"
    metadata: TaskMetadata = Field(default_factory=TaskMetadata)
    verifier: VerifierSettings = Field(default_factory=VerifierSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    environment: EnvironmentSettings = Field(default_factory=EnvironmentSettings)


_SECTIONS: dict[str, type[_Section]] = {
    "metadata": TaskMetadata,
    "verifier": VerifierSettings,
    "agent": AgentSettings,
    "environment": EnvironmentSettings,
}


def parse_task_config(raw: dict[str, Any], where: str) -> TaskConfig:
    """Check a parsed task.toml; a `TaskError` names `where` and every bad `[section].field`."""
    problems: list[str] = []
    data = dict(raw)
    for name, model in _SECTIONS.items():
        if name not in raw:
            continue
        if not isinstance(raw[name], dict):
            problems.append(f"[{name}]: must be a table (got {type(raw[name]).__name__})")
            continue
        try:
            data[name] = model.model_validate(raw[name])
        except ValidationError as exc:
            problems.append(describe_validation_error(exc, prefix=f"[{name}]."))
    if not problems:
        try:
            return TaskConfig.model_validate(data)
        except ValidationError as exc:
            problems.append(describe_validation_error(exc))
    raise TaskError(f"{where}: {'; '.join(problems)}")


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


def _os_problem(exc: BaseException) -> str:
    if isinstance(exc, RuntimeError) or getattr(exc, "errno", None) == errno.ELOOP:
        return "a symlink loop"  # Python 3.11's Path.resolve raises RuntimeError for one
    if isinstance(exc, OSError):
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "missing (or a broken symlink)"
        return f"cannot be read: {exc.strerror or exc}"
    return str(exc)


def _resolve(path: Path) -> Path:
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise TaskError(f"{path}: {_os_problem(exc)}") from exc


def _present(path: Path) -> bool:
    """Whether `path` exists as an entry (a broken link counts); unreadable is a `TaskError`."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise TaskError(f"{path}: {_os_problem(exc)}") from exc
    return True


def _member(task_dir: Path, name: str, *, folder: bool, required: str | None = None) -> bool:
    """Check `task_dir/name`: a file (or folder) inside the task, even through symlinks.
    Returns whether it is there; a missing one is a `TaskError` when `required` says why."""
    path = task_dir / name
    if not _present(path):
        if required is not None:
            raise TaskError(f"{path}: missing{required}")
        return False
    target = _resolve(path)
    if not target.is_relative_to(task_dir):
        raise TaskError(f"{path}: a symlink to {target}, outside the task folder")
    try:
        mode = target.stat().st_mode
    except OSError as exc:
        raise TaskError(f"{path}: {_os_problem(exc)}") from exc
    if folder and not stat.S_ISDIR(mode):
        raise TaskError(f"{path}: must be a directory")
    if not folder and not stat.S_ISREG(mode):
        raise TaskError(f"{path}: must be a regular file")
    return True


def _read_text(path: Path) -> str:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_TEXT_BYTES + 1)
    except OSError as exc:
        raise TaskError(f"{path}: {_os_problem(exc)}") from exc
    if len(data) > MAX_TEXT_BYTES:
        raise TaskError(f"{path}: larger than {MAX_TEXT_BYTES // (1024 * 1024)} MiB")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text (invalid byte at offset {exc.start})") from exc


def _toml_problem(text: str, exc: BaseException) -> str:
    if not isinstance(exc, tomllib.TOMLDecodeError):
        huge = re.search(r"[0-9_]{4000,}", text)
        if huge is not None:
            line = text.count("\n", 0, huge.start()) + 1
            key = text[text.rfind("\n", 0, huge.start()) + 1 : huge.start()].split("=")[0]
            digits = huge.end() - huge.start()
            return f"line {line} ({key.strip()[:80]}): a number of {digits} digits"
        if isinstance(exc, RecursionError):
            return "nested too deeply"
    return str(exc)[:200]


def load_task(path: Path) -> Task:
    """Load and check one task directory; a `TaskError` names the file and the field."""
    path = _resolve(Path(os.path.abspath(path)))
    try:
        is_dir = path.is_dir()
    except OSError:
        is_dir = False
    if not is_dir:
        raise TaskError(f"{path}: not a task directory")
    _member(path, "task.toml", folder=False, required="")
    toml_path = path / "task.toml"
    text = _read_text(toml_path)
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:
        # TOMLDecodeError, and Python's own refusals: an integer of more than 4300 digits
        # (a ValueError that does not say where), nesting deeper than the recursion limit.
        raise TaskError(f"{toml_path}: invalid TOML: {_toml_problem(text, exc)}") from exc
    config = parse_task_config(raw, str(toml_path))
    _member(path, "instruction.md", folder=False, required="")
    instruction_path = path / "instruction.md"
    instruction = _read_text(instruction_path).strip()
    if not instruction:
        raise TaskError(f"{instruction_path}: empty")
    _member(path, "tests", folder=True, required=" (tests/test.sh is the verifier entry point)")
    _member(path, "tests/test.sh", folder=False, required=" (the verifier entry point)")
    _member(path, "environment", folder=True)
    if _member(path, "solution", folder=True):
        _member(path, "solution/solve.sh", folder=False)
    return Task(name=path.name, path=path, config=config, instruction=instruction)


def _looks_like_task(path: Path) -> bool:
    return any(_present(path / name) for name in ("task.toml", "instruction.md", "tests"))


def default_rows_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clotho" / "rows"


def _subfolders(folder: Path, root: Path, errors: list[tuple[Path, TaskError]]) -> list[Path]:
    """The folders to search under `folder` (resolved, sorted by name). A symlink is followed
    when it leads to a task, or to a folder inside `root`; a symlink loop, an unreadable
    entry and a link to a folder elsewhere are reported, never skipped silently."""
    try:
        with os.scandir(folder) as scan:
            entries = sorted(scan, key=lambda e: e.name)
    except OSError as exc:
        raise TaskError(f"{folder}: {_os_problem(exc)}") from exc
    found: list[Path] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        child = folder / entry.name
        try:
            if not entry.is_symlink():
                if entry.is_dir(follow_symlinks=False):
                    found.append(child)
                continue
            try:
                target = child.resolve(strict=True)
            except FileNotFoundError:
                continue  # a broken link is no folder: like any other file, not ours
            except (OSError, RuntimeError) as exc:
                raise TaskError(f"{child}: {_os_problem(exc)}") from exc
            if not target.is_dir():
                continue
            if target.is_relative_to(root) or _looks_like_task(target):
                found.append(target)
            else:
                raise TaskError(
                    f"{child}: a symlink to {target}, a folder outside {root}: not searched "
                    "(pass it on the command line to use the tasks in it)"
                )
        except TaskError as exc:
            errors.append((child, exc))
        except OSError as exc:
            errors.append((child, TaskError(f"{child}: {_os_problem(exc)}")))
    return found


def discover_tasks(
    paths: list[Path], rows_cache: Path | None = None
) -> tuple[list[Task], list[tuple[Path, TaskError]]]:
    """Tasks under `paths` (task directories, folders of them, or .jsonl/.json files of
    Terminal-Bench 2.0 rows), and the ones that failed. A broken task, an unreadable folder
    or a symlink loop is an error for that path only; the rest of the discovery goes on."""
    from clotho.tasks.rows import ROW_SUFFIXES, load_rows

    tasks: list[Task] = []
    errors: list[tuple[Path, TaskError]] = []
    seen: set[Path] = set()

    def search(top: Path) -> None:
        top = Path(os.path.abspath(top))
        try:
            if not _present(top):
                raise TaskError(f"{top}: no such task directory")
            root = _resolve(top)
            if not root.is_dir():
                raise TaskError(f"{top}: not a task directory")
        except TaskError as exc:
            errors.append((top, exc))
            return
        except OSError as exc:
            errors.append((top, TaskError(f"{top}: {_os_problem(exc)}")))
            return
        stack = [root]
        while stack:  # depth first, in name order; a stack, so no depth makes it recurse
            path = stack.pop()
            if path in seen:
                continue
            seen.add(path)
            try:
                if _looks_like_task(path):
                    tasks.append(load_task(path))
                    continue
                stack.extend(reversed(_subfolders(path, root, errors)))
            except TaskError as exc:
                errors.append((path, exc))
            except OSError as exc:
                errors.append((path, TaskError(f"{path}: {_os_problem(exc)}")))

    for p in paths:
        try:
            is_rows = p.suffix in ROW_SUFFIXES and p.is_file()
        except OSError:
            is_rows = False
        if is_rows:
            dirs, row_errors = load_rows(p, rows_cache or default_rows_cache())
            errors += row_errors
            for d in dirs:
                search(d)
        else:
            search(p)
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
