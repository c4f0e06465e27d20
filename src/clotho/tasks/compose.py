"""A Harbor / Terminal-Bench task's `environment/docker-compose.yaml`, read into sidecars.

The main service (`main`, else `client`, else, without an environment/Dockerfile, the first
service with a `build`) is the agent's sandbox: its image comes from `build` as before
(`tasks/environment.py`), and its other keys are the reference harness's own template
(image and container names, `sleep infinity`, the harness's log folders), not the task's.
Every other service is a sidecar (`SidecarSpec`), started beside the sandbox by a backend
that can (Docker) and refused by the others.

What clotho cannot give a service the way compose would is refused as the task's error,
naming the service and the key, never silently dropped: host ports, host folders, named
volumes, privileges, devices, host networking and other networks. Values are interpolated
as compose does (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `$VAR`, `$$`) from the
task's own `environment/.env` only: nothing of the harness's environment leaks into a task,
and a variable with neither a value nor a default is refused.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clotho.errors import TaskError, describe_validation_error
from clotho.sandbox.sidecar_spec import SERVICE_NAME, Condition, Healthcheck, SidecarSpec
from clotho.tasks.harbor import Task

COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
MAX_COMPOSE_BYTES = 1 << 20

# Top-level keys: `services` is read; these mean nothing here; the rest are refused.
_TOP_IGNORED = {"version", "name"}
# A sidecar's keys that are honoured.
_HONOURED = {
    "build", "image", "command", "entrypoint", "environment", "env_file", "working_dir",
    "user", "healthcheck", "depends_on", "mem_limit", "cpus", "deploy",
}  # fmt: skip
# Keys that change nothing here: names (the harness names containers), restart policies
# (a sidecar lives as long as its sandbox), ports only exposed to other services (every
# port of a sidecar is reachable from the sandbox), TTY and logging settings.
_IGNORED = {
    "container_name", "hostname", "restart", "expose", "labels", "stdin_open", "tty",
    "init", "logging", "stop_signal", "stop_grace_period", "pull_policy", "platform",
    "links",
}  # fmt: skip
# Why a key is refused, when there is more to say than its name.
_WHY = {
    "ports": "publishes ports on the host; a sidecar is reachable from the sandbox by its "
    "service name, and nothing else reaches it",
    "volumes": "mounts host folders or volumes into the service; clotho gives a sidecar "
    "its image's files only",
    "privileged": "asks for a privileged container",
    "devices": "asks for host devices",
    "cap_add": "asks for extra capabilities",
    "network_mode": "chooses its own network; sidecars share the sandbox's private one",
    "networks": "chooses its own networks; sidecars share the sandbox's private one",
}
# The main service's keys that ask for more than any sandbox gets.
_MAIN_REFUSED = ("ports", "privileged", "devices", "cap_add", "pid", "ipc", "userns_mode")
# The main service's volumes that are the reference harness's own log folders.
_HARNESS_VOLUME = re.compile(r"^\$\{?(T_BENCH_|HOST_|ENV_)[A-Z_]*\}?:")

_VAR = re.compile(r"\$(?:\$|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def compose_file(task: Task) -> Path | None:
    """The task's compose file, if it has one."""
    for name in COMPOSE_FILES:
        path = task.environment_dir / name
        if path.is_file():
            return path
    return None


