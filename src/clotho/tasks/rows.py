"""Terminal-Bench 2.0 dataset rows, turned into task directories.

Rows as published on dataset hubs carry `task_name`, `category`, `instruction`,
`docker_image`, `environment_tar` and `tests_tar` (base64 tar.gz archives) and `test_sh`.
A `.jsonl` or `.json` file of such rows is unpacked once into a cache folder (keyed by a
hash of the row), and from there on the rows are ordinary Harbor task directories.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import shutil
import tarfile
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from clotho.errors import TaskError

ROW_SUFFIXES = (".jsonl", ".json")


class TB2Row(BaseModel):
    task_name: str
    instruction: str
    category: str = "uncategorized"
    docker_image: str | None = None
    environment_tar: str | None = None
    tests_tar: str | None = None
    test_sh: str | None = None
    difficulty: str | None = None


def _rows(path: Path) -> list[tuple[int, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise TaskError(f"{path}: expected a JSON list of rows")
        return list(enumerate(data, start=1))
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                rows.append((number, TaskError(f"{path}:{number}: not valid JSON: {exc}")))
    return rows


def _extract(b64: str, target: Path, where: str) -> None:
    try:
        raw = base64.b64decode(b64, validate=True)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            tar.extractall(target, filter="data")
    except (binascii.Error, tarfile.TarError, ValueError, OSError) as exc:
        raise TaskError(f"{where}: not a base64 tar archive: {exc}") from exc


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def materialize(row: TB2Row, root: Path, where: str) -> Path:
    """Write the row as a task directory under `root` (once: the folder name is a hash)."""
    digest = hashlib.sha256(row.model_dump_json().encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", row.task_name).strip("-") or "task"
    task_dir = root / digest / slug
    if (task_dir / "task.toml").is_file():
        return task_dir
    tmp = root / digest / f".{slug}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "environment").mkdir(parents=True)
    (tmp / "tests").mkdir()
    lines = ['version = "1.0"', "[metadata]", f"category = {_toml_string(row.category)}"]
    if row.difficulty:
        lines.append(f"difficulty = {_toml_string(row.difficulty)}")
    if row.docker_image:
        lines += ["[environment]", f"docker_image = {_toml_string(row.docker_image)}"]
    toml = "\n".join(lines) + "\n"
    tomllib.loads(toml)  # what we write must read back
    (tmp / "task.toml").write_text(toml)
    (tmp / "instruction.md").write_text(row.instruction)
    if row.environment_tar:
        _extract(row.environment_tar, tmp / "environment", f"{where} [environment_tar]")
    if row.tests_tar:
        _extract(row.tests_tar, tmp / "tests", f"{where} [tests_tar]")
    if row.test_sh:
        (tmp / "tests" / "test.sh").write_text(row.test_sh)
    tmp.rename(task_dir)
    return task_dir


def load_rows(path: Path, cache: Path) -> tuple[list[Path], list[tuple[Path, TaskError]]]:
    """Task directories for the rows of `path`, and the rows that could not be used."""
    dirs: list[Path] = []
    errors: list[tuple[Path, TaskError]] = []
    try:
        rows = _rows(path)
    except (OSError, json.JSONDecodeError, TaskError) as exc:
        error = exc if isinstance(exc, TaskError) else TaskError(f"{path}: {exc}")
        return [], [(path, error)]
    for number, data in rows:
        where = f"{path}:{number}"
        if isinstance(data, TaskError):
            errors.append((Path(f"{path.stem}-row{number}"), data))
            continue
        try:
            row = TB2Row.model_validate(data)
            dirs.append(materialize(row, cache, where))
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            errors.append((Path(f"{path.stem}-row{number}"), TaskError(f"{where}: {fields}")))
        except TaskError as exc:
            errors.append((Path(f"{path.stem}-row{number}"), exc))
    return dirs, errors
