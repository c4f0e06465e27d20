"""Backends register through their config (sandbox/config.py): a kind defined and registered
here, by this test alone, is read as a `SandboxConfig`, opened by `make_backend` and
`open_sandbox`, and offered and run by the CLI, with no other file edited. An installed kind
registers by an entry point (`clotho.sandbox_kinds`), read the first time kinds are listed:
no module imports a backend's to make it known.

`RegistryDoubleConfig` is a test double of a backend: its sandboxes are real bubblewrap
sandboxes (the local backend's), opened by a backend class of its own that counts them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import pytest
from pydantic import TypeAdapter, ValidationError
from tests.sandbox_fixtures import requires_bwrap
from typer.testing import CliRunner

from clotho.cli.main import app
from clotho.runs.records import EvalConfig
from clotho.sandbox import LocalSandboxConfig, SandboxConfig, open_sandbox
from clotho.sandbox.backends import OpenRequest, SandboxBackend, backend_key, make_backend
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import (
    ENTRY_POINT_GROUP,
    DockerSandboxConfig,
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
    # Installed kinds by name (their entry points), whichever module was imported first.
    assert sandbox_kinds() == ("docker", "local", "modal", "nomad", "ray", "ssh", "unsafe-local")
    assert sandbox_kinds(place="host") == ("docker", "local", "ssh", "unsafe-local")
    assert sandbox_kinds(place="host", isolated=True) == ("docker", "local", "ssh")
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
    with pytest.raises(ValidationError, match=f"Input tag '{KIND}'.*'docker', 'local'"):
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
    assert f"docker|local|ssh|unsafe-local|{KIND}" in shown.output
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


@requires_bwrap
async def test_a_backend_defined_here_is_one_registration_away(tmp_path: Path) -> None:
    """A config class and a backend class in this module, and one `register` call: the kind
    is listed, read by the `SandboxConfig` union (a Ray node's inner one too) and opened by
    `make_backend`; before that call none of them knows it."""
    adapter = TypeAdapter(SandboxConfig)
    raw = {"backend": KIND, "state_dir": str(tmp_path)}
    assert KIND not in sandbox_kinds()
    with pytest.raises(ValidationError, match=f"Input tag '{KIND}'"):
        adapter.validate_python(raw)
    register(RegistryDoubleConfig)  # the one registration
    RegistryDoubleBackend.opened.clear()
    try:
        assert KIND in sandbox_kinds(place="host", isolated=True)
        config = adapter.validate_python(raw)
        assert type(config) is RegistryDoubleConfig
        ray = adapter.validate_python({"backend": "ray", "inner": raw})
        assert isinstance(ray, RaySandboxConfig) and ray.inner == config
        backend = make_backend(config)
        assert isinstance(backend, RegistryDoubleBackend)
        sandbox = await backend.open(config, {"clotho.task": "registry"})
        try:
            assert (await sandbox.exec("echo opened", timeout=30)).stdout == "opened\n"
        finally:
            await sandbox.close()
            await backend.aclose()
        assert RegistryDoubleBackend.opened == [str(tmp_path)]
    finally:
        unregister(KIND)


def _fresh_python(code: str, *, path: Path | None = None) -> dict[str, Any]:
    """What `code`, run in a new interpreter (nothing of this process imported), prints as
    JSON; `path` is put first on its import path (a package installed there)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), *filter(None, [env.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,  # a hang bound, not a measure
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# The modules of the installed kinds beyond the package's own (`local/config.py`, which
# `clotho.sandbox` exports), and the SDKs their backends need.
PLUGIN_MODULES = ("clotho.sandbox.ssh", "clotho.sandbox.remote_config", "clotho.sandbox.ray")
SDKS = ("asyncssh", "ray", "modal", "aiodocker")


def test_installed_kinds_are_found_without_importing_their_modules() -> None:
    """Only the registry is imported; listing the kinds loads the entry points, which import
    each kind's config module and no SDK."""
    seen = _fresh_python(
        f"""
        import json, sys
        from clotho.sandbox.config import config_type, sandbox_kinds

        loaded = lambda names: sorted(m for m in sys.modules if m.startswith(names))
        before = loaded({PLUGIN_MODULES!r})
        kinds = sandbox_kinds()
        modules = {{kind: config_type(kind).__module__ for kind in kinds}}
        sdks = sorted(m for m in {SDKS!r} if m in sys.modules)
        print(json.dumps({{"before": before, "kinds": kinds, "modules": modules, "sdks": sdks}}))
        """
    )
    assert seen["before"] == []
    assert {"ssh", "ray", "modal", "nomad", "local", "unsafe-local", "docker"} <= set(seen["kinds"])
    assert seen["modules"]["ssh"] == "clotho.sandbox.ssh.config"
    assert seen["modules"]["ray"] == seen["modules"]["nomad"] == "clotho.sandbox.remote_config"
    assert seen["modules"]["local"] == "clotho.sandbox.local.config"
    assert seen["sdks"] == []


def test_a_config_is_read_first_and_without_its_sdk() -> None:
    """Validating a config is enough to load the kinds (no listing first), and a kind whose
    SDK cannot be imported is still read: what is missing is said by `missing_extra`."""
    seen = _fresh_python(
        f"""
        import json, sys
        sys.modules.update(dict.fromkeys({SDKS!r}))  # None: importing any of them raises
        from pydantic import TypeAdapter
        from clotho.sandbox.backends import missing_extra
        from clotho.sandbox.config import SandboxConfig

        adapter = TypeAdapter(SandboxConfig)
        ssh = adapter.validate_python({{"backend": "ssh", "host": "example"}})
        ray = adapter.validate_python({{"backend": "ray", "inner": {{"backend": "docker"}}}})
        nomad = adapter.validate_python({{"backend": "nomad"}})
        print(json.dumps({{
            "types": [type(c).__name__ for c in (ssh, ray, ray.inner, nomad)],
            "default_inner": type(adapter.validate_python({{"backend": "ray"}}).inner).__name__,
            "missing": [missing_extra(c) for c in (ssh, ray)],
        }}))
        """
    )
    assert seen["types"] == [
        "SshSandboxConfig",
        "RaySandboxConfig",
        "DockerSandboxConfig",
        "NomadSandboxConfig",
    ]
    assert seen["default_inner"] == "LocalSandboxConfig"
    assert "pip install 'clotho-rl[ssh]'" in seen["missing"][0]
    assert "pip install 'clotho-rl[ray]'" in seen["missing"][1]


def _install(site: Path, dist: str, entry: str, module: str | None = None) -> None:
    """A distribution `dist` on the import path `site`: its entry point `entry` in the sandbox
    kinds' group and, when given, its module `dist`.py."""
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry}\n")
    if module is not None:
        (site / f"{dist}.py").write_text(textwrap.dedent(module))


THIRD_KIND = """
    from typing import ClassVar, Literal

    from clotho.sandbox.backends import SandboxBackend
    from clotho.sandbox.config import SandboxConfigBase


    class ThirdConfig(SandboxConfigBase):
        backend: Literal["third"] = "third"
        backend_class: ClassVar[str] = "thirdkind:ThirdBackend"
        workdir: str = "/app"
        state_dir: str | None = None


    class ThirdBackend(SandboxBackend[ThirdConfig]):
        kind = "third"
        config_type = ThirdConfig

        def __init__(self, config: ThirdConfig) -> None:
            self.config = config

        async def records(self):
            return []

        async def remove(self, record):
            return None
"""


def test_another_package_registers_a_kind_by_its_entry_point(tmp_path: Path) -> None:
    """A kind of a package that is not clotho's: its entry point alone makes it a kind,
    read by the union and opened by `make_backend`; a broken one is a `ConfigError` that
    names it, never a kind silently missing."""
    good, broken = tmp_path / "good", tmp_path / "broken"
    _install(good, "thirdkind", "third = thirdkind:ThirdConfig", THIRD_KIND)
    seen = _fresh_python(
        """
        import json
        from pydantic import TypeAdapter
        from clotho.sandbox.backends import make_backend
        from clotho.sandbox.config import SandboxConfig, sandbox_kinds

        config = TypeAdapter(SandboxConfig).validate_python({"backend": "third"})
        backend = make_backend(config)
        print(json.dumps({"kinds": sandbox_kinds(place="host"),
                          "config": type(config).__module__ + ":" + type(config).__name__,
                          "backend": type(backend).__module__ + ":" + type(backend).__name__}))
        """,
        path=good,
    )
    assert seen["kinds"] == ["docker", "local", "ssh", "third", "unsafe-local"]
    assert seen["config"] == "thirdkind:ThirdConfig"
    assert seen["backend"] == "thirdkind:ThirdBackend"

    _install(broken, "brokenkind", "broken = brokenkind_gone:Nothing")
    failed = _fresh_python(
        """
        import json
        from clotho.errors import ConfigError
        from clotho.sandbox.config import sandbox_kinds

        try:
            sandbox_kinds()
        except ConfigError as exc:
            print(json.dumps({"error": str(exc)}))
        """,
        path=broken,
    )
    assert "sandbox kind 'broken' (brokenkind_gone:Nothing" in failed["error"]
