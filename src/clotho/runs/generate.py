"""`clotho generate`: the agent on plain prompts, as a batch, into a run directory.

Each prompt is an `EvalTask` of its own (`PromptTask`) and runs through the one rollout path
(`run_rollout`, retried like eval's attempts by `run_retried` within a `RetryBudget`); its
outcome is recorded by eval's recorder into the same run directory eval writes
(`results.jsonl`, `trials/<id>__0.json`, `config.json` as an `EvalConfig`, `metrics.json`),
so `--resume`, `clotho view` and `clotho export sft` read it as they read an eval run.

A prompt's `verify` command is judged as a task's tests are: it becomes the `tests/test.sh`
of a Harbor task of its own (`OUT/verifiers/<id>/`, the command in a subshell, its exit code
written as reward 1 or 0) and runs through `run_verifier`: the programs it names are digested
before the agent starts, the agent's processes are stopped or held, tampering with the runner
is refused, and the reward is read back under the same rules. Without a `verify` command the
prompt has no reward (`reward: null`, category `unverified`).

At the end (or at Ctrl-C) `trajectories.jsonl` (one `TrialDetail` a line, one per prompt) and
`generate_stats.json` are written from the run directory, so a resumed run's files hold every
prompt it finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from clotho.agent.base import Agent
from clotho.agent.result import AgentResult
from clotho.chat.client import ModelConfig
from clotho.chat.ledger import TokenSequence
from clotho.chat.models import Model, ModelSession, build_model
from clotho.chat.types import ModelTurn
from clotho.errors import ConfigError, ErrorInfo
from clotho.rollout import RolloutOutcome, RolloutSpec, VerifierOutcome, run_retried, run_rollout
from clotho.rollout.agents import llm_agent
from clotho.rollout.run import SETUP_MARGIN_S
from clotho.runs import files
from clotho.runs.eval import Recorder
from clotho.runs.generate_stats import GenerateStats, write_outputs
from clotho.runs.metrics import compute_metrics, latest
from clotho.runs.prompts import PromptItem, in_subshell
from clotho.runs.records import EvalConfig
from clotho.runs.schedule import retry_budget
from clotho.runs.store import RunStore
from clotho.sandbox import EnvironmentSpec, PreparedEnvironment, Sandbox
from clotho.sandbox.pool import PoolConfig, SlotPool
from clotho.tasks.base import TrialOptions
from clotho.tasks.harbor import AgentSettings, Task, TaskConfig, VerifierSettings
from clotho.tasks.verify import ProgramDigests, program_digests, run_verifier
from clotho.tools.builtin import default_registry

Listener = Callable[[str, object], None]

DEFAULT_AGENT_TIMEOUT_S = 600.0
"""A prompt's agent wall clock when the run sets none (Harbor's default for a task's agent)."""
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
VERIFIERS_DIR = "verifiers"
ENVIRONMENT = EnvironmentSpec(name="generate")
"""Every prompt's sandbox: the run's backend and limits; its workspace is uploaded per prompt."""

_TEST_SH = """#!/bin/bash
# clotho generate: prompt {id}'s verify command. Its exit code is the reward: 0 -> 1, else 0.
{command}status=$?
echo "clotho generate: the verify command exited with $status"
if [ "$status" -eq 0 ]; then reward=1; else reward=0; fi
echo "$reward" > /logs/verifier/reward.txt
"""


def _make_dirs(root: Path, parts: list[str]) -> None:
    """`root/parts...` as folders (0700 when made), walked without following a link."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


def verifier_task(item: PromptItem, root: Path, timeout_s: float) -> Task:
    """The prompt's verify command as a Harbor task's tests (written under `root`), so that
    `run_verifier` judges it with every rule a task's tests get. Blocking: a few small files."""
    assert item.verify is not None
    folder = root / VERIFIERS_DIR / item.id
    script = _TEST_SH.format(id=shlex.quote(item.id), command=in_subshell(item.verify))
    try:
        _make_dirs(root, [VERIFIERS_DIR, item.id, "tests"])
        files.write_file(root, f"{VERIFIERS_DIR}/{item.id}/tests/test.sh", script.encode())
    except OSError as exc:  # a link on the way is refused, never written through
        where = f"{VERIFIERS_DIR}/{item.id}/tests/test.sh"
        raise ConfigError(f"{root}: cannot write {where}: {exc}") from None
    config = TaskConfig(
        verifier=VerifierSettings(timeout_sec=timeout_s),
        agent=AgentSettings(timeout_sec=DEFAULT_AGENT_TIMEOUT_S),
    )
    return Task(name=item.id, path=folder, config=config, instruction=item.prompt)


