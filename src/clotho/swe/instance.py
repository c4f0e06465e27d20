"""SWE-bench / SWE-smith instance records, read from JSONL, JSON, Parquet or a Hugging Face
dataset (`clotho.data`: a path, `hf:NAME?split=test`, or a `DatasetSource` with a field
mapping for differently named columns).

A record that cannot be used (invalid JSON, a missing field, a test list that is neither a
list nor a JSON string of one) is an error for that record alone, naming the instance and
the field; the other records of the file still load. Unknown fields are kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clotho.data import DatasetSource, Record, peek, read_records
from clotho.data.files import parquet_columns
from clotho.errors import TaskError, describe_validation_error
from clotho.swe.install_cache import InstallCacheOptions
from clotho.swe.specs import known_log_parser

INSTANCE_SUFFIXES = (".jsonl", ".json", ".parquet")


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
    install_cache: InstallCacheOptions = Field(
        default_factory=InstallCacheOptions,
        description="install_cmd runs once per (repo, commit, install_cmd, sandbox kind)",
    )
    specs_files: list[str] = Field(
        default_factory=list,
        description="repository spec files (JSON or YAML, as clotho/swe/specs/*.json) whose "
        "entries add to or replace the bundled SWE-bench and SWE-smith specs",
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
    test_cmd: str | None = Field(
        None,
        description="runs the tests: with {junit}, outcomes come from the JUnit XML it writes "
        "there; without, from its output, read by log_parser (SWE-bench style)",
    )
    log_parser: str | None = Field(None, description="a name in clotho.swe.log_parsers")
    hints_text: str | None = None
    version: str | None = None
    category: str | None = None

    # Where the record came from: relative repo paths are taken from its folder.
    source: Path | None = Field(None, exclude=True)

    _lists = field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")(_test_list)

    _log_parser = field_validator("log_parser")(known_log_parser)

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
    # A null in a column of a known field (Parquet tables hold the union of columns) is the
    # field left out: its default, or "Field required".
    known = {k: v for k, v in data.items() if v is not None or k not in SweInstance.model_fields}
    try:
        return SweInstance.model_validate({**known, "source": source})
    except ValidationError as exc:
        raise TaskError(f"{where}: {label}: {describe_validation_error(exc)}") from exc


def is_instance_file(path: Path) -> bool:
    """A .jsonl/.json file whose first readable record has `instance_id` and `base_commit`,
    or a .parquet file with those columns (read from its footer alone). Reading a .parquet
    file without pyarrow raises the `ConfigError` that names the extra."""
    if path.suffix.lower() not in INSTANCE_SUFFIXES or not path.is_file():
        return False
    if path.suffix.lower() == ".parquet":
        try:
            columns = set(parquet_columns(path, str(path)))
        except TaskError:
            return False  # not readable: discovery reports it as a rows file
        return {"instance_id", "base_commit"} <= columns
    first = peek(DatasetSource(path=str(path)))
    return isinstance(first, dict) and "instance_id" in first and "base_commit" in first


def instances_from_records(
    records: Iterable[Record], base: Path | None = None
) -> tuple[list[SweInstance], list[tuple[str, TaskError]]]:
    """The instances among `records` and, per bad record, (instance id or place, error).
    `base` is the folder relative repository paths are taken from."""
    instances: list[SweInstance] = []
    errors: list[tuple[str, TaskError]] = []
    seen: set[str] = set()
    for record in records:
        data = record.data
        name = data.get("instance_id") if isinstance(data, dict) else None
        key = name if isinstance(name, str) and name else record.where.rsplit("/", 1)[-1]
        if record.error is not None:
            errors.append((key, record.error))
            continue
        try:
            instance = parse_record(data, record.where, base)
        except TaskError as exc:
            errors.append((key, exc))
            continue
        if instance.instance_id in seen:
            where = record.where
            errors.append((key, TaskError(f"{where}: instance {key}: instance_id repeats")))
            continue
        seen.add(instance.instance_id)
        instances.append(instance)
    return instances, errors


def load_instances(
    source: Path | str | DatasetSource,
) -> tuple[list[SweInstance], list[tuple[str, TaskError]]]:
    """The instances of a file (.jsonl/.json/.parquet), a `hf:NAME` dataset or any
    `DatasetSource` (its `fields` map differently named columns), and, per bad record,
    (instance id or place, error). Blocking: async callers use `asyncio.to_thread`.
    A missing extra or an unreachable Hub raises `ConfigError`."""
    source = DatasetSource.parse(str(source) if isinstance(source, Path) else source)
    base = Path(source.path).resolve().parent if source.path is not None else None
    return instances_from_records(read_records(source), base)
