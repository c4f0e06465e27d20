"""Is a Docker daemon usable? Docker tests skip (with the reason shown) when it is not,
except in CI (`CI=true`), where `make test` sets Docker up and its absence is a failure."""

from __future__ import annotations

import asyncio
import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def docker_problem() -> str | None:
    """Why no Docker daemon can be used, or None when one answers."""
    try:
        import aiodocker
    except ImportError:
        return "aiodocker is not installed (pip install -e '.[docker]')"

    async def probe() -> None:
        docker = aiodocker.Docker()
        try:
            async with asyncio.timeout(10):
                await docker.version()
        finally:
            await docker.close()

    try:
        asyncio.run(probe())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


DOCKER_PROBLEM = docker_problem()
requires_docker = pytest.mark.skipif(
    DOCKER_PROBLEM is not None and not IN_CI,
    reason=f"no Docker daemon answers ({DOCKER_PROBLEM}); make docker-deps sets one up",
)


def fail_without_docker_in_ci() -> None:
    if DOCKER_PROBLEM is not None:  # only reached in CI: elsewhere the tests are skipped
        pytest.fail(f"CI=true runs the Docker tests, but no daemon answers: {DOCKER_PROBLEM}")