class _ImageSession:
    """A session whose first user message carries the prompt's image as a content part (the
    conversation, and so the trajectory, records it as sent)."""

    def __init__(self, inner: ModelSession, image: bytes) -> None:
        self.inner = inner
        self.image = image
        self.sent = False

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> ModelTurn:
        if not self.sent:
            from clotho.chat.types import image_part  # type: ignore[attr-defined]

            for message in messages:
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    text = message["content"]
                    message["content"] = [{"type": "text", "text": text}, image_part(self.image)]
                    break
            self.sent = True
        return await self.inner.complete(messages, tools)

    def sequences(self, messages: Any) -> list[TokenSequence] | None:
        return self.inner.sequences(messages)


class _ImageModel:
    def __init__(self, inner: Model, image: bytes) -> None:
        self.inner = inner
        self.image = image

    def session(self) -> ModelSession:
        return _ImageSession(self.inner.session(), self.image)

    async def aclose(self) -> None:  # the shared model is closed by the run
        return None


@dataclass
class PromptTask:
    """One prompt as an `EvalTask`: its workspace, its instruction, its verdict."""

    item: PromptItem
    verifier: Task | None
    timeout_s: float | None
    agent_time_limit_s: float
    make_agent: Callable[[PromptItem], Agent] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.item.id

    @property
    def category(self) -> str:
        return "verified" if self.item.verify is not None else "unverified"

    def environment_spec(self) -> EnvironmentSpec:
        return ENVIRONMENT

    def rollout(
        self, agent: Agent, prepared: PreparedEnvironment, **options: Unpack[TrialOptions]
    ) -> RolloutSpec:
        item, verifier = self.item, self.verifier
        baseline: list[ProgramDigests] = []

        async def prepare(sandbox: Sandbox) -> None:
            if item.workdir is not None:
                await sandbox.upload(item.workdir, sandbox.workdir)
            if verifier is not None:  # before the agent: what the verifier will run
                baseline.append(await program_digests(verifier, sandbox))

        async def verify(sandbox: Sandbox, result: AgentResult) -> VerifierOutcome:
            if verifier is None:  # no reward: `unverified` (see `_unverified`)
                await sandbox.stop_agent()
                return VerifierOutcome(reward=0.0, output="")
            return await run_verifier(verifier, sandbox, baseline[-1])

        agent_time = self.agent_time_limit_s
        verify_time = verifier.config.verifier.timeout_sec if verifier else 0.0
        timeout = options.get("timeout_s") or self.timeout_s
        return RolloutSpec(
            sandbox=prepared.config,
            agent=self.make_agent(item) if self.make_agent else agent,
            instruction=lambda: item.prompt,
            prepare=prepare,
            verify=verify,
            labels={**options.get("labels", {}), "clotho.task": item.id},
            timeout_s=timeout or agent_time + verify_time + SETUP_MARGIN_S,
            agent_time_limit_s=agent_time,
        )


def _unverified(outcome: RolloutOutcome) -> RolloutOutcome:
    """A prompt without a verify command has no reward and did not pass."""
    outcome.verifier = None
    outcome.reward = None
    outcome.rewards = {}
    outcome.passed = False
    return outcome


def model_images(config: EvalConfig) -> str | None:
    """Why this run's model cannot take a prompt's image, or None when it can: only a chat
    endpoint (`--base-url`, api chat) sends content parts; the token APIs render a text
    template and the embedded model reads no images."""
    model = config.model or ModelConfig()
    if model.api != "chat":
        return (
            f"an image needs a chat endpoint with a vision model (--base-url ..., --api chat); "
            f"this run's model is api {model.api}, which reads text only"
        )
    return None


