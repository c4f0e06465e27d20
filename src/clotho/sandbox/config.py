"""Sandbox configuration: one model per backend, each registered under its `backend` name.

A backend registers through its config class: the class names its kind (the `backend`
field's one value), the class of its backend (`backend_class`, "module:Class", imported on
first use), the SDK that backend needs and the facts callers ask about (`place`,
`isolated`, `install_facts`, ...). `SandboxConfig` is any registered config, read by its
`backend` field, and everything that lists backends (the CLI's choices, `clotho sandbox
ls/gc`) asks `sandbox_kinds`.

Adding a backend: a folder with its config and its backend, and one registration, an entry
point `kind = "module:ConfigClass"` in the `clotho.sandbox_kinds` group (pyproject.toml).
The registry reads that group once, the first time kinds are listed or looked up, so no
module imports a backend's to make it known; a config module imports no SDK, so a missing
extra never hides a kind. `register` makes a kind of a class at run time (a test's own).
"""

from __future__ import annotations

import importlib
import posixpath
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    TypeAdapter,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from clotho.errors import ConfigError, TaskError
from clotho.sandbox.sidecar_spec import SidecarSpec

if TYPE_CHECKING:
    from clotho.sandbox.backends import SandboxBackend

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The entry-point group every installed sandbox kind registers in (`kind = "module:Class"`).
ENTRY_POINT_GROUP = "clotho.sandbox_kinds"

Place = Literal["host", "cluster"]
C = TypeVar("C", bound="SandboxConfigBase")


class ReadOnlyMount(BaseModel):
    """A host folder the sandbox sees read-only at `target` (an installed agent's packages):
    bound by the backend when the sandbox starts, never copied; nothing inside can change it.
    Host backends that bind folders (local, Docker) have `ro_mounts`; others have none, and
    their callers copy what they need instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(description="absolute host folder")
    target: str = Field(description="absolute path inside the sandbox")

    @field_validator("source", "target")
    @classmethod
    def _plain_absolute(cls, value: str) -> str:
        if not value.startswith("/") or posixpath.normpath(value) != value or value == "/":
            raise ValueError(f"{value!r}: an absolute, normalised path below / is needed")
        if any(c in value for c in ":,\n\0"):  # Docker's bind syntax, mount options
            raise ValueError(f"{value!r}: ':', ',' and control characters are not allowed")
        return value


class SandboxConfigBase(BaseModel):
    """What every sandbox config states about its backend; registered, it is a kind."""

    model_config = ConfigDict(extra="forbid")

    backend: str  # each kind narrows it to Literal["<kind>"] = "<kind>"

    backend_class: ClassVar[str]  # "module:Class" of its `SandboxBackend`, imported on first use
    sdk: ClassVar[tuple[str, str] | None] = None  # (module, extra) its backend needs installed
    place: ClassVar[Place] = "host"  # host: sandboxes on this machine; cluster: beyond it
    isolated: ClassVar[bool] = True  # False: the agent runs as a plain process on the host
    no_network_hint: ClassVar[str] = "and this run gives its sandboxes none"
    # Whether its sandboxes can have sidecars (a compose task's other services): a task with
    # some is refused on a kind that cannot (`check_sidecars`), never run without them.
    runs_sidecars: ClassVar[bool] = False

    if TYPE_CHECKING:  # every config has them (Ray's are its inner config's); the pool reads
        workdir: str
        state_dir: str | None

    @classmethod
    def backend_type(cls) -> Callable[..., SandboxBackend]:
        """This kind's backend class, its module imported now (`backend_class`)."""
        module, _, name = cls.backend_class.partition(":")
        backend: Callable[..., SandboxBackend] = getattr(importlib.import_module(module), name)
        return backend

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        """A new backend for this config's place (`backend_key`); `docker_url` is the
        default daemon for configs that name none. Kinds whose backend takes other
        arguments than the config say so here."""
        return self.backend_type()(self)

    def backend_key(self, *, docker_url: str | None = None) -> str:
        """Which backend instance serves this config: one per kind and place."""
        return f"{self.backend} {self.state_dir or ''}"

    @classmethod
    def listing(cls, state_dir: str | None) -> SandboxConfigBase | None:
        """The config whose backend lists this kind's leftovers on this host (`clotho sandbox
        ls/gc`); None: another kind's backend lists them, or they are not on this host."""
        return cls.model_validate({"state_dir": state_dir}) if cls.place == "host" else None

    def parts(self) -> tuple[SandboxConfigBase, ...]:
        """This config and the configs it wraps (Ray's inner one)."""
        return (self,)

    @property
    def own_root(self) -> bool:
        """The sandbox's root file system is its own (a container's), not the host's: what
        an install writes may be anywhere under /usr, /etc and /var/lib."""
        return False

    def install_facts(self) -> dict[str, Any]:
        """What a program installed in such a sandbox depends on besides its own inputs
        (the install cache's key): the backend, its image, its root, shared slots."""
        return {"backend": self.backend, "image": None, "root": None, "slots": False, "inner": None}

    def with_ro_mounts(self: C, mounts: Sequence[ReadOnlyMount]) -> C:
        """This config with `mounts` added where its backend binds host folders (a kind with
        `ro_mounts`); any other config as it is (the caller falls back to copying)."""
        if not mounts or "ro_mounts" not in type(self).model_fields:
            return self
        have: list[ReadOnlyMount] = list(getattr(self, "ro_mounts"))  # noqa: B009 (not on the base)
        added = [m for m in mounts if m not in have]
        return self.model_copy(update={"ro_mounts": [*have, *added]}) if added else self

    def with_task_network(self: C, wants: bool, task: str) -> C:
        """This config for a task that asks for a network (`wants`) or refuses one: a network
        only when the run gives one; a task that asks in a run that gives none is a
        `TaskError` before any sandbox starts, never run offline."""
        given = bool(getattr(self, "network", False))
        if wants and not given:
            raise TaskError(f"{task}: the task asks for a network {self.no_network_hint}")
        if given and not wants:
            return self.model_copy(update={"network": False})
        return self