def _load(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    if len(data) > MAX_COMPOSE_BYTES:
        raise TaskError(f"{path}: larger than {MAX_COMPOSE_BYTES >> 20} MiB")
    try:
        doc = yaml.safe_load(data) or {}
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise TaskError(f"{path}: a compose file is a mapping")
    return doc


def _dotenv(env_dir: Path) -> dict[str, str]:
    """`environment/.env`, which compose reads for interpolation."""
    path = env_dir / ".env"
    return _env_file(path) if path.is_file() and not path.is_symlink() else {}


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments, blank lines and `export ` skipped, one level of quotes
    removed), as compose reads `.env` and `env_file`."""
    found: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        found[key.strip()] = value
    return found


class _Reader:
    """Reads one compose file, its errors naming the file and the service."""

    def __init__(self, task: Task, path: Path) -> None:
        self.task = task
        self.path = path
        self.variables = _dotenv(task.environment_dir)

    def fail(self, where: str, problem: str) -> TaskError:
        return TaskError(f"{self.path}: {where}: {problem}")

    def interpolate(self, value: Any, where: str) -> Any:
        if isinstance(value, list):
            return [self.interpolate(v, where) for v in value]
        if isinstance(value, dict):
            return {k: self.interpolate(v, where) for k, v in value.items()}
        if not isinstance(value, str):
            return value

        def one(match: re.Match[str]) -> str:
            if match[0] == "$$":
                return "$"
            expr = match[1] if match[1] is not None else match[2]
            parts = re.split(r"(:-|-|:\?|\?)", expr, maxsplit=1)
            name, sep, default = [*parts, "", ""][:3]
            if name in self.variables and (self.variables[name] or sep != ":-"):
                return self.variables[name]
            if sep in (":-", "-"):
                return default
            raise self.fail(
                where,
                f"${{{name}}} has no value: clotho interpolates from the task's environment/.env "
                "only (nothing of the host's environment); give it a default (${VAR:-value})",
            )

        return _VAR.sub(one, value)

    def argv(self, value: Any, where: str) -> list[str]:
        value = self.interpolate(value, where)
        if isinstance(value, str):
            return shlex.split(value)
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            return [str(v) for v in value]
        raise self.fail(where, "must be a string or a list of strings")

    def env(self, service: dict[str, Any], where: str) -> dict[str, str]:
        found: dict[str, str] = {}
        for file in self._list(service.get("env_file"), f"{where}.env_file"):
            if not isinstance(file, str):
                raise self.fail(f"{where}.env_file", "must name files")
            path = (self.task.environment_dir / file).resolve()
            if not path.is_relative_to(self.task.path.resolve()) or not path.is_file():
                raise self.fail(f"{where}.env_file", f"{file}: not a file inside the task")
            for key, value in _env_file(path).items():
                found[key] = self.interpolate(value, f"{where}.env_file")
        raw = service.get("environment") or {}
        if isinstance(raw, list):
            pairs: dict[str, Any] = {}
            for item in raw:
                key, sep, value = str(item).partition("=")
                pairs[key] = value if sep else None
            raw = pairs
        if not isinstance(raw, dict):
            raise self.fail(f"{where}.environment", "must be a mapping or a list of KEY=VALUE")
        for key, value in raw.items():
            if value is None:
                raise self.fail(
                    f"{where}.environment.{key}",
                    "has no value (compose would pass the host's; clotho passes nothing of "
                    "the host's environment): give it one",
                )
            if isinstance(value, bool):
                value = "true" if value else "false"
            found[str(key)] = str(self.interpolate(str(value), f"{where}.environment"))
        return found

    @staticmethod
    def _list(value: Any, where: str) -> list[Any]:
        if value is None:
            return []
        return value if isinstance(value, list) else [value]

    def seconds(self, value: Any, where: str) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        text = str(self.interpolate(value, where)).strip()
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise self.fail(where, f"{text!r} is not a duration like '10s', '1m30s', '500ms'")
        return sum(float(n) * _UNIT_S[u] for n, u in parts)

    def healthcheck(self, raw: Any, where: str) -> tuple[Healthcheck | None, bool]:
        if not isinstance(raw, dict):
            raise self.fail(where, "must be a mapping")
        if raw.get("disable"):
            return None, True
        test = raw.get("test")
        if test is None:
            raise self.fail(where, "has no test")
        if isinstance(test, str):
            test = ["CMD-SHELL", self.interpolate(test, where)]
        else:
            test = self.argv(test, f"{where}.test")
        if test and test[0] == "NONE":
            return None, True
        if not test or test[0] not in ("CMD", "CMD-SHELL") or len(test) < 2:
            raise self.fail(f"{where}.test", "must be CMD-SHELL, [CMD, ...] or [CMD-SHELL, ...]")
        fields: dict[str, Any] = {"test": test}
        for key, name in (
            ("interval", "interval_s"), ("timeout", "timeout_s"),
            ("start_period", "start_period_s"),
        ):  # fmt: skip
            if raw.get(key) is not None:
                fields[name] = self.seconds(raw[key], f"{where}.{key}")
        if raw.get("retries") is not None:
            fields["retries"] = raw["retries"]
        try:
            return Healthcheck.model_validate(fields), False
        except ValidationError as exc:
            raise self.fail(where, describe_validation_error(exc)) from exc

    def depends_on(self, raw: Any, where: str) -> dict[str, Condition]:
        if raw is None:
            return {}
        if isinstance(raw, list):
            return {str(name): "service_started" for name in raw}
        if not isinstance(raw, dict):
            raise self.fail(where, "must be a list of services or a mapping")
        found: dict[str, Condition] = {}
        for name, value in raw.items():
            condition = (value or {}).get("condition", "service_started")
            if condition not in ("service_started", "service_healthy",
                                 "service_completed_successfully"):  # fmt: skip
                raise self.fail(f"{where}.{name}", f"unknown condition {condition!r}")
            found[str(name)] = condition
        return found

    def limits(self, service: dict[str, Any], where: str) -> tuple[float | None, int | None]:
        cpus, memory = service.get("cpus"), service.get("mem_limit")
        deploy = service.get("deploy") or {}
        if not isinstance(deploy, dict) or set(deploy) - {"resources"}:
            raise self.fail(f"{where}.deploy", "only deploy.resources.limits is read")
        limits = ((deploy.get("resources") or {}).get("limits")) or {}
        cpus = limits.get("cpus", cpus)
        memory = limits.get("memory", memory)
        cpus_value = float(self.interpolate(str(cpus), where)) if cpus is not None else None
        memory_mb = None
        if memory is not None:
            memory_mb = _memory_mb(str(self.interpolate(str(memory), where)))
            if memory_mb is None:
                raise self.fail(f"{where}.mem_limit", f"{memory!r} is not a size like '512m'")
        return cpus_value, memory_mb

    def build(self, raw: Any, where: str) -> tuple[Path, str]:
        if isinstance(raw, str):
            context, dockerfile = raw, "Dockerfile"
        elif isinstance(raw, dict):
            extra = set(raw) - {"context", "dockerfile"}
            if extra:
                raise self.fail(where, f"build keys {sorted(extra)} are not supported")
            context, dockerfile = (
                str(raw.get("context", ".")),
                str(raw.get("dockerfile", "Dockerfile")),
            )
        else:
            raise self.fail(where, "must be a context path or a mapping")
        folder = (self.task.environment_dir / self.interpolate(context, where)).resolve()
        if not folder.is_relative_to(self.task.path.resolve()):
            raise self.fail(where, f"build path {context} leaves the task folder")
        target = (folder / dockerfile).resolve()
        if not target.is_relative_to(self.task.path.resolve()) or not target.is_file():
            raise self.fail(where, f"no {dockerfile} in {folder}")
        return folder, dockerfile

    def sidecar(self, name: str, service: dict[str, Any], completes: bool) -> SidecarSpec:
        where = f"services.{name}"
        if not re.match(SERVICE_NAME, name):
            raise self.fail(where, "a service name must be a host name (letters, digits, _.-)")
        for key in service:
            if key in _HONOURED or key in _IGNORED or key.startswith("x-"):
                continue
            why = _WHY.get(key, "is not supported by clotho")
            raise self.fail(f"{where}.{key}", f"{why} (clotho refuses rather than ignores it)")
        context, dockerfile = None, "Dockerfile"
        if service.get("build") is not None:
            context, dockerfile = self.build(service["build"], f"{where}.build")
        image = service.get("image")
        if image is not None:
            image = str(self.interpolate(image, f"{where}.image"))
        if context is None and not image:
            raise self.fail(where, "has neither build nor image")
        health, disabled = None, False
        if service.get("healthcheck") is not None:
            health, disabled = self.healthcheck(service["healthcheck"], f"{where}.healthcheck")
        cpus, memory_mb = self.limits(service, where)
        fields: dict[str, Any] = {
            "name": name,
            "context": context,
            "dockerfile": dockerfile,
            "image": image if context is None else None,
            "command": self.argv(service["command"], f"{where}.command")
            if service.get("command") is not None
            else None,
            "entrypoint": self.argv(service["entrypoint"], f"{where}.entrypoint")
            if service.get("entrypoint") is not None
            else None,
            "env": self.env(service, where),
            "working_dir": self.interpolate(service.get("working_dir"), where),
            "user": str(self.interpolate(service["user"], where))
            if service.get("user") is not None
            else None,
            "healthcheck": health,
            "healthcheck_disabled": disabled,
            "depends_on": self.depends_on(service.get("depends_on"), f"{where}.depends_on"),
            "cpus": cpus,
            "memory_mb": memory_mb,
            "completes": completes,
        }
        try:
            return SidecarSpec.model_validate(fields)
        except ValidationError as exc:
            raise self.fail(where, describe_validation_error(exc)) from exc

    def check_main(self, name: str, service: dict[str, Any]) -> None:
        """The main service asks for nothing a sandbox cannot have."""
        where = f"services.{name}"
        for key in _MAIN_REFUSED:
            if service.get(key):
                why = _WHY.get(key, f"{key} is not given to a sandbox")
                raise self.fail(f"{where}.{key}", f"{why} (clotho refuses rather than ignores it)")
        mode = service.get("network_mode")
        if mode not in (None, "none", "bridge", "default"):
            raise self.fail(f"{where}.network_mode", f"{mode!r}: the sandbox's network is clotho's")
        for volume in service.get("volumes") or []:
            if not (isinstance(volume, str) and _HARNESS_VOLUME.match(volume)):
                raise self.fail(
                    f"{where}.volumes",
                    f"{volume!r}: {_WHY['volumes']} (the harness's own log folders, "
                    "${T_BENCH_...}, are the only ones read, and clotho provides them)",
                )


def _memory_mb(text: str) -> int | None:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmg]?)i?b?", text.strip().lower())
    if match is None:
        return None
    scale = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024}[match[2]]
    mb = int(float(match[1]) * scale)
    return mb if mb >= 1 else None


def main_service(services: dict[str, Any], has_dockerfile: bool) -> str | None:
    """Which service is the agent's sandbox: `main` (Harbor), `client` (Terminal-Bench),
    else, when the task has no environment/Dockerfile, the first one with a `build`. With a
    Dockerfile and neither name, the file is Harbor's overlay: every service is a sidecar."""
    for name in ("main", "client"):
        if name in services:
            return name
    if has_dockerfile:
        return None
    return next((n for n, s in services.items() if isinstance(s, dict) and s.get("build")), None)


