"""SWE-bench / SWE-smith instance records, read from JSONL, JSON or a Hugging Face dataset.

A record that cannot be used (invalid JSON, a missing field, a test list that is neither a
list nor a JSON string of one) is an error for that record alone, naming the instance and
the field; the other records of the file still load. Unknown fields are kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clotho.errors import TaskError, describe_validation_error

INSTANCE_SUFFIXES = (".jsonl", ".json")


class SweOptions(BaseModel):
    """How SWE instances run: where repositories come from, where the workspace is, the
    reward and the caches. One per run (`EvalConfig.swe`, the `swe` environment)."""

    model_config = ConfigDict(extra="forbid")

    repos_dir: str | None = Field(
        None, description="folder of git mirrors for owner/name repos (owner__name[.git])"
    )
    testbed: str = Field("/testbed", description="where the repository is in the sandbox")
    reward: Literal["binary", "shaped"] = Field(
        "binary",
        description="binary: 1 only when every FAIL_TO_PASS and PASS_TO_PASS test passes; "
        "shaped: the fraction of FAIL_TO_PASS fixed, 0 if any PASS_TO_PASS broke",
    )
    cache_dir: str | None = Field(None, description="default: ~/.cache/clotho/swe")
    install_timeout_s: float = Field(600.0, gt=0)
    test_timeout_s: float = Field(600.0, gt=0)
    agent_timeout_s: float = Field(1800.0, gt=0)
    network_clone: bool = Field(
        True, description="clone owner/name from GitHub when no mirror has it"
    )

    def cache_path(self) -> Path:
        return Path(self.cache_dir or Path.home() / ".cache" / "clotho" / "swe").expanduser()


def _test_list(value: Any) -> Any:
    """SWE-bench stores the lists as JSON strings; SWE-smith as lists."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except ValueError as exc:
            raise ValueError(f"not a JSON list of test ids: {exc}") from exc
    return value


class SweInstance(BaseModel):
    """One SWE-bench / SWE-smith record. `repo` is a local path, a file:// URL or owner/name."""

    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(min_length=1)
    repo: str = Field(min_length=1)
    base_commit: str = Field(min_length=4)
    problem_statement: str
    patch: str = Field("", description="the gold fix (the oracle applies it)")
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    image_name: str | None = None
    image: str | None = None
    install_cmd: str | None = None
    test_cmd: str | None = None
    hints_text: str | None = None
    version: str | None = None
    category: str | None = None

    # Where the record came from: relative repo paths are taken from its folder.
    source: Path | None = Field(None, exclude=True)

    _lists = field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")(_test_list)

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value

    @property
    def docker_image(self) -> str | None:
        return self.image_name or self.image

    @property
    def repo_category(self) -> str:
        return self.category or self.repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")


def parse_record(data: Any, where: str, source: Path | None = None) -> SweInstance:
    """One record, or a `TaskError` naming the instance and the field."""
    if not isinstance(data, dict):
        raise TaskError(f"{where}: expected an object, got {type(data).__name__}")
    name = data.get("instance_id")
    label = f"instance {name}" if isinstance(name, str) and name else "an instance"
    try:
        return SweInstance.model_validate({**data, "source": source})
    except ValidationError as exc:
        raise TaskError(f"{where}: {label}: {describe_validation_error(exc)}") from exc


def _records(path: Path) -> list[tuple[str, Any]]:
    """(where, record) pairs; an unreadable line is an error record of its own."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".jsonl":
        found: list[tuple[str, Any]] = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append((f"{path}:{number}", json.loads(line)))
            except ValueError as exc:
                found.append(
                    (f"{path}:{number}", TaskError(f"{path}:{number}: invalid JSON: {exc}"))
                )
        return found
    data = json.loads(text)
    if isinstance(data, dict) and isinstance(data.get("instances"), list):
        data = data["instances"]
    items = data if isinstance(data, list) else [data]
    return [(f"{path}[{i}]", item) for i, item in enumerate(items)]


def is_instance_file(path: Path) -> bool:
    """A .jsonl/.json file whose first record has `instance_id` and `base_commit`."""
    if path.suffix not in INSTANCE_SUFFIXES or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            if path.suffix == ".jsonl":
                for line in handle:
                    if line.strip():
                        first = json.loads(line)
                        break
                else:
                    return False
            else:
                data = json.loads(handle.read())
                if isinstance(data, dict) and isinstance(data.get("instances"), list):
                    data = data["instances"]
                first = data[0] if isinstance(data, list) and data else data
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and "instance_id" in first and "base_commit" in first


def load_instances(path: Path) -> tuple[list[SweInstance], list[tuple[str, TaskError]]]:
    """The file's instances and, per bad record, (instance id or place, error)."""
    instances: list[SweInstance] = []
    errors: list[tuple[str, TaskError]] = []
    try:
        records = _records(path)
    except (OSError, ValueError) as exc:
        return [], [(path.name, TaskError(f"{path}: cannot read instances: {exc}"))]
    seen: set[str] = set()
    for where, data in records:
        name = data.get("instance_id") if isinstance(data, dict) else None
        key = name if isinstance(name, str) and name else where.rsplit("/", 1)[-1]
        if isinstance(data, TaskError):
            errors.append((key, data))
            continue
        try:
            instance = parse_record(data, where, path.resolve().parent)
        except TaskError as exc:
            errors.append((key, exc))
            continue
        if instance.instance_id in seen:
            errors.append((key, TaskError(f"{where}: instance {key}: instance_id repeats")))
            continue
        seen.add(instance.instance_id)
        instances.append(instance)
    return instances, errors


def load_hf_dataset(name: str, split: str = "test") -> list[SweInstance]:
    """A Hugging Face dataset of instances (needs `datasets` and a reachable Hub)."""
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise TaskError(f"{name}: reading a Hub dataset needs `pip install datasets`") from exc
    rows = datasets.load_dataset(name, split=split)
    return [parse_record(dict(row), f"{name}[{i}]") for i, row in enumerate(rows)]
