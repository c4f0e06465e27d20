"""The error hierarchy. The class of an error decides what happens to a rollout.

An infrastructure failure (`InfraError`) is never scored: it is recorded, retried where
safe and kept out of pass rates and training data. Every error carries a `kind` that is
written into result files.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ValidationError

ErrorKind = Literal["infra", "agent", "verifier", "task", "config", "limit", "tamper"]

# Kinds that say nothing about the agent: kept out of pass rates (their denominator).
UNSCORED_KINDS: frozenset[str] = frozenset({"infra", "task", "config"})
# Kinds that `--resume` runs again: only a failure of the harness itself may change on retry.
RETRIED_KINDS: frozenset[str] = frozenset({"infra"})


class ErrorInfo(BaseModel):
    """An error as results files record it: its kind decides scoring and retries."""

    kind: ErrorKind
    message: str

    @property
    def scored(self) -> bool:
        """Whether the attempt still counts in a pass rate (as a failure)."""
        return self.kind not in UNSCORED_KINDS

    @property
    def retried(self) -> bool:
        """Whether `--resume` tries the attempt again."""
        return self.kind in RETRIED_KINDS

    @classmethod
    def of(cls, exc: BaseException) -> ErrorInfo:
        """A typed error keeps its kind; anything else is an internal (infra) error."""
        if isinstance(exc, ClothoError):
            return cls(kind=exc.kind, message=str(exc))
        return cls(kind="infra", message=f"internal error: {type(exc).__name__}: {exc}")


def describe_validation_error(exc: ValidationError, *, prefix: str = "") -> str:
    """A pydantic error as one line per problem: where (dotted path), what, and the value.

    `prefix` goes before every location: a task file passes `[environment].` so that its
    problems read `[environment].memory: ...`. Shown values are cut at 80 characters."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        where = prefix + where if where else prefix.rstrip(".") or "value"
        got = err.get("input")
        if isinstance(got, dict | list):
            shown = ""
        elif isinstance(got, int) and not isinstance(got, bool) and got.bit_length() > 256:
            # An int of more than 4300 digits has no repr at all (ValueError).
            shown = f" (got an integer of {got.bit_length()} bits)"
        else:
            shown = f" (got {got[:80] if isinstance(got, str | bytes) else got!r:.80})"
        parts.append(f"{where}: {err['msg']}{shown}")
    return "; ".join(parts)


class ClothoError(Exception):
    """Base of every error clotho raises on purpose."""

    kind: ErrorKind = "infra"


class InfraError(ClothoError):
    """Something outside the agent's control broke (sandbox, model endpoint)."""

    kind: ErrorKind = "infra"


class SandboxError(InfraError):
    """A sandbox could not be created, used or cleaned up."""

    # True when the backend proves the host itself failed (a lost node): never the agent's.
    host_failure: bool = False


class ModelError(InfraError):
    """The model endpoint failed even after retries."""


class TrainerError(InfraError):
    """The trajectory API (trainer side) refused or failed a request, even after retries."""


class AgentLimit(ClothoError):
    """The agent ran out of a budget (turns, time, tokens)."""

    kind: ErrorKind = "agent"


class LimitExceeded(ClothoError):
    """The sandbox hit one of its limits (memory, processes, disk): the agent's failure."""

    kind: ErrorKind = "limit"


class TamperError(ClothoError):
    """Programs the verifier runs were replaced or shadowed during the agent's run."""

    kind: ErrorKind = "tamper"


class VerifierError(ClothoError):
    """The verifier could not produce a reward (crashed, timed out, unparsable reward)."""

    kind: ErrorKind = "verifier"


class TaskError(ClothoError):
    """A task definition is malformed; the message names the file and the field."""

    kind: ErrorKind = "task"


class ConfigError(ClothoError):
    """The user's configuration is wrong; the message says what to change."""

    kind: ErrorKind = "config"
