"""Repository specs: how the reference harnesses run a repository's tests, as data.

SWE-bench and SWE-smith records carry no test command: their harnesses keep, per repository
(and, for SWE-bench, per version), the test command, the commands run before it, the install
and the log parser that reads per-test outcomes from the console. The bundled files in
`specs/` hold those facts for SWE-bench's repositories and SWE-smith's Python profiles; a
run adds or replaces entries with files of its own (`SweOptions.specs_files`, same format).

A record with its own test command keeps it; a record without one whose repository has a
spec runs the spec's command and reads the log; any other record runs clotho's own runner.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from clotho.errors import ConfigError, describe_validation_error
from clotho.swe.log_parsers import get_parser

if TYPE_CHECKING:
    from clotho.swe.instance import SweInstance

BUNDLED = Path(__file__).with_name("specs")
# conda's environment, as both harnesses' images have it; nothing where there is none.
ACTIVATE = (
    "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate && "
    "conda activate testbed; fi"
)
# SWE-bench runs only the test files its test patch touches; these are no tests.
NON_TEST_EXTS = (
    ".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml",
)  # fmt: skip
Directives = Literal["test_patch", "test_patch_modules", "listed_files", "none"]


def known_log_parser(value: str | None) -> str | None:
    """A `log_parser` field's check: the name is one of `clotho.swe.log_parsers`."""
    if value is not None:
        try:
            get_parser(value)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    return value


class _Fields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    python: str | None = Field(None, description="the Python version the image has")
    install: str | None = Field(None, description="the repository's install command")
    pre_install: list[str] | None = Field(None, description="run before install (image build)")
    eval_commands: list[str] | None = Field(None, description="run before the tests")
    test_cmd: str | None = Field(None, description="the test command, before its arguments")
    log_parser: str | None = Field(None, description="a name in clotho.swe.log_parsers")

    _known = field_validator("log_parser")(known_log_parser)


