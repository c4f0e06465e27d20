"""`Environment`: the RL environment base class, group rollouts and scoring.

Subclasses give items, prompts and rewards; the base class runs N rollouts per item (tools
resolved once per group) through the one rollout path (`clotho.rollout.run_rollout`, which
`clotho eval` uses too) and turns the group into a `ScoredGroup`. Failures are typed and
stay with their rollout: a sandbox or model failure is an infrastructure error, a
`setup_workspace` or `format_prompt` that raises is a task error, a reward function that
raises is a verifier error; none of them is ever a reward, and none stops the run.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from clotho.agent.llm import LLMAgent
from clotho.agent.result import AgentResult
from clotho.chat.client import ModelConfig
from clotho.chat.models import Model, build_model
from clotho.chat.probe import probe_endpoint
from clotho.chat.token_model import TokenModel
from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import NOT_SAMPLED
from clotho.env.checkpoint import rng_state, set_rng_state
from clotho.env.config import EnvConfig
from clotho.env.context import ToolContext
from clotho.env.evaluation import EvalSample
from clotho.env.scored import GroupStats, ScoredGroup
from clotho.errors import ConfigError
from clotho.rollout import (
    RolloutOutcome,
    RolloutSpec,
    VerifierOutcome,
    run_retried,
    run_rollout,
)
from clotho.rollout.agents import llm_agent
from clotho.rollout.run import RetryBudget
from clotho.sandbox import EnvironmentSpec, PreparedEnvironment, Sandbox, SandboxConfig
from clotho.sandbox.backends import missing_extra
from clotho.sandbox.pool import SlotPool
from clotho.tools.builtin import default_registry
from clotho.tools.registry import ToolRegistry
from clotho.tools.tool import Tool

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Key = TypeVar("Key", bound=Hashable)
# One training sequence of a rollout: its tokens, masks and (token backends) logprobs.
_Row = tuple[RolloutOutcome, list[int], list[int], list[float] | None]
# Sees each rollout as it ends: its item, its tools and its outcome.
OnRollout = Callable[[Any, Sequence[Tool], RolloutOutcome], Awaitable[None]]


class Environment(abc.ABC, Generic[Item]):
    name: ClassVar[str] = "environment"
    config_cls: ClassVar[type[EnvConfig]] = EnvConfig

    def __init__(
        self,
        config: EnvConfig,
        *,
        model: Model | None = None,
        registry: ToolRegistry | None = None,
        pool: SlotPool | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.registry = registry or default_registry(config.tools)
        self.pool = pool
        self.rng = random.Random(config.seed)
        self.item_cursor = 0  # how many items were taken, for environments that index by it
        self.stats = GroupStats()
        self._tokenizer: Any = None
        self._loading = asyncio.Lock()  # concurrent first rollouts load the model once
        self._observers: list[OnRollout] = []
        self._retry_observers: list[OnRollout] = []

    # -- hooks -------------------------------------------------------------------------

    async def setup(self) -> None:
        """Load datasets, build indexes; called once before anything else."""

    @abc.abstractmethod
    async def get_next_item(self) -> Item:
        """The next item to train on."""

    @abc.abstractmethod
    def format_prompt(self, item: Item) -> str:
        """The user message for an item."""

    def sandbox_config(self, item: Item) -> SandboxConfig:
        """The sandbox an item needs (default: the environment's)."""
        return self.config.sandbox

    async def setup_workspace(self, item: Item, sandbox: Sandbox) -> None:
        """Prepare the sandbox before the agent starts (files, repositories)."""

    async def verify(
        self, item: Item, result: AgentResult, sandbox: Sandbox
    ) -> float | VerifierOutcome | None:
        """In-sandbox verification (e.g. the task's tests); None when there is none."""
        return None

    async def compute_reward(
        self, item: Item, result: AgentResult, ctx: ToolContext
    ) -> float | VerifierOutcome:
        """The reward of one rollout (or the test script's whole verdict). Default: `verify`
        in the rollout's own sandbox."""
        reward = await self.verify(item, result, ctx.sandbox)
        if reward is None:
            raise NotImplementedError(
                f"{type(self).__name__} defines neither verify nor compute_reward"
            )
        return reward

    async def evaluation_items(self) -> Sequence[Item]:
        """The items of the environment's evaluation set (what `evaluate()` runs)."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluation set")

    def sample_label(self, item: Item) -> tuple[str, str]:
        """An evaluated item's name and category in the run directory."""
        return str(getattr(item, "name", item)), "uncategorized"

    async def evaluate(self) -> list[EvalSample]:
        """One sample per item of `evaluation_items()`, `eval_concurrency` rollouts at a
        time, each through the rollout path training uses (infra failures retried)."""
        items = await self.evaluation_items()
        tools = self.resolve_tools()
        semaphore = asyncio.Semaphore(self.config.eval_concurrency)

        async def one(item: Item) -> EvalSample:
            async with semaphore:
                rollout = await self.rollout(item, tools)
            name, category = self.sample_label(item)
            return EvalSample(name=name, category=category, rollout=rollout)

        return list(await asyncio.gather(*(one(item) for item in items)))

    def has_evaluation(self) -> bool:
        """Whether `evaluate()` can run (serve refuses `steps_per_eval` otherwise). Default:
        the subclass gives an evaluation set (or its own `evaluate`); one whose evaluation
        set is configured says so."""
        cls = type(self)
        return (
            cls.evaluate is not Environment.evaluate
            or cls.evaluation_items is not Environment.evaluation_items
        )

    # -- resuming (clotho serve --state-dir) --------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What `get_next_item` reads and changes, as JSON: after `load_state_dict` of it (on
        an environment that ran `setup()`), the next `get_next_item` returns exactly the item
        it would have returned when the state was taken. Default: the RNG and `item_cursor`,
        enough for an environment that picks items by `item_cursor` and `rng` alone; one that
        keeps its position elsewhere adds it (and calls super)."""
        return {"rng": rng_state(self.rng), "item_cursor": self.item_cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`; a state that does not fit is a ConfigError."""
        set_rng_state(self.rng, state.get("rng"))
        cursor = state.get("item_cursor", 0)
        if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
            raise ConfigError(f"item_cursor in the serve state is {cursor!r}, not a count")
        self.item_cursor = cursor

    # -- machinery ---------------------------------------------------------------------

    def resolve_tools(self) -> list[Tool]:
        """The group's tools: a distribution sample, or the configured toolsets."""
        if self.config.distribution:
            return self.registry.sample(
                self.config.distribution, self.rng, self.config.disabled_toolsets
            )
        return self.registry.resolve(self.config.toolsets, self.config.disabled_toolsets)

    def untrainable(self) -> str | None:
        """Why groups of this environment would carry no tokens to train on, if they would."""
        if self.config.tokenizer:
            return None
        if self.model is not None:
            token_backend = isinstance(self.model, TokenModel)
        else:
            token_backend = self.config.model is None or self.config.model.api != "chat"
        if token_backend:
            return None
        return (
            "on a chat endpoint the groups' tokens come from the model's chat template, and no "
            "tokenizer is configured: give --tokenizer (a folder or tokenizer.json with the "
            "chat template), or use a token API (--set model.api=vllm|sglang)"
        )

    async def preflight(self) -> None:
        """Refuse, before the first rollout, a run that cannot work: the tokenizer is read,
        the model built (a missing extra says which) and a remote endpoint asked whether it
        answers, so a wrong path, URL or key is one clear error and not a run of infra errors.
        The commands call it after `setup()`."""
        missing = missing_extra(self.config.sandbox)
        if missing is not None:
            raise ConfigError(missing)
        await self.prepare_tools()
        if self.config.tokenizer and self._tokenizer is None:
            self._tokenizer = await asyncio.to_thread(
                TemplateTokenizer.from_path, self.config.tokenizer
            )
        await self._require_model()
        config = self.config.model
        if config is not None and config.api != "local":
            for url in config.base_urls:
                await probe_endpoint(url, config.api_key_env)

    async def prepare_tools(self) -> None:
        """Every toolset a group can be given, checked and probed once (a distribution: each
        it can draw): one that cannot work here (no key, an unreachable provider, named by
        its `tools.*` setting) is a ConfigError before the first rollout."""
        if self.config.distribution:
            await self.registry.prepare_distribution(
                self.config.distribution, self.config.disabled_toolsets
            )
        else:
            await self.registry.prepare(self.config.toolsets, self.config.disabled_toolsets)

    def _require_pool(self) -> SlotPool:
        if self.pool is None:
            self.pool = SlotPool(self.config.pool, labels={"clotho.env": self.name})
            self.pool.start()
        return self.pool

    async def _require_model(self) -> Model:
        async with self._loading:
            if self.model is None:  # built from the config; no endpoint: the embedded model
                self.model = await build_model(self.config.model or ModelConfig())
        return self.model

    async def prepare_environments(
        self, specs: Mapping[Key, EnvironmentSpec]
    ) -> dict[Key, PreparedEnvironment]:
        """Each task environment prepared (its image built or found, its limits applied) on
        the configured sandbox, `prepare_concurrency` at a time: N tasks' images build side
        by side, not one after another. The first failure stops the rest and is raised as
        itself (a task whose image cannot build is a one-line `TaskError`)."""
        pool = self._require_pool()
        semaphore = asyncio.Semaphore(self.config.prepare_concurrency)
        prepared: dict[Key, PreparedEnvironment] = {}

        async def one(key: Key, spec: EnvironmentSpec) -> None:
            async with semaphore:
                prepared[key] = await pool.prepare(self.config.sandbox, spec)

        try:
            async with asyncio.TaskGroup() as group:
                for key, spec in specs.items():
                    group.create_task(one(key, spec))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        return {key: prepared[key] for key in specs}

    def agent(self, tools: Sequence[Tool]) -> LLMAgent:
        """The agent of one rollout (the model is loaded by then), from the factory
        `clotho eval` uses."""
        assert self.model is not None
        return llm_agent(
            self.model,
            tools,
            max_turns=self.config.max_turns,
            time_limit_s=self.config.time_limit_s,
            max_total_tokens=self.config.max_total_tokens,
            system_prompt=self.config.system_prompt,
        )

    def rollout_spec(self, item: Item, tools: Sequence[Tool]) -> RolloutSpec:
        """The attempt one rollout of `item` makes. Environments over a task format return
        that format's own attempt, the very one `clotho eval` runs (its sandbox, workspace,
        limits, wall clock and verifier); this default adapter is built from the hooks
        (`sandbox_config`, `setup_workspace`, `compute_reward`) and `rollout_timeout_s`."""
        by_name = {t.name: t for t in tools}

        async def prepare(sandbox: Sandbox) -> None:
            await self.setup_workspace(item, sandbox)

        async def verify(sandbox: Sandbox, result: AgentResult) -> VerifierOutcome:
            reward = await self.compute_reward(
                item, result, ToolContext(sandbox, by_name, self.registry)
            )
            if isinstance(reward, VerifierOutcome):
                return reward
            return VerifierOutcome(reward=float(reward))

        return RolloutSpec(
            sandbox=self.sandbox_config(item),
            agent=self.agent(tools),
            instruction=lambda: self.format_prompt(item),
            prepare=prepare,
            verify=verify,
            timeout_s=self.config.rollout_timeout_s,
        )

    def on_rollout(self, observer: OnRollout) -> None:
        """Call `observer(item, tools, outcome)` after each rollout, errored ones and those
        of dropped groups included (an SFT export sees what a sink never receives)."""
        self._observers.append(observer)

    def on_retry(self, observer: OnRollout) -> None:
        """Call `observer(item, tools, outcome)` with each try lost to an infra error, before
        it runs again (`on_rollout` sees only the outcome that stands)."""
        self._retry_observers.append(observer)

    async def rollout(self, item: Item, tools: Sequence[Tool]) -> RolloutOutcome:
        """One rollout of `item` through the one rollout path, in a sandbox from the pool; a
        try lost to an infra error runs again, up to `retries` times, as in `clotho eval`
        (the agent's failures never do). The lost tries' errors stay on the outcome."""
        await self._require_model()
        pool = self._require_pool()
        retries = RetryBudget(self.config.retries, self.config.retries)

        async def attempt(retry: bool) -> RolloutOutcome:
            return await run_rollout(self.rollout_spec(item, tools), pool)

        async def lost(outcome: RolloutOutcome, before: list[Any]) -> None:
            log.warning(
                "a %s rollout was lost to the infrastructure (try %d), running it again: %s",
                self.name, len(before) + 1, outcome.error.message if outcome.error else "",
            )  # fmt: skip
            for observer in self._retry_observers:
                await observer(item, tools, outcome)

        outcome = await run_retried(attempt, retries, on_lost=lost)
        for observer in self._observers:
            await observer(item, tools, outcome)
        if outcome.error is not None and outcome.error.kind == "verifier":
            log.warning("reward of a %s rollout failed: %s", self.name, outcome.error.message)
        return outcome

    async def collect_group(self, item: Item) -> tuple[ScoredGroup | None, list[RolloutOutcome]]:
        """N rollouts of one item (tools resolved once), scored; None when the group is dropped."""
        tools = self.resolve_tools()
        rollouts = list(
            await asyncio.gather(
                *(self.rollout(item, tools) for _ in range(self.config.group_size))
            )
        )
        self.stats.count(rollouts)
        # Training reads an outcome as eval does: a failure the agent caused (its limit, its
        # broken sandbox, tampering, a verifier that found nothing to pass) stays in the group
        # with `failure_score`; only failures that say nothing about the policy leave it.
        valid = [r for r in rollouts if r.trainable]
        if len(valid) < min(self.config.min_valid_rollouts, self.config.group_size):
            self.stats.dropped_too_few_valid += 1
            return None, rollouts
        scores = [r.training_score(self.config.failure_score) for r in valid]
        if self.config.ensure_scores_are_not_same and len(set(scores)) == 1:
            self.stats.dropped_same_scores += 1
            return None, rollouts
        if self.config.tokenizer and self._tokenizer is None:  # a tokenizer.json takes a while
            async with self._loading:
                if self._tokenizer is None:
                    self._tokenizer = await asyncio.to_thread(
                        TemplateTokenizer.from_path, self.config.tokenizer
                    )
        # Rendering a chat template and encoding long conversations takes a while: done in a
        # thread, so the loop keeps driving the other groups' rollouts meanwhile.
        rows = await asyncio.to_thread(self._token_rows, valid, tools)
        return self._group_of(rows), rollouts

    def tokenize(
        self, messages: list[dict[str, Any]], tools: Sequence[Tool]
    ) -> tuple[list[int], list[int]]:
        """Tokens and masks (-100 outside assistant turns) from the model's chat template."""
        if not self.config.tokenizer:
            return [], []
        if self._tokenizer is None:  # loaded off the loop by collect_group; here for direct use
            self._tokenizer = TemplateTokenizer.from_path(self.config.tokenizer)
        return self._tokenizer.tokens_and_masks(messages, tools=[t.schema() for t in tools] or None)

    def score_group(
        self, rollouts: list[RolloutOutcome], tools: Sequence[Tool]
    ) -> ScoredGroup | None:
        """One row per training sequence: exact ledger sequences from a token backend, else
        the chat template's tokens and masks (phase 1). A rollout whose template rewrote
        earlier turns gives several rows, each with the rollout's score. (`collect_group`
        tokenizes in a thread; this is the same for direct, synchronous use.)"""
        return self._group_of(self._token_rows(rollouts, tools))

    def _token_rows(self, rollouts: list[RolloutOutcome], tools: Sequence[Tool]) -> list[_Row]:
        """Each rollout's sequences: its ledger's, or its messages tokenized. Touches no
        shared state, so it can run in a worker thread."""
        rows: list[_Row] = []
        for rollout in rollouts:
            sequences = rollout.agent.sequences if rollout.agent is not None else None
            if sequences is not None:
                rows.extend((rollout, s.tokens, s.masks, s.logprobs) for s in sequences)
            else:
                ids, mask = self.tokenize(rollout.messages, tools)
                rows.append((rollout, ids, mask, None))
        return rows

    def _group_of(self, rows: list[_Row]) -> ScoredGroup | None:
        """The group of the rows (counting what is dropped or truncated)."""
        # A token backend's rollout stopped before its first token has no sequence to train.
        rows = [row for row in rows if row[1] or row[3] is None]
        if not rows:
            self.stats.dropped_no_tokens += 1
            return None
        limit = self.config.max_token_length
        tokens: list[list[int]] = []
        masks: list[list[int]] = []
        logprobs: list[list[float]] = []
        for _, ids, mask, lps in rows:
            if limit is not None and len(ids) > limit:
                if self.config.overlong == "drop":
                    self.stats.dropped_overlong += 1
                    return None
                ids, mask, lps = ids[:limit], mask[:limit], lps[:limit] if lps else lps
                self.stats.truncated += 1
            tokens.append(ids)
            masks.append(mask)
            logprobs.append(lps if lps is not None else [NOT_SAMPLED] * len(ids))
        exact = all(lps is not None for *_, lps in rows)
        if self.config.model:
            sampling = self.config.model.sampling.model_dump(exclude_none=True)
        elif isinstance(self.model, TokenModel):  # the embedded default: what it samples with
            sampling = self.model.sampling.model_dump(exclude_none=True)
        else:
            sampling = {}
        return ScoredGroup(
            tokens=tokens,
            masks=masks,
            scores=[r.training_score(self.config.failure_score) for r, *_ in rows],
            inference_logprobs=logprobs if exact and rows else None,
            messages=[r.messages for r, *_ in rows],
            generation_params=sampling or None,
        )

    async def close(self) -> None:
        """Close the pool and the model client, and let the tokenizer go."""
        if self.pool is not None:
            await self.pool.close()
        if self.model is not None:
            await self.model.aclose()
        if self._tokenizer is not None:  # freeing a large vocabulary takes ~0.1 s of CPU
            held, self._tokenizer = [self._tokenizer], None
            await asyncio.to_thread(held.clear)
