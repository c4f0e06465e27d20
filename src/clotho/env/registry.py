"""Environments by name (`terminal_tasks`), import path (`package.module:Class`) or file
(`path/to/envs.py:Class`).

An import path is looked up from the current folder too, as `python -m` would: the
documented `clotho process mypkg.envs:CountFiles` works from the project folder without
installing `mypkg`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from clotho.env.base import Environment
from clotho.errors import ConfigError

BUILTIN = {
    "terminal_tasks": "clotho.envs.terminal_tasks:TerminalTasksEnv",
    "terminal_test": "clotho.envs.terminal_test:TerminalTestEnv",
    "swe": "clotho.envs.swe:SweEnv",
    "endless": "clotho.envs.endless:EndlessEnv",
}


def _import(module_name: str) -> ModuleType:
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(f"clotho_user_env.{path.stem}", path)
        if spec is None or spec.loader is None or not path.is_file():
            raise ImportError(f"no Python file at {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)  # after installed packages: never shadows one
    return importlib.import_module(module_name)


def load_environment(spec: str) -> type[Environment]:  # type: ignore[type-arg]
    path = BUILTIN.get(spec, spec)
    module_name, sep, attr = path.rpartition(":")
    if not sep or not module_name:
        raise ConfigError(
            f"unknown environment {spec!r}: give a registered name ({', '.join(sorted(BUILTIN))}), "
            "an import path package.module:Class, or a file path/to/envs.py:Class"
        )
    try:
        cls = getattr(_import(module_name), attr)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise ConfigError(f"cannot load environment {spec!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ConfigError(f"{spec!r} is not an Environment subclass")
    return cls
