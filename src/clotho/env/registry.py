"""Environments by name (`terminal_tasks`) or import path (`package.module:Class`)."""

from __future__ import annotations

import importlib

from clotho.env.base import Environment
from clotho.errors import ConfigError

BUILTIN = {
    "terminal_tasks": "clotho.envs.terminal_tasks:TerminalTasksEnv",
    "terminal_test": "clotho.envs.terminal_test:TerminalTestEnv",
}


def load_environment(spec: str) -> type[Environment]:  # type: ignore[type-arg]
    path = BUILTIN.get(spec, spec)
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise ConfigError(
            f"unknown environment {spec!r}: give a registered name ({', '.join(sorted(BUILTIN))}) "
            "or an import path package.module:Class"
        )
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load environment {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"{spec!r} is not an Environment subclass")
    return cls