async def run_generate(
    config: EvalConfig,
    items: list[PromptItem],
    out_dir: Path,
    *,
    resume: bool = False,
    verifier_timeout_s: float | None = None,
    listener: Listener | None = None,
) -> GenerateStats:
    """Run every prompt not finished yet, `config.concurrency` at a time; on cancellation
    (Ctrl-C) what finished is kept and the outputs are written from it."""
    notify = listener or (lambda event, data: None)
    if config.agent != "llm":
        raise ConfigError("clotho generate runs the model agent (agent: llm)")
    if any(item.image is not None for item in items) and (why := model_images(config)):
        lines = ", ".join(str(i.line) for i in items if i.image is not None)
        raise ConfigError(f"prompt line(s) {lines} have an image: {why}")
    store = RunStore(out_dir)
    store.prepare(resume)
    store.write_config(config)
    previous = latest(await asyncio.to_thread(store.load_records)) if resume else {}
    done = {k for k, r in previous.items() if r.error is None or not r.error.retried}
    pending = [item for item in items if (item.id, 0) not in done]
    store.supersede({(i.id, 0) for i in pending if (i.id, 0) in previous})
    timeout = verifier_timeout_s or DEFAULT_VERIFIER_TIMEOUT_S
    verifiers = await asyncio.to_thread(
        lambda: {i.id: verifier_task(i, out_dir, timeout) for i in pending if i.verify}
    )
    notify(
        "start", {"total": len(items), "pending": len(pending), "done": len(items) - len(pending)}
    )
    started = time.perf_counter()
    pool = SlotPool(
        PoolConfig(max_size=2 * config.concurrency),
        labels={"clotho.run": f"{out_dir.name}-{secrets.token_hex(3)}"},
    )
    recorder = Recorder(store, config.agent, notify)
    model: Model | None = None
    complete = False
    try:
        async with pool:
            if pending:
                # A chosen toolset that cannot work (no key, provider unreachable) is a
                # ConfigError before the model is loaded or any prompt runs.
                tools = await default_registry(config.tools).prepare(config.toolsets)
                model = await build_model(config.model or ModelConfig())

                def make_agent(item: PromptItem) -> Agent:
                    assert model is not None
                    use = _ImageModel(model, item.image) if item.image is not None else model
                    return llm_agent(
                        use,
                        tools,
                        max_turns=config.max_turns,
                        system_prompt=config.system_prompt,
                        command_timeout_s=config.command_timeout_s,
                    )

                tasks = [
                    PromptTask(
                        item,
                        verifiers.get(item.id),
                        config.task_timeout_s,
                        DEFAULT_AGENT_TIMEOUT_S,
                        make_agent,
                    )
                    for item in pending
                ]
                await _run_pending(config, tasks, pool, recorder)
        complete = True
    finally:
        if model is not None:
            await model.aclose()
        stats = await asyncio.to_thread(
            _finish, store, out_dir, config, [i.id for i in items], started, complete
        )
    return stats


def _finish(
    store: RunStore,
    out_dir: Path,
    config: EvalConfig,
    ids: list[str],
    started: float,
    complete: bool,
) -> GenerateStats:
    """metrics.json (over the verified prompts: an unverified one passes or fails nothing),
    then trajectories.jsonl and generate_stats.json, from what the run directory holds."""
    records = list(latest(store.load_records()).values())
    wanted = set(ids)
    records = [r for r in records if r.task in wanted]
    verified = [r for r in records if r.category == "verified"]
    metrics = compute_metrics(verified, 1)
    metrics.duration_s = round(time.perf_counter() - started, 3)
    finished = {r.task for r in records if r.error is None or not r.error.retried}
    metrics.complete = complete and finished >= wanted
    metrics.n_planned = len(ids)
    metrics.n_finished = len(finished)
    metrics.extra["generate"] = {"prompts": len(ids), "verified": len(verified)}
    store.write_metrics(metrics)
    return write_outputs(out_dir, records, ids, complete=bool(metrics.complete))


async def _run_pending(
    config: EvalConfig, tasks: list[PromptTask], pool: SlotPool, recorder: Recorder
) -> None:
    """Every pending prompt, `concurrency` at a time, each retried within the run's budget
    when the infrastructure lost it (as eval's attempts are)."""
    semaphore = asyncio.Semaphore(config.concurrency)
    budget = retry_budget(config, len(tasks))
    prepared: list[PreparedEnvironment] = []
    preparing = asyncio.Lock()

    async def environment() -> PreparedEnvironment:
        async with preparing:  # one preparation for every prompt (and again after a failure)
            if not prepared:
                prepared.append(await pool.prepare(config.sandbox, ENVIRONMENT))
            return prepared[0]

    async def once(task: PromptTask, retry: bool) -> RolloutOutcome:
        try:
            env = await environment()
        except Exception as exc:
            return RolloutOutcome.failed(exc, "environment")
        async with semaphore:
            if not retry:
                recorder.notify("trial_start", (task.name, 0))
            spec = task.rollout(
                _unused_agent, env, labels={"clotho.attempt": "0"}, timeout_s=config.task_timeout_s
            )
            outcome = await run_rollout(spec, pool)
        return _unverified(outcome) if task.verifier is None else outcome

    async def one(task: PromptTask) -> None:
        async def lost(outcome: RolloutOutcome, before: list[ErrorInfo]) -> None:
            await recorder.lost(task, 0, outcome, before)

        outcome = await run_retried(lambda retry: once(task, retry), budget, on_lost=lost)
        await recorder.outcome(task, 0, outcome, outcome.lost_tries)

    async with asyncio.TaskGroup() as group:
        for task in tasks:
            group.create_task(one(task))


class _NoAgent:
    """Stands in for the shared agent argument of `EvalTask.rollout`: each prompt makes its
    own (`PromptTask.make_agent`), with its image when it has one."""

    name = "llm"

    async def run(self, ctx: Any) -> AgentResult:  # pragma: no cover - never called
        raise AssertionError("PromptTask makes its own agent")


_unused_agent = _NoAgent()
