"""The error hierarchy. The class of an error decides what happens to a rollout.

An infrastructure failure (`InfraError`) is never scored: it is recorded, retried where
safe and kept out of pass rates and training data. Every error carries a `kind` that is
written into result files.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["infra", "agent", "verifier", "task", "config"]


class ClothoError(Exception):
    """Base of every error clotho raises on purpose."""

    kind: ErrorKind = "infra"


class InfraError(ClothoError):
    """Something outside the agent's control broke (sandbox, model endpoint)."""

    kind: ErrorKind = "infra"


class SandboxError(InfraError):
    """A sandbox could not be created, used or cleaned up."""


class ModelError(InfraError):
    """The model endpoint failed even after retries."""


class TrainerError(InfraError):
    """The trajectory API (trainer side) refused or failed a request, even after retries."""


class AgentLimit(ClothoError):
    """The agent ran out of a budget (turns, time, tokens)."""

    kind: ErrorKind = "agent"


class VerifierError(ClothoError):
    """The verifier could not produce a reward (crashed, timed out, unparsable reward)."""

    kind: ErrorKind = "verifier"


class TaskError(ClothoError):
    """A task definition is malformed; the message names the file and the field."""

    kind: ErrorKind = "task"


class ConfigError(ClothoError):
    """The user's configuration is wrong; the message says what to change."""

    kind: ErrorKind = "config"
