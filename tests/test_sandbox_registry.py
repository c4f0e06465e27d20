"""Backends register through their config (sandbox/config.py): a kind defined and registered
here, by this test alone, is read as a `SandboxConfig`, opened by `make_backend` and
`open_sandbox`, and offered and run by the CLI, with no other file edited.

`RegistryDoubleConfig` is a test double of a backend: its sandboxes are real bubblewrap
sandboxes (the local backend's), opened by a backend class of its own that counts them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar, Literal

import pytest
from pydantic import TypeAdapter, ValidationError
from tests.sandbox_fixtures import requires_bwrap
from typer.testing import CliRunner

from clotho.cli.main import app
from clotho.runs.records import EvalConfig
from clotho.sandbox import SandboxConfig, open_sandbox
from clotho.sandbox.backends import OpenRequest, SandboxBackend, backend_key, make_backend
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import (
    DockerSandboxConfig,
    LocalSandboxConfig,
    SandboxConfigBase,
    config_type,
    register,
    sandbox_kinds,
    unregister,
)
from clotho.sandbox.host.leases import SandboxRecord
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.sandbox.remote_config import RaySandboxConfig
from clotho.swe.install_cache import CONTAINER_ROOTS, LOCAL_ROOTS, install_roots, sandbox_kind

KIND = "registry-double"
TASKS = Path(__file__).resolve().parents[1] / "examples" / "tasks"


class RegistryDoubleConfig(SandboxConfigBase):
    """A test double of a backend's config: the only thing a new backend declares."""

    backend: Literal["registry-double"] = "registry-double"
    backend_class: ClassVar[str] = f"{__name__}:RegistryDoubleBackend"
    workdir: str = "/app"
    state_dir: str | None = None

    @classmethod
    def listing(cls, state_dir: str | None) -> SandboxConfigBase | None:
        return None  # its folders are bubblewrap's: the local backend lists them


class RegistryDoubleBackend(SandboxBackend[RegistryDoubleConfig]):
    """A test double of a backend: bubblewrap sandboxes, each open counted."""

    kind = KIND
    config_type = RegistryDoubleConfig
    opened: ClassVar[list[str]] = []  # the places (state folders) it opened sandboxes in

    def __init__(self, config: RegistryDoubleConfig) -> None:
        self.state_dir = config.state_dir

    async def _open(self, request: OpenRequest[RegistryDoubleConfig]) -> Sandbox:
        local = LocalSandboxConfig(
            state_dir=request.config.state_dir, workdir=request.config.workdir
        )
        sandbox = await BwrapSandbox.create(local, request.labels)
        RegistryDoubleBackend.opened.append(str(request.config.state_dir))
        return sandbox

    async def records(self) -> list[SandboxRecord]:
        return []

    async def remove(self, record: SandboxRecord) -> None:
        return None


@pytest.fixture
def double() -> Iterator[type[RegistryDoubleConfig]]:
    """The double registered for one test, and forgotten after it."""
    register(RegistryDoubleConfig)
    RegistryDoubleBackend.opened.clear()
    try:
        yield RegistryDoubleConfig
    finally:
        unregister(KIND)


def test_builtin_kinds_and_their_facts() -> None:
    # ssh registers with the contract (backends.py), after the cluster kinds.
    assert sandbox_kinds() == ("local", "unsafe-local", "docker", "ray", "modal", "nomad", "ssh")
    assert sandbox_kinds(place="host") == ("local", "unsafe-local", "docker", "ssh")
    assert sandbox_kinds(place="host", isolated=True) == ("local", "docker", "ssh")
    assert config_type("docker") is DockerSandboxConfig
    with pytest.raises(KeyError):
        config_type(KIND)


def test_config_union_reads_a_kind_registered_after_it_was_built(
    double: type[RegistryDoubleConfig],
) -> None:
    adapter = TypeAdapter(SandboxConfig)
    config = adapter.validate_python({"backend": KIND, "state_dir": "/somewhere"})
    assert isinstance(config, RegistryDoubleConfig)
    assert adapter.dump_python(config)["backend"] == KIND
    ray = adapter.validate_python({"backend": "ray", "inner": {"backend": KIND}})
    assert isinstance(ray, RaySandboxConfig) and isinstance(ray.inner, RegistryDoubleConfig)
    unregister(KIND)
    with pytest.raises(ValidationError, match=f"Input tag '{KIND}'.*'local', 'unsafe-local'"):
        adapter.validate_python({"backend": KIND})