def sidecar_specs(task: Task) -> list[SidecarSpec]:
    """The task's sidecars, in a start order where each comes after what it depends on; a
    compose file asking for what clotho cannot give is a `TaskError` naming the key."""
    path = compose_file(task)
    if path is None:
        return []
    reader = _Reader(task, path)
    doc = _load(path)
    for key in doc:
        if key != "services" and key not in _TOP_IGNORED and not str(key).startswith("x-"):
            raise reader.fail(str(key), "top-level key not supported by clotho (refused)")
    services = doc.get("services") or {}
    if not isinstance(services, dict) or not all(isinstance(s, dict) for s in services.values()):
        raise reader.fail("services", "must map service names to mappings")
    services = {str(k): v for k, v in services.items()}
    main = main_service(services, (task.environment_dir / "Dockerfile").is_file())
    if main is not None:
        reader.check_main(main, services[main])
    names = [n for n in services if n != main]
    # Which services others wait for until they exited with 0.
    waits = {
        dep
        for n in services
        for dep, cond in reader.depends_on(services[n].get("depends_on"), n).items()
        if cond == "service_completed_successfully"
    }
    specs = {n: reader.sidecar(n, services[n], n in waits) for n in names}
    for spec in specs.values():
        for dep in spec.depends_on:
            if dep != main and dep not in specs:
                raise reader.fail(f"services.{spec.name}.depends_on", f"no service {dep!r}")
    return _ordered(specs, main, reader)


def _ordered(specs: dict[str, SidecarSpec], main: str | None, reader: _Reader) -> list[SidecarSpec]:
    """Dependencies first (a dependency on the main service is met: it starts first)."""
    done: list[SidecarSpec] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise reader.fail("depends_on", "a cycle: " + " -> ".join((*path, name)))
        state[name] = "visiting"
        for dep in specs[name].depends_on:
            if dep != main:
                visit(dep, (*path, name))
        state[name] = "done"
        done.append(specs[name])

    for name in specs:
        visit(name, ())
    return done
