"""A service that runs beside a task's sandbox (a database, a web server the agent talks to).

Backend-neutral: the task format reads it from the task (`tasks/compose.py`: the services of
`environment/docker-compose.yaml` other than the main one), the Docker backend runs it
(`sandbox/docker/sidecars.py`), and every other backend refuses a task that has one as the
task's error, never running it without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# A service name is a host name the sandbox resolves (and part of container names).
SERVICE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"

Condition = Literal["service_started", "service_healthy", "service_completed_successfully"]


class Healthcheck(BaseModel):
    """Docker's health check of a sidecar: `test` in Docker's form (["CMD", argv...] or
    ["CMD-SHELL", "a shell command"]), durations in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: list[str] = Field(min_length=2)
    interval_s: float = Field(30.0, gt=0)
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=1)
    start_period_s: float = Field(0.0, ge=0)


class SidecarSpec(BaseModel):
    """One sidecar: its image (built from `context` or a named `image`), its command and
    environment, its health check, and the services it waits for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SERVICE_NAME, description="the service name: its host name")
    context: Path | None = Field(None, description="folder holding its Dockerfile")
    dockerfile: str = "Dockerfile"
    image: str | None = Field(None, description="a named image, or the one built (prepared)")
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    working_dir: str | None = None
    user: str | None = None
    healthcheck: Healthcheck | None = None
    healthcheck_disabled: bool = Field(False, description="compose's `disable: true`")
    depends_on: dict[str, Condition] = Field(default_factory=dict)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0)
    completes: bool = Field(
        False,
        description="a service another waits for with service_completed_successfully: "
        "ready once it exited with 0",
    )