def test_json_schema_lists_the_kinds_registered_when_asked(
    double: type[RegistryDoubleConfig],
) -> None:
    schema = TypeAdapter(SandboxConfig).json_schema()
    kinds = sandbox_kinds()
    assert KIND in kinds
    mapping = schema["discriminator"]["mapping"]
    assert schema["discriminator"]["propertyName"] == "backend"
    assert set(mapping) == set(kinds)
    assert {ref["$ref"] for ref in schema["oneOf"]} == set(mapping.values())
    for kind, ref in mapping.items():
        model = schema["$defs"][ref.rsplit("/", 1)[1]]
        assert model["properties"]["backend"]["const"] == kind
    inner = schema["$defs"]["RaySandboxConfig"]["properties"]["inner"]
    assert set(inner["discriminator"]["mapping"]) == set(sandbox_kinds(place="host"))
    assert "ray" not in inner["discriminator"]["mapping"]
    # A model holding one (the run's config, written to config.json) has its schema too.
    for mode in ("validation", "serialization"):
        run = EvalConfig.model_json_schema(mode=mode)
        assert run["properties"]["sandbox"]["discriminator"]["propertyName"] == "backend"
        assert "DockerSandboxConfig" in run["$defs"]
    unregister(KIND)
    assert KIND not in TypeAdapter(SandboxConfig).json_schema()["discriminator"]["mapping"]


def test_a_kind_is_one_backend_literal_and_one_class() -> None:
    class Unnamed(SandboxConfigBase):
        backend: str = "unnamed"
        backend_class: ClassVar[str] = "nowhere:Nothing"

    with pytest.raises(TypeError, match="Literal"):
        register(Unnamed)

    class SecondDocker(SandboxConfigBase):
        backend: Literal["docker"] = "docker"
        backend_class: ClassVar[str] = "nowhere:Nothing"

    with pytest.raises(TypeError, match="already DockerSandboxConfig"):
        register(SecondDocker)
    assert config_type("docker") is DockerSandboxConfig


@requires_bwrap
async def test_registered_double_opens_through_make_backend_and_open_sandbox(
    double: type[RegistryDoubleConfig], tmp_path: Path
) -> None:
    config = double(state_dir=str(tmp_path))
    backend = make_backend(config)
    assert isinstance(backend, RegistryDoubleBackend)
    assert backend_key(config) == f"{KIND} {tmp_path}"
    sandbox = await open_sandbox(config, {"clotho.task": "registry"})
    try:
        result = await sandbox.exec("echo made by $0", timeout=30)
        assert result.exit_code == 0 and result.stdout.startswith("made by")
    finally:
        await sandbox.close()
    assert RegistryDoubleBackend.opened == [str(tmp_path)]
    unregister(KIND)
    with pytest.raises(TypeError, match="unknown sandbox config"):
        make_backend(config)


@requires_bwrap
def test_cli_offers_and_runs_a_registered_double(double: type[RegistryDoubleConfig]) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["check", "--help"], env={"COLUMNS": "200"})
    assert f"local|unsafe-local|docker|ssh|{KIND}" in shown.output
    task = TASKS / "fix-roman-numerals"
    checked = runner.invoke(app, ["check", str(task), "--sandbox", KIND, "--concurrency", "1"])
    assert checked.exit_code == 0, checked.output
    assert len(RegistryDoubleBackend.opened) >= 2  # the reference solution's and no agent's
    unregister(KIND)
    refused = runner.invoke(app, ["check", str(task), "--sandbox", KIND])
    assert refused.exit_code != 0 and f"'{KIND}' is not one of" in refused.output


def test_install_cache_reads_the_configs_facts() -> None:
    """The cache key of an install stays what it was before configs stated their facts."""
    docker = SimpleNamespace(config=DockerSandboxConfig(image="img", slots_per_container=4))
    local = SimpleNamespace(config=LocalSandboxConfig(root="ro"))
    ray = SimpleNamespace(config=RaySandboxConfig(inner=DockerSandboxConfig()))
    facts = {"backend": "docker", "image": "img", "root": None, "slots": True, "inner": None}
    assert sandbox_kind(docker) == json.dumps(facts, sort_keys=True)  # type: ignore[arg-type]
    assert json.loads(sandbox_kind(local))["root"] == "ro"  # type: ignore[arg-type]
    assert json.loads(sandbox_kind(ray))["inner"] == "docker"  # type: ignore[arg-type]
    assert install_roots(docker) == CONTAINER_ROOTS  # type: ignore[arg-type]
    assert install_roots(ray) == CONTAINER_ROOTS  # type: ignore[arg-type]
    assert install_roots(local) == LOCAL_ROOTS  # type: ignore[arg-type]
    assert sandbox_kind(SimpleNamespace()).startswith("unknown:")  # type: ignore[arg-type]