_KINDS: dict[str, type[SandboxConfigBase]] = {}
_PLUGINS = threading.RLock()  # held while the entry points load (a lookup from a thread waits)
_plugins_loaded = False
_plugins_loading = False


def register(cls: type[C]) -> type[C]:
    """Make `cls` a sandbox kind under its `backend` field's one value: what loading an
    entry point does, and what a kind defined at run time (a test's) calls itself."""
    field = cls.model_fields.get("backend")
    kinds = get_args(field.annotation) if field else ()
    if len(kinds) != 1 or field is None or field.default != kinds[0]:
        raise TypeError(f"{cls.__name__}: backend must be Literal['<kind>'] = '<kind>'")
    if not isinstance(getattr(cls, "backend_class", None), str):
        raise TypeError(f"{cls.__name__}: backend_class must name 'module:Class'")
    kind = kinds[0]
    if _KINDS.get(kind, cls) is not cls:
        raise TypeError(f"sandbox kind {kind!r} is already {_KINDS[kind].__name__}")
    _KINDS[kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Forget a kind (a test's own backend, once the test is done)."""
    _kinds().pop(kind, None)


def _kinds() -> dict[str, type[SandboxConfigBase]]:
    """Every kind: the installed ones (entry points, loaded on the first call) and those
    registered at run time."""
    global _plugins_loaded, _plugins_loading
    if _plugins_loaded:
        return _KINDS
    with _PLUGINS:
        if _plugins_loaded or _plugins_loading:  # loaded, or a kind's module asks while loading
            return _KINDS
        _plugins_loading = True
        try:
            installed = {ep.name: _load_kind(ep) for ep in entry_points(group=ENTRY_POINT_GROUP)}
            # Installed kinds by name, whichever module was imported first; then the others.
            ordered = {k: installed[k] for k in sorted(installed)}
            ordered.update((k, cls) for k, cls in _KINDS.items() if k not in installed)
            _KINDS.clear()
            _KINDS.update(ordered)
            _plugins_loaded = True
        finally:
            _plugins_loading = False
    return _KINDS


def _load_kind(entry: Any) -> type[SandboxConfigBase]:
    """The config class one entry point names, registered under the entry point's name."""
    try:
        cls = entry.load()
    except Exception as exc:  # a broken install of one kind: say which, whatever it raised
        raise ConfigError(
            f"sandbox kind {entry.name!r} ({entry.value}, entry point group "
            f"{ENTRY_POINT_GROUP}) cannot be loaded: {exc}"
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, SandboxConfigBase)):
        raise ConfigError(f"sandbox kind {entry.name!r}: {entry.value} is no sandbox config class")
    field = cls.model_fields.get("backend")
    if field is None or field.default != entry.name:
        kind = field.default if field else None
        raise ConfigError(f"sandbox kind {entry.name!r}: {entry.value} is the kind {kind!r}")
    return register(cls)


def sandbox_kinds(*, place: Place | None = None, isolated: bool | None = None) -> tuple[str, ...]:
    """The kinds (installed ones by name, then those registered at run time, in order),
    optionally only those with these facts."""
    return tuple(
        kind
        for kind, cls in _kinds().items()
        if (place is None or cls.place == place) and (isolated is None or cls.isolated == isolated)
    )


def config_type(kind: str) -> type[SandboxConfigBase]:
    """The config class of a kind (KeyError for an unknown one)."""
    return _kinds()[kind]


class Kinds:
    """A pydantic type marker: any registered sandbox config (of `place`, when given), chosen
    by its `backend` field when validated, so a kind registered after a model was defined is
    read too. Errors read as a discriminated union's (`sandbox.docker.cpus: ...`)."""

    def __init__(self, place: Place | None = None) -> None:
        self.place = place
        self._adapter: tuple[tuple[type, ...], TypeAdapter[Any]] | None = None

    def _union(self) -> TypeAdapter[Any]:
        """The discriminated union of the kinds registered now (rebuilt when they change)."""
        members = tuple(config_type(k) for k in sandbox_kinds(place=self.place))
        if self._adapter is None or self._adapter[0] != members:
            union: Any = (
                members[0]
                if len(members) == 1
                else Annotated[Union[members], Field(discriminator="backend")]  # noqa: UP007
            )
            self._adapter = (members, TypeAdapter(union))
        return self._adapter[1]

    def _validate(self, value: Any, info: core_schema.ValidationInfo) -> SandboxConfigBase:
        if isinstance(value, SandboxConfigBase) and value.backend in sandbox_kinds(
            place=self.place
        ):
            return value
        config: SandboxConfigBase = self._union().validate_python(value, context=info.context)
        return config

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            self._validate, serialization=core_schema.simple_ser_schema("any")
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The union of the kinds registered when the schema is asked for (a plain validator
        has none of its own): `oneOf` by `backend`, each kind's model in `$defs`."""
        return handler(self._union().core_schema)


# How a kind's `no_network_hint` begins when a task asks for a network the run does not give.
NETWORK_ASKED = "(a Harbor task's [environment] allow_internet = true) and this run gives "


class HostSandboxConfig(SandboxConfigBase):
    """What the host backends (bubblewrap, unsafe-local: `local/config.py`; Docker) share."""

    workdir: str = "/app"
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    max_output_bytes: int = Field(8 << 20, description="per stream; the middle is dropped beyond")
    shell: Literal["session", "isolated"] = Field(
        "session",
        description="session: commands run in one long-lived shell (variables persist, no fork); "
        "isolated: each command in its own subshell (a fork per command)",
    )
    state_dir: str | None = Field(
        None, description="host folder for sandbox state (default: TMPDIR)"
    )


DEFAULT_DOCKER_MEMORY_MB = 4096
DEFAULT_DOCKER_STORAGE_MB = 10240


class DockerSandboxConfig(HostSandboxConfig):
    """A container per sandbox, driven through the Docker Engine API (extra `docker`)."""

    backend: Literal["docker"] = "docker"
    backend_class: ClassVar[str] = "clotho.sandbox.docker.backend:DockerBackend"
    sdk: ClassVar[tuple[str, str] | None] = ("aiodocker", "docker")
    runs_sidecars: ClassVar[bool] = True
    no_network_hint: ClassVar[str] = (
        NETWORK_ASKED + "its containers none: Docker's only network here is the host's own, "
        "unguarded; accept that with --network --set sandbox.host_network=true, or run on the "
        "local backend with --network (guarded)"
    )
    image: str = "clotho/base:bookworm"
    network: bool = False
    host_network: bool = Field(
        False,
        description="what `network` means on Docker here: the host's own network, its "
        "loopback services (the trajectory API, model servers) included, with no guard; "
        "`network` is refused unless this says so",
    )
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(
        None,
        gt=0,
        description=f"memory (cgroup; swap none); None: the task's, else {DEFAULT_DOCKER_MEMORY_MB}",
    )
    pids_limit: int | None = Field(4096, gt=0)
    storage_mb: int | None = Field(
        None,
        gt=0,
        description="the container's writable layer, shared by its slots: on a local daemon with overlay2 "
        "and the harness as root (unless CLOTHO_DOCKER_QUOTA=0) a file system "
        "of this size and a matching inode count, so a write past it fails with ENOSPC and a "
        "command after which it is full is `limit`; otherwise its size is watched and the "
        "container killed past it (said at run time); None: the task's, else "
        f"{DEFAULT_DOCKER_STORAGE_MB}",
    )
    storage_check_s: float = Field(
        2.0,
        gt=0,
        description="how often the writable layer's size is checked while commands run, "
        "where the disk limit is watched rather than enforced",
    )
    sidecars: list[SidecarSpec] = Field(
        default_factory=list,
        description="services started beside each sandbox, sharing only its private network "
        "(set by prepare from a task's compose file: `sandbox/docker/sidecars.py`)",
    )
    sidecar_timeout_s: float = Field(
        300.0,
        gt=0,
        description="how long a sandbox's sidecars may take to start and pass their health "
        "checks; one that is not ready by then is the task's error, naming it",
    )
    docker_url: str | None = Field(
        None, description="Engine API address (default: DOCKER_HOST or the unix socket)"
    )
    ro_mounts: list[ReadOnlyMount] = Field(
        default_factory=list,
        description="host folders bound read-only into each sandbox (installed agents' packages)",
    )
    init: bool = Field(
        True, description="run docker-init as pid 1 so signals and zombies are handled"
    )
    stdio: Literal["fifo", "attach"] = Field(
        "fifo",
        description="fifo: the shell's pipes are FIFOs in a bind-mounted host folder (a local "
        "daemon only; no copying through dockerd); attach: over the Engine API socket",
    )
    slots_per_container: int = Field(
        1,
        ge=1,
        le=256,
        description="sandboxes (slots) one container hosts, each with its own workspace and "
        "shell; 1: a container per sandbox. pids_limit is shared out, each slot a part (its "
        "own pids cgroup where the host allows, else RLIMIT_NPROC per isolated slot); cpus, "
        "memory and storage_mb are the container's, shared by its slots: an OOM kill is the "
        "`limit` of the slot whose process died; a full disk ends the container, `limit` for "
        "the slot holding the most of it, an infrastructure error for its neighbours",
    )
    slot_isolation: Literal["auto", "bwrap", "none"] = Field(
        "auto",
        description="with several slots per container: auto and bwrap run each slot in "
        "bubblewrap under its own uid (its workdir, /tmp and HOME private; needs bwrap, "
        "setpriv and prlimit in the image and a relaxed seccomp profile on the container); "
        "where bubblewrap does not work in the image, opening a slot is a configuration "
        "error, never a fallback; none: slots are directories under /slots that see and "
        "change each other's files, only when asked by name",
    )

    @model_validator(mode="after")
    def _network_is_the_hosts(self) -> DockerSandboxConfig:
        """Fail closed: a container with a network shares the host's (no bridge here), so an
        agent would reach what listens on the host's loopback. Asked for explicitly, or not."""
        if self.network and not self.host_network:
            raise ValueError(
                "network on the docker backend is the host's own network (its loopback "
                "services, such as the trajectory API and model servers, included, unguarded): "
                "set sandbox.host_network=true to accept that, or use the local backend, whose "
                "network guard keeps the host out"
            )
        return self

    def new_backend(self, *, docker_url: str | None = None) -> SandboxBackend:
        return self.backend_type()(self.docker_url or docker_url, state_dir=self.state_dir)

    def backend_key(self, *, docker_url: str | None = None) -> str:
        return f"docker {self.docker_url or docker_url or ''}"

    @property
    def own_root(self) -> bool:
        return True

    def install_facts(self) -> dict[str, Any]:
        slots = self.slots_per_container > 1  # an isolated slot's root is read-only
        return {**super().install_facts(), "image": self.image, "slots": slots}


# Any registered sandbox config, read by its `backend` field (the installed kinds are loaded
# the first time one is validated).
SandboxConfig = Annotated[SandboxConfigBase, Kinds()]


def base_env(home: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of a sandbox shell: nothing leaks in from the host process."""
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "DEBIAN_FRONTEND": "noninteractive",
    }
    env.update(extra)
    return env