class VersionSpec(_Fields):
    """What differs for some versions of a repository (SWE-bench's `version` field)."""

    versions: list[str] = Field(min_length=1)

    @field_validator("versions", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        return [str(v) for v in value] if isinstance(value, list) else value


class RepoSpec(_Fields):
    """One repository. `repo` is owner/name (SWE-smith: swesmith/owner__name.commit8); a
    name without a slash matches any repository whose last path part it is."""

    repo: str = Field(min_length=1)
    test_cmd: str | None = None
    directives: Directives | None = Field(
        None,
        description="the arguments after test_cmd: test_patch (its test files, SWE-bench), "
        "test_patch_modules (those files as dotted modules, Django), listed_files (the "
        "files of the listed tests), none (the whole suite, SWE-smith)",
    )
    eval_install: bool | None = Field(None, description="install again before the tests")
    activate: str | None = Field(None, description="shell run first (default: conda's)")
    image: str | None = Field(
        None,
        description="the instance image; {id_1776}, {id_lower}, {instance_id} are filled in",
    )
    build: str | None = Field(None, description="how to get a missing image ({image}, ...)")
    versions: list[VersionSpec] = Field(default_factory=list)


class SpecFile(BaseModel):
    """A file of repository specs; `defaults` fill what an entry leaves unset."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    about: str = ""
    defaults: RepoSpec | None = None
    repos: list[RepoSpec] = Field(default_factory=list)

    @field_validator("defaults", mode="before")
    @classmethod
    def _defaults(cls, value: Any) -> Any:
        return {"repo": "*", **value} if isinstance(value, dict) else value


@dataclass(frozen=True)
class ResolvedSpec:
    """A repository spec at one version, with every default applied."""

    repo: str
    version: str | None
    test_cmd: str
    log_parser: str
    directives: str
    eval_commands: tuple[str, ...]
    install: str | None
    eval_install: bool
    activate: str
    image: str | None
    build: str | None
    python: str | None

    def image_for(self, instance: SweInstance) -> str | None:
        return _fill(self.image, instance) if self.image else None

    def build_help(self, instance: SweInstance, image: str) -> str:
        return _fill(self.build, instance, image) if self.build else ""

    def arguments(self, instance: SweInstance) -> list[str]:
        """What follows test_cmd: the test files of the test patch (SWE-bench), as modules
        (Django), the files of the listed tests, or nothing (the whole suite)."""
        if self.directives == "none":
            return []
        if self.directives == "listed_files":
            files: list[str] = []
            for test in instance.FAIL_TO_PASS + instance.PASS_TO_PASS:
                path = test.split("::", 1)[0]
                if path.endswith(".py") and path not in files:
                    files.append(path)
            return files
        found = re.findall(r"diff --git a/.* b/(.*)", instance.test_patch)
        paths = [p for p in found if not p.endswith(NON_TEST_EXTS)]
        if self.directives == "test_patch_modules":
            paths = [p.removesuffix(".py").removeprefix("tests/").replace("/", ".") for p in paths]
        return paths


def _fill(template: str | None, instance: SweInstance, image: str = "") -> str:
    name = instance.repo.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    lower = instance.instance_id.lower()
    values = {
        "instance_id": instance.instance_id,
        "id_lower": lower,
        "id_1776": lower.replace("__", "_1776_"),
        "image": image,
        "repo": instance.repo,
        "repo_name": name,
    }
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), m.group(0)), template or "")


def _key(repo: str) -> str:
    repo = repo.strip().rstrip("/").removesuffix(".git").lower()
    for prefix in ("https://github.com/", "http://github.com/", "git@github.com:"):
        repo = repo.removeprefix(prefix)
    return repo


def read_spec_file(path: Path) -> SpecFile:
    """A JSON or YAML spec file, or a `ConfigError` naming the file and the field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the specs file: {exc}") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    try:
        return SpecFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {describe_validation_error(exc)}") from exc


class SpecRegistry:
    """Every known repository spec by repository (later files replace earlier entries)."""

    def __init__(self, files: Iterable[SpecFile] = ()) -> None:
        self._by_repo: dict[str, tuple[RepoSpec, RepoSpec | None]] = {}
        for spec_file in files:
            self.add(spec_file)

    def add(self, spec_file: SpecFile) -> None:
        for spec in spec_file.repos:
            self._by_repo[_key(spec.repo)] = (spec, spec_file.defaults)

    def __len__(self) -> int:
        return len(self._by_repo)

    def find(self, repo: str) -> tuple[RepoSpec, RepoSpec | None] | None:
        key = _key(repo)
        if key in self._by_repo:
            return self._by_repo[key]
        return self._by_repo.get(key.rsplit("/", 1)[-1]) if "/" in key else None

    def resolve(self, instance: SweInstance) -> ResolvedSpec | None:
        """The spec of the instance's repository at its version; None when there is none."""
        found = self.find(instance.repo)
        if found is None:
            return None
        spec, defaults = found
        version = next((v for v in spec.versions if instance.version in v.versions), None)
        layers = [x for x in (version, spec, defaults) if x is not None]

        def pick(field: str) -> Any:
            return next(
                (getattr(x, field) for x in layers if getattr(x, field, None) is not None), None
            )

        test_cmd = pick("test_cmd")
        if not test_cmd:
            raise ConfigError(f"the spec of {spec.repo} has no test_cmd")
        return ResolvedSpec(
            repo=spec.repo,
            version=instance.version,
            test_cmd=test_cmd,
            log_parser=pick("log_parser") or "pytest",
            directives=pick("directives") or "test_patch",
            eval_commands=tuple(pick("eval_commands") or ()),
            install=pick("install"),
            eval_install=bool(pick("eval_install")),
            activate=ACTIVATE if pick("activate") is None else pick("activate"),
            image=pick("image"),
            build=pick("build"),
            python=pick("python"),
        )


@functools.cache
def _bundled() -> tuple[SpecFile, ...]:
    return tuple(read_spec_file(p) for p in sorted(BUNDLED.glob("*.json")))


@functools.cache
def _registry(extra: tuple[str, ...]) -> SpecRegistry:
    files = [*_bundled(), *(read_spec_file(Path(p).expanduser()) for p in extra)]
    return SpecRegistry(files)


def registry(extra: Iterable[str] = ()) -> SpecRegistry:
    """The bundled specs plus `extra` files (read once per list of files in a process)."""
    return _registry(tuple(extra))


def missing_image_message(instance: SweInstance, image: str, spec: ResolvedSpec | None) -> str:
    """What to say when `image` is not on this machine: which image, and how to get it."""
    how = spec.build_help(instance, image) if spec is not None else ""
    how = how or (
        f"docker pull {image}, or build it and tag it {image}, or set image_name in the record"
    )
    return f"instance {instance.instance_id}: image {image} is not available here; {how}"
