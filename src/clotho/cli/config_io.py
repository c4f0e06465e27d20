"""Configuration files (YAML or JSON) and `--set a.b=value` overrides for CLI commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clotho.errors import ConfigError


def load_config_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_sets(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides; values are parsed as YAML (`2`, `true`, `[a, b]`)."""
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key.path=value, got {assignment!r}")
        value = yaml.safe_load(raw) if raw.strip() else ""
        nested: dict[str, Any] = value
        for part in reversed(key.strip().split(".")):
            nested = {part: nested}
        data = merge(data, nested)
    return data


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, path + "."))
        else:
            out[path] = value
    return out


def resumed(saved: dict[str, Any], given: dict[str, Any], may_change: set[str]) -> dict[str, Any]:
    """A resumed run's configuration: the saved one, with only the settings in `may_change`
    (how fast, not what is measured) taken from `given`. Any other difference is refused."""
    before = _leaves(saved)
    conflicts = [
        f"{path}: saved {before.get(path)!r}, given {value!r}"
        for path, value in _leaves(given).items()
        if path.split(".")[0] not in may_change and before.get(path) != value
    ]
    if conflicts:
        raise ConfigError(
            "--resume continues a run with its saved configuration (config.json), and these "
            "settings differ: " + "; ".join(conflicts) + ". Drop those flags, or start a new "
            "run with another --out"
        )
    return merge(saved, {k: v for k, v in given.items() if k in may_change})
