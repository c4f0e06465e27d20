"""`run_rollout`: the single path every attempt takes, and the rules for what a failure is.

A failure's kind follows the phase it happened in unless the error is typed: an untyped
exception while acquiring or running the agent is an internal (infra) error, while preparing
the workspace or the prompt it is the task's (the item could not be set up), and while
verifying it is the verifier's (a reward function that raises is never a reward of 0).

Once the agent has started, whatever happens in the sandbox is the agent's doing unless the
harness proves otherwise: a sandbox that breaks then (its shell killed or stopped, its
container gone) is a failed attempt of kind `agent`, unless its backend itself is down.
Infra errors are retried and kept out of pass rates, so an agent must not be able to turn
its failure into one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from clotho.agent.base import Agent, AgentContext
from clotho.agent.result import AgentResult
from clotho.errors import ClothoError, ErrorInfo, ErrorKind, LimitExceeded, SandboxError
from clotho.rollout.outcome import Phase, RolloutOutcome, VerifierOutcome
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig
from clotho.sandbox.pool import SlotPool

log = logging.getLogger(__name__)

Prepare = Callable[[Sandbox], Awaitable[None]]
Verify = Callable[[Sandbox, AgentResult], Awaitable[VerifierOutcome]]

# The kind of an untyped exception, by the phase it escaped from.
_UNTYPED_KIND: dict[Phase, ErrorKind] = {
    "acquire": "infra",
    "setup": "task",
    "agent": "infra",
    "verify": "verifier",
    "done": "infra",
}


# The pause before a retry, doubled for each further one: a backend that hiccuped gets a
# moment to come back, a lost node's loss a moment to be seen.
RETRY_DELAY_S = 1.0

# A task format's default wall clock adds this to its agent's and verifier's limits: sandbox
# start, workspace upload, image facts, an install.
SETUP_MARGIN_S = 300.0


@dataclass
class RolloutSpec:
    """Everything one rollout needs; the caller decides what the workspace and verdict are."""

    sandbox: SandboxConfig
    agent: Agent
    instruction: Callable[[], str]
    verify: Verify
    prepare: Prepare | None = None
    labels: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None  # wall clock of the whole rollout (agent + verification)
    agent_time_limit_s: float | None = None
    solution_dir: Path | None = None  # only the oracle looks at it
    pass_threshold: float = 1.0


async def run_rollout(spec: RolloutSpec, pool: SlotPool) -> RolloutOutcome:
    """Never raises for the task's, the agent's or the verifier's failures: they are recorded.

    Cancellation (Ctrl-C) propagates after the sandbox is released.
    """
    outcome = RolloutOutcome()
    held: list[Sandbox] = []  # the sandbox, once acquired: whose host's health decides
    started = time.perf_counter()
    deadline = asyncio.timeout(spec.timeout_s)
    try:
        async with deadline:
            await _phases(spec, pool, outcome, held)
    except TimeoutError as exc:
        if not deadline.expired():
            outcome.error = _error(exc, outcome.phase)
        else:
            outcome.error = ErrorInfo(
                kind="agent",
                message=f"wall-clock limit of {spec.timeout_s:g} s reached during {outcome.phase}",
            )
    except SandboxError as exc:
        outcome.error = await _sandbox_error(exc, outcome.phase, spec, pool, held)
    except Exception as exc:
        outcome.error = _error(exc, outcome.phase)
    if outcome.verifier is not None and outcome.error is None:
        outcome.reward = outcome.verifier.reward
        outcome.rewards = outcome.verifier.rewards
        outcome.passed = outcome.reward >= spec.pass_threshold
    outcome.duration_s = time.perf_counter() - started
    return outcome


async def _sandbox_error(
    exc: SandboxError, phase: Phase, spec: RolloutSpec, pool: SlotPool, held: list[Sandbox]
) -> ErrorInfo:
    if (
        phase not in ("agent", "verify")
        or exc.host_failure  # the backend proved its host failed
        # the sandbox's own host when the backend can tell (a node lost elsewhere in the
        # cluster does not excuse a sandbox the agent broke on a healthy one)
        or not await pool.backend_healthy(spec.sandbox, held[0] if held else None)
    ):
        return ErrorInfo.of(exc)
    return ErrorInfo(
        kind="agent",
        message=f"the sandbox broke during the {phase} phase while its backend is healthy, "
        f"so it counts as the agent's failure: {exc}",
    )


def _error(exc: Exception, phase: Phase) -> ErrorInfo:
    if isinstance(exc, LimitExceeded) and phase == "setup":  # before the agent: the task's
        return ErrorInfo(kind="task", message=f"the workspace setup exceeded a limit: {exc}")
    if isinstance(exc, ClothoError):
        return ErrorInfo.of(exc)
    kind = _UNTYPED_KIND[phase]
    if kind == "infra":
        log.exception("internal error during %s", phase)
        return ErrorInfo.of(exc)
    return ErrorInfo(kind=kind, message=f"{phase}: {type(exc).__name__}: {exc}")


class _Clock:
    """Charges the time since the last mark to the phase that just ended."""

    def __init__(self, outcome: RolloutOutcome) -> None:
        self.outcome = outcome
        self.last = time.perf_counter()

    def mark(self, field: str) -> None:
        now = time.perf_counter()
        setattr(self.outcome.timings, field, now - self.last)
        self.last = now


async def _phases(
    spec: RolloutSpec, pool: SlotPool, outcome: RolloutOutcome, held: list[Sandbox]
) -> None:
    clock = _Clock(outcome)
    # An agent that brings host folders (an installed agent's packages) has them bound
    # read-only where the backend can (`SandboxConfigBase.with_ro_mounts`).
    mounts = getattr(spec.agent, "sandbox_mounts", None)
    config = spec.sandbox.with_ro_mounts(mounts()) if mounts is not None else spec.sandbox
    sandbox = await pool.acquire(config, labels=spec.labels)
    held.append(sandbox)
    clock.mark("acquire_s")
    try:
        outcome.phase = "setup"
        if spec.prepare is not None:
            await spec.prepare(sandbox)
        context = AgentContext(
            instruction=spec.instruction(),
            sandbox=sandbox,
            time_limit_s=spec.agent_time_limit_s,
            solution_dir=spec.solution_dir,
        )
        clock.mark("setup_s")
        outcome.phase = "agent"
        try:
            outcome.agent = await spec.agent.run(context)
        except BaseException:  # stopped early: what it did is still its trajectory
            if context.transcript.messages:
                outcome.agent = context.transcript
            raise
        clock.mark("agent_s")
        outcome.timings.model_s = sum(t.model_s for t in outcome.agent.timings)
        outcome.timings.tools_s = sum(t.tools_s for t in outcome.agent.timings)
        if outcome.agent.stop_reason == "model_error":
            outcome.error = ErrorInfo(kind="infra", message=outcome.agent.error or "model error")
            return
        outcome.phase = "verify"
        outcome.verifier = await spec.verify(sandbox, outcome.agent)
        clock.mark("verify_s")
        outcome.phase = "done"
    finally:
        clock.last = time.perf_counter()  # an interrupted phase keeps what it had so far
        await asyncio.shield(pool.release(sandbox))
        clock.mark("release_s")


class Retries(Protocol):
    """Which failed tries run again (`RetryBudget`)."""

    def take(self, error: ErrorInfo | None, tries: int) -> bool: ...


class RetryBudget:
    """Which failed tries run again within the run: only errors of a retried kind (infra:
    a lost node, a broken backend; never the agent's, the task's or the verifier's), at most
    `per_attempt` times each and `total` times in all (a broken cluster is not retried
    forever: past the budget, failures are recorded for `--resume`)."""

    def __init__(self, per_attempt: int, total: int) -> None:
        self.per_attempt = per_attempt
        self.left = total
        self.used = 0

    def take(self, error: ErrorInfo | None, tries: int) -> bool:
        """Whether the try that ended with `error`, the `tries`-th of its attempt, runs again;
        a yes spends one retry of the run's budget."""
        if error is None or not error.retried or tries > self.per_attempt or self.left <= 0:
            return False
        self.left -= 1
        self.used += 1
        return True


async def run_retried(
    attempt: Callable[[bool], Awaitable[RolloutOutcome]],
    retries: Retries,
    *,
    on_lost: Callable[[RolloutOutcome, list[ErrorInfo]], Awaitable[None]] | None = None,
    delay_s: float | None = None,
) -> RolloutOutcome:
    """One attempt, tried again while `retries` says so (infra errors only: the agent's,
    the task's and the verifier's failures are never retried), so eval and training lose
    the same tries. `attempt(retry)` runs one try (a fresh sandbox each time); `on_lost(try,
    errors before it)` hears of a try before it runs again. The outcome that stands carries
    the lost tries' errors in `lost_tries`."""
    pause = RETRY_DELAY_S if delay_s is None else delay_s
    lost: list[ErrorInfo] = []
    outcome = await attempt(False)
    while retries.take(outcome.error, len(lost) + 1):
        assert outcome.error is not None
        if on_lost is not None:
            await on_lost(outcome, lost)
        lost.append(outcome.error)
        await asyncio.sleep(pause * 2 ** (len(lost) - 1))
        outcome = await attempt(True)
    outcome.lost_tries = lost
    return outcome
