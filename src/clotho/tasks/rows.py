"""Terminal-Bench 2.0 dataset rows, turned into task directories.

Rows as published on dataset hubs carry `task_name`, `category`, `instruction`,
`docker_image`, `environment_tar` and `tests_tar` (base64 tar.gz archives) and `test_sh`.
A `.jsonl`, `.json` or `.parquet` file of such rows, or a Hugging Face dataset of them
(`hf:NAME`, read by `clotho.data`), is unpacked once into a cache folder (keyed by a hash of
the row), and from there on the rows are ordinary Harbor task directories.

A row that cannot be used (invalid JSON or UTF-8, invalid base64, a tar member that would
land outside its folder, a link pointing out, an archive bigger than the caps below) is an
error for that row only: the other rows of the file still load.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import lzma
import re
import shutil
import tarfile
import tempfile
import tomllib
import zlib
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ValidationError, field_validator

from clotho.data import DatasetSource, Record, read_records
from clotho.errors import TaskError, describe_validation_error

ROW_SUFFIXES = (".jsonl", ".json", ".parquet")

# Caps on what one archive of a row may unpack to (the sizes its tar headers declare,
# checked before anything is written).
MAX_MEMBER_BYTES = 1024**3
MAX_ARCHIVE_BYTES = 4 * 1024**3
MAX_MEMBERS = 100_000
# Longest task folder name made from a row's task_name.
MAX_SLUG = 100


class TB2Row(BaseModel):
    task_name: str
    instruction: str
    category: str = "uncategorized"
    docker_image: str | None = None
    environment_tar: str | None = None
    tests_tar: str | None = None
    test_sh: str | None = None
    difficulty: str | None = None

    @field_validator("*")
    @classmethod
    def _utf8(cls, value: str | None) -> str | None:
        # JSON can spell a lone surrogate (backslash-ud800); no UTF-8 file can hold one.
        if value is not None:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError(f"a lone surrogate at {exc.start} has no UTF-8 form") from None
        return value


def _extract(b64: str, target: Path, where: str) -> None:
    """Unpack a base64 tar archive into `target`; every member must stay inside it."""
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TaskError(f"{where}: not valid base64: {exc}") from exc
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
            members: list[tarfile.TarInfo] = []
            total = 0
            for member in tar:  # headers one by one: a bomb is refused before it is read
                if len(members) == MAX_MEMBERS:
                    raise TaskError(f"{where}: more than {MAX_MEMBERS} members")
                if member.size > MAX_MEMBER_BYTES:
                    raise TaskError(
                        f"{where}: member {member.name[:200]!r} is {member.size} bytes "
                        f"(the cap is {MAX_MEMBER_BYTES})"
                    )
                if member.name.startswith("/"):
                    # The "data" filter would strip the slash and unpack it elsewhere than
                    # its author meant: refused, like any name that leaves the folder.
                    raise TaskError(
                        f"{where}: unsafe archive member: {member.name[:200]!r} is absolute"
                    )
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    raise TaskError(f"{where}: unpacks to more than {MAX_ARCHIVE_BYTES} bytes")
                members.append(member)
            # The "data" filter refuses absolute names, `..`, links (soft or hard) that point
            # outside `target`, and device files; its refusal is a FilterError (a TarError).
            tar.extractall(target, members=members, filter="data")
    except tarfile.FilterError as exc:
        raise TaskError(f"{where}: unsafe archive member: {exc}") from exc
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, ValueError, OSError) as exc:
        # Not a tar archive, or a compressed stream that is cut short or corrupt.
        raise TaskError(f"{where}: not a usable tar archive: {exc}") from exc


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def _slug(task_name: str) -> str:
    """A folder name for the task: no separators, no leading dot (no `.` or `..`)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", task_name)[:MAX_SLUG].strip("-.")
    return slug or "task"


def materialize(row: TB2Row, root: Path, where: str) -> Path:
    """Write the row as a task directory under `root` (once: the folder name is a hash)."""
    digest = hashlib.sha256(row.model_dump_json().encode()).hexdigest()[:16]
    slug = _slug(row.task_name)
    task_dir = root / digest / slug
    if (task_dir / "task.toml").is_file():
        return task_dir
    lines = ['version = "1.0"', "[metadata]", f"category = {_toml_string(row.category)}"]
    if row.difficulty:
        lines.append(f"difficulty = {_toml_string(row.difficulty)}")
    if row.docker_image:
        lines += ["[environment]", f"docker_image = {_toml_string(row.docker_image)}"]
    toml = "\n".join(lines) + "\n"
    try:
        tomllib.loads(toml)  # what we write must read back
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{where}: category, difficulty or docker_image: {exc}") from exc
    (root / digest).mkdir(parents=True, exist_ok=True)
    # A folder of our own (two processes may unpack the same row), renamed into place.
    tmp = Path(tempfile.mkdtemp(prefix=f".{slug}.", dir=root / digest))
    try:
        (tmp / "environment").mkdir()
        (tmp / "tests").mkdir()
        (tmp / "task.toml").write_text(toml, encoding="utf-8")
        (tmp / "instruction.md").write_text(row.instruction, encoding="utf-8")
        if row.environment_tar:
            _extract(row.environment_tar, tmp / "environment", f"{where} [environment_tar]")
        if row.tests_tar:
            _extract(row.tests_tar, tmp / "tests", f"{where} [tests_tar]")
        if row.test_sh:
            test_sh = tmp / "tests" / "test.sh"
            if test_sh.is_dir() and not test_sh.is_symlink():
                raise TaskError(f"{where} [tests_tar]: test.sh is a folder")
            test_sh.unlink(missing_ok=True)  # test_sh wins, and is never written through a link
            test_sh.write_text(row.test_sh, encoding="utf-8")
        try:
            tmp.rename(task_dir)
        except OSError:
            if not (task_dir / "task.toml").is_file():  # not another process's copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return task_dir


def rows_from_records(
    records: Iterable[Record], cache: Path, stem: str, label: str
) -> tuple[list[Path], list[tuple[Path, TaskError]]]:
    """Task directories for the rows among `records`, and the rows that could not be used
    (named `{stem}-row{number}`; a source that could not be read at all is named `label`)."""
    dirs: list[Path] = []
    errors: list[tuple[Path, TaskError]] = []
    for record in records:
        where = record.where
        name = Path(f"{stem}-row{record.number}")
        if record.error is not None:
            errors.append((Path(label) if record.whole_source else name, record.error))
            continue
        data = record.data
        if isinstance(data, dict):  # a null (a Parquet column other rows fill) is left out
            data = {k: v for k, v in data.items() if v is not None}
        try:
            row = TB2Row.model_validate(data)
            dirs.append(materialize(row, cache, where))
        except ValidationError as exc:
            errors.append((name, TaskError(f"{where}: {describe_validation_error(exc)}")))
        except TaskError as exc:
            errors.append((name, exc))
        except (OSError, ValueError) as exc:
            # A full or read-only cache, a name the file system refuses.
            errors.append((name, TaskError(f"{where}: cannot be unpacked: {exc}")))
    return dirs, errors


def load_rows(
    source: Path | str | DatasetSource, cache: Path
) -> tuple[list[Path], list[tuple[Path, TaskError]]]:
    """Task directories for the rows of a .jsonl/.json/.parquet file, a `hf:NAME` dataset or
    any `DatasetSource` (its `fields` map differently named columns), and the rows that could
    not be used. Blocking. A missing extra or an unreachable Hub raises `ConfigError`."""
    source = DatasetSource.parse(str(source) if isinstance(source, Path) else source)
    return rows_from_records(read_records(source), cache, source.stem, source.label)
