"""Resuming a run directory (`clotho eval` and `clotho generate --resume`): its saved
configuration, with only what changes how fast it goes taken from the command line, and
never less isolation than the command line asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clotho.cli.config_io import load_config_file, resumed
from clotho.cli.options import in_ray
from clotho.errors import ConfigError

# What a resumed run may change: how fast it goes, never what it measures.
RESUMABLE_CHANGES = {"concurrency", "prewarm", "force_build", "retries", "retry_budget"}


# Sandbox settings that lower isolation below the default, and the flag that asks for each.
# A run folder is anyone's to edit: a resume takes these from its config.json only when the
# same command line asks for them again.
_LOWERED_ISOLATION: dict[tuple[str, Any], str] = {
    ("backend", "unsafe-local"): "--sandbox unsafe-local",
    ("network", True): "--network",
    ("cgroup_limits", False): "--set {path}=false",
    ("slot_isolation", "none"): "--set {path}=none",
}


def _lowered_isolation(sandbox: Any, prefix: str = "sandbox") -> dict[str, tuple[Any, str]]:
    """{setting path: (value, flag)} for each isolation-lowering setting in `sandbox`,
    nested ones (a cluster backend's `inner`) included."""
    found: dict[str, tuple[Any, str]] = {}
    if not isinstance(sandbox, dict):
        return found
    for key, value in sandbox.items():
        path = f"{prefix}.{key}"
        if isinstance(value, dict):
            found.update(_lowered_isolation(value, path))
            continue
        for (name, lowered), flag in _LOWERED_ISOLATION.items():
            if key == name and value == lowered and type(value) is type(lowered):
                found[path] = (value, flag.format(path=path))
    return found


def _check_isolation(out: Path, saved: dict[str, Any], given: dict[str, Any]) -> None:
    """Refuse a resume whose saved configuration runs with less isolation than this command
    line asks for (see `_LOWERED_ISOLATION`)."""
    asked = _lowered_isolation(given.get("sandbox"))
    missing = {
        path: flag
        for path, (value, flag) in _lowered_isolation(saved.get("sandbox")).items()
        if path not in asked or asked[path][0] != value
    }
    if missing:
        settings = ", ".join(f"{path}={saved_value(saved, path)}" for path in missing)
        flags = " ".join(dict.fromkeys(missing.values()))
        host = (
            " (unsafe-local runs the tasks' code on this host, as you)"
            if any(flag.startswith("--sandbox") for flag in missing.values())
            else ""
        )
        raise ConfigError(
            f"{out / 'config.json'} asks for less isolation than the default: {settings}"
            f"{host}. A resume never takes that from a run folder alone: to continue this run "
            f"so, give {flags} again (and check the file if you did not write it)"
        )


def saved_value(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return json.dumps(value)


def resumed_run(out: Path | None, given: dict[str, Any], ray: str | None = None) -> dict[str, Any]:
    """The configuration of the run in `out` to continue, given this command line's (`given`;
    `ray`: its --ray, as it will wrap the sandbox)."""
    if out is None:
        raise ConfigError("--resume needs the run directory: --out DIR")
    saved_path = out / "config.json"
    if not saved_path.is_file():
        raise ConfigError(f"{out} holds no run to resume (no config.json)")
    saved = load_config_file(saved_path)
    asked = in_ray(given, ray) if ray else given  # as --ray will wrap it
    _check_isolation(out, saved, asked)
    return resumed(saved, given, RESUMABLE_CHANGES)
