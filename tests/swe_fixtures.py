"""The SWE tests' fixtures: the toy repositories, built once a session as `make test` builds
them (a folder of mirrors), and options that read them with a cache of the test's own.

A test module loads them with `pytest_plugins = ("tests.swe_fixtures",)`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clotho.swe.examples import build_toys
from clotho.swe.instance import SweOptions


@pytest.fixture(scope="session")
def toys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The five toy repositories, built as `make test` builds them (a folder of mirrors)."""
    return build_toys(tmp_path_factory.mktemp("toys"))[0].parent


@pytest.fixture
def options(toys: Path, tmp_path: Path) -> SweOptions:
    return SweOptions(repos_dir=str(toys), cache_dir=str(tmp_path / "cache"), network_clone=False)
