"""Where a dataset's records come from: a local file, or a Hugging Face dataset.

One model for every environment field that takes a dataset (`DatasetSource`), and the short
spelling a command line or a list of paths uses: a path, or `hf:NAME` with options after a
`?` (`hf:princeton-nlp/SWE-bench_Lite?split=test&limit=20`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clotho.errors import ConfigError, describe_validation_error

HUB_PREFIX = "hf:"
FILE_FORMATS: dict[str, str] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
FileFormat = Literal["jsonl", "json", "parquet"]


def _field_name(key: str) -> str:
    """Atropos spells a mapping `prompt_field: question`; here that is `prompt: question`."""
    return key.removesuffix("_field") if key.endswith("_field") and key != "_field" else key


class DatasetSource(BaseModel):
    """A dataset: exactly one of `path` (a .jsonl/.json/.parquet file) or `hub` (a Hugging
    Face dataset name, or a local folder `datasets.load_dataset` reads), and how to read it."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="a local .jsonl, .json or .parquet file")
    hub: str | None = Field(
        None, description="a Hugging Face dataset (owner/name) or a dataset folder (needs the "
        "`datasets` extra)",
    )  # fmt: skip
    split: str | None = Field(
        None, description="Hub only; default: the dataset's only split (an error if it has more)"
    )
    config: str | None = Field(None, description="Hub only: the subset (configuration) name")
    revision: str | None = Field(None, description="Hub only: a branch, tag or commit")
    streaming: bool = Field(
        False, description="Hub only: read rows as they arrive, nothing prepared on disk first"
    )
    cache_dir: str | None = Field(
        None, description="Hub only: the datasets cache (default: HF_DATASETS_CACHE)"
    )
    format: FileFormat | None = Field(None, description="file only; default: from the suffix")
    fields: dict[str, str] = Field(
        default_factory=dict,
        description="field name -> the column it is read from, e.g. {prompt: question} "
        "(Atropos' `prompt_field: question` is accepted too)",
    )
    limit: int | None = Field(None, ge=1, description="read at most this many records")
    batch_rows: int = Field(64, ge=1, le=65536, description="Parquet rows decoded at once")

    @field_validator("fields")
    @classmethod
    def _fields(cls, value: dict[str, str]) -> dict[str, str]:
        mapped: dict[str, str] = {}
        for key, column in value.items():
            name = _field_name(key)
            if not name or not column:
                raise ValueError(f"empty field name or column in {key!r}: {column!r}")
            if name in mapped:
                raise ValueError(f"field {name!r} is mapped twice")
            mapped[name] = column
        return mapped

    @model_validator(mode="after")
    def _one_place(self) -> DatasetSource:
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of `path` (a local file) or `hub` (a dataset)")
        if self.path is not None:
            hub_only = [n for n in ("split", "config", "revision", "cache_dir") if getattr(self, n)]
            if hub_only or self.streaming:
                raise ValueError(
                    f"{', '.join(hub_only) or 'streaming'}: only for a `hub` dataset "
                    "(a local file is always read record by record)"
                )
        elif self.format is not None:
            raise ValueError("format: only for a local file (`path`)")
        return self

    @classmethod
    def parse(cls, spec: str | Path | DatasetSource) -> DatasetSource:
        """A path, `hf:NAME[?key=value&...]`, or a source as it is. The query keys are this
        model's fields; any other key ending in `_field` maps a field (`prompt_field=q`)."""
        if isinstance(spec, DatasetSource):
            return spec
        text = str(spec)
        if not text.startswith(HUB_PREFIX):
            return cls(path=text)
        name, _, query = text.removeprefix(HUB_PREFIX).partition("?")
        data: dict[str, Any] = {"hub": name}
        fields: dict[str, str] = {}
        for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
            if key.startswith("fields."):
                fields[key.removeprefix("fields.")] = value
            elif key.endswith("_field"):
                fields[key] = value
            elif key in {"fields", "hub", "path", "format"} or key not in cls.model_fields:
                allowed = sorted({*cls.model_fields} - {"fields", "hub", "path", "format"})
                raise ConfigError(
                    f"{text}: unknown option {key!r} (options: {', '.join(allowed)}, "
                    "NAME_field=COLUMN or fields.NAME=COLUMN)"
                )
            else:
                data[key] = value
        if fields:
            data["fields"] = fields
        return cls.checked(data, text)

    @classmethod
    def checked(cls, data: Any, where: str) -> DatasetSource:
        """Validation errors as one `ConfigError` naming where the source was written."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"{where}: {describe_validation_error(exc)}") from exc

    @property
    def label(self) -> str:
        """How messages and record places name the source."""
        if self.path is not None:
            return self.path
        extra = f":{self.config}" if self.config else ""
        return f"{HUB_PREFIX}{self.hub}{extra}" + (f"@{self.split}" if self.split else "")

    @property
    def stem(self) -> str:
        """A short name (a file's stem, a dataset's last name part) for records' names."""
        if self.path is not None:
            return Path(self.path).stem
        return (self.hub or "").rstrip("/").rsplit("/", 1)[-1] or "dataset"

    def file_format(self) -> FileFormat | None:
        """The local file's format from `format` or its suffix (None: not one we read)."""
        if self.path is None:
            return None
        if self.format:
            return self.format
        return FILE_FORMATS.get(Path(self.path).suffix.lower())  # type: ignore[return-value]


def source_list(values: list[str | DatasetSource]) -> list[DatasetSource]:
    """Every entry of an environment's dataset list as a `DatasetSource`."""
    return [DatasetSource.parse(v) for v in values]
