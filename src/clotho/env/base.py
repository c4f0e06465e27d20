"""`Environment`: the RL environment base class, group rollouts and scoring.

Subclasses give items, prompts and rewards; the base class runs the agent in sandboxes from
a pool, N rollouts per item with the tools resolved once per group, and turns the group into
a `ScoredGroup`. Failures are typed: a sandbox or model failure is an infrastructure error
and keeps the rollout out of training data; a reward function that raises is a verifier
error, reported and counted, never a reward of 0.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import random
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel

from clotho.agent.llm import DEFAULT_SYSTEM_PROMPT
from clotho.agent.loop import AgentLimits, AgentLoop, ChatModel
from clotho.agent.models import build_model
from clotho.agent.result import AgentResult
from clotho.agent.token_model import per_rollout
from clotho.chat.client import ModelConfig
from clotho.chat.ledger import NOT_SAMPLED
from clotho.env.config import EnvConfig
from clotho.env.context import ToolContext
from clotho.env.scored import MASKED, GroupStats, ScoredGroup
from clotho.errors import ClothoError, InfraError
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.trial import ErrorInfo
from clotho.tools.builtin import default_registry
from clotho.tools.registry import Tool
from clotho.tools.runtime import ToolRuntime
from clotho.tools.toolsets import ToolRegistry

log = logging.getLogger(__name__)

Item = TypeVar("Item")


class Rollout(BaseModel):
    """One agent run on one item, scored (or failed, with the kind of failure)."""

    messages: list[dict[str, Any]]
    reward: float | None = None
    error: ErrorInfo | None = None
    agent: AgentResult | None = None

    @property
    def valid(self) -> bool:
        return self.error is None and self.reward is not None


class Environment(abc.ABC, Generic[Item]):
    name: ClassVar[str] = "environment"
    config_cls: ClassVar[type[EnvConfig]] = EnvConfig

    def __init__(
        self,
        config: EnvConfig,
        *,
        model: ChatModel | None = None,
        registry: ToolRegistry | None = None,
        pool: SlotPool | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.registry = registry or default_registry()
        self.pool = pool
        self.rng = random.Random(config.seed)
        self.stats = GroupStats()
        self._tokenizer: Any = None

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

    async def verify(self, item: Item, result: AgentResult, sandbox: Sandbox) -> float | None:
        """In-sandbox verification (e.g. the task's tests); None when there is none."""
        return None

    async def compute_reward(self, item: Item, result: AgentResult, ctx: ToolContext) -> float:
        """The reward of one rollout. Default: `verify` in the rollout's own sandbox."""
        reward = await self.verify(item, result, ctx.sandbox)
        if reward is None:
            raise NotImplementedError(
                f"{type(self).__name__} defines neither verify nor compute_reward"
            )
        return reward

    async def evaluate(self) -> dict[str, Any]:
        """Metrics on the environment's evaluation set."""
        raise NotImplementedError(f"{type(self).__name__} has no evaluation set")

    # -- machinery ---------------------------------------------------------------------

    def resolve_tools(self) -> list[Tool]:
        """The group's tools: a distribution sample, or the configured toolsets."""
        if self.config.distribution:
            return self.registry.sample(
                self.config.distribution, self.rng, self.config.disabled_toolsets
            )
        return self.registry.resolve(self.config.toolsets, self.config.disabled_toolsets)

    def messages_for(self, item: Item, sandbox: Sandbox) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        prompt = self.config.system_prompt or DEFAULT_SYSTEM_PROMPT
        if prompt:
            messages.append({"role": "system", "content": prompt.format(workdir=sandbox.workdir)})
        messages.append({"role": "user", "content": self.format_prompt(item)})
        return messages

    def _require_pool(self) -> SlotPool:
        if self.pool is None:
            self.pool = SlotPool(self.config.pool, labels={"clotho.env": self.name})
            self.pool.start()
        return self.pool

    async def rollout(self, item: Item, tools: Sequence[Tool]) -> Rollout:
        """One rollout in its own sandbox from the pool, released in `finally`."""
        if self.model is None:  # built from the config; no endpoint: the embedded model
            self.model = build_model(self.config.model or ModelConfig())
        pool = self._require_pool()
        messages: list[dict[str, Any]] = []
        try:
            sandbox = await pool.acquire(self.sandbox_config(item))
        except InfraError as exc:
            return Rollout(messages=[], error=ErrorInfo(kind="infra", message=str(exc)))
        try:
            await self.setup_workspace(item, sandbox)
            messages = self.messages_for(item, sandbox)
            limits = AgentLimits(
                max_turns=self.config.max_turns,
                time_limit_s=self.config.time_limit_s,
                max_total_tokens=self.config.max_total_tokens,
            )
            model = per_rollout(self.model)
            loop = AgentLoop(model, tools, ToolRuntime(sandbox=sandbox), limits)
            result = await loop.run(messages)
            if result.stop_reason == "model_error":
                return Rollout(
                    messages=result.messages,
                    agent=result,
                    error=ErrorInfo(kind="infra", message=result.error or "model error"),
                )
            ctx = ToolContext(sandbox, {t.name: t for t in tools})
            try:
                reward = float(await self.compute_reward(item, result, ctx))
            except InfraError:
                raise
            except Exception as exc:  # a broken reward function is not a reward of 0
                log.warning("reward function failed: %s", exc)
                return Rollout(
                    messages=result.messages,
                    agent=result,
                    error=ErrorInfo(kind="verifier", message=f"{type(exc).__name__}: {exc}"),
                )
            return Rollout(messages=result.messages, agent=result, reward=reward)
        except InfraError as exc:
            return Rollout(messages=messages, error=ErrorInfo(kind="infra", message=str(exc)))
        except ClothoError as exc:
            return Rollout(messages=messages, error=ErrorInfo(kind=exc.kind, message=str(exc)))
        finally:
            await asyncio.shield(pool.release(sandbox))

    async def collect_group(self, item: Item) -> tuple[ScoredGroup | None, list[Rollout]]:
        """N rollouts of one item (tools resolved once), scored; None when the group is dropped."""
        tools = self.resolve_tools()
        rollouts = list(
            await asyncio.gather(
                *(self.rollout(item, tools) for _ in range(self.config.group_size))
            )
        )
        self.stats.groups += 1
        self.stats.rollouts += len(rollouts)
        for r in rollouts:
            if r.error is not None and r.error.kind == "infra":
                self.stats.infra_errors += 1
            elif r.error is not None:
                self.stats.verifier_errors += 1
        valid = [r for r in rollouts if r.valid]
        if len(valid) < min(self.config.min_valid_rollouts, self.config.group_size):
            self.stats.dropped_too_few_valid += 1
            return None, rollouts
        scores = [float(r.reward or 0.0) for r in valid]
        if self.config.ensure_scores_are_not_same and len(set(scores)) == 1:
            self.stats.dropped_same_scores += 1
            return None, rollouts
        group = self.score_group(valid, tools)
        if group is None:
            self.stats.dropped_overlong += 1
        return group, rollouts

    def tokenize(
        self, messages: list[dict[str, Any]], tools: Sequence[Tool]
    ) -> tuple[list[int], list[int]]:
        """Tokens and masks (-100 outside assistant turns) from the model's chat template."""
        if not self.config.tokenizer:
            return [], []
        if self._tokenizer is None:
            from clotho.chat.tokenizer import TemplateTokenizer

            self._tokenizer = TemplateTokenizer.from_path(self.config.tokenizer)
        return self._tokenizer.tokens_and_masks(messages, tools=[t.schema() for t in tools] or None)

    def score_group(self, rollouts: list[Rollout], tools: Sequence[Tool]) -> ScoredGroup | None:
        """One row per training sequence: exact ledger sequences from a token backend, else
        the chat template's tokens and masks (phase 1). A rollout whose template rewrote
        earlier turns gives several rows, each with the rollout's score."""
        rows: list[tuple[Rollout, list[int], list[int], list[float] | None]] = []
        for rollout in rollouts:
            sequences = rollout.agent.sequences if rollout.agent is not None else None
            if sequences is not None:
                rows.extend((rollout, s.tokens, s.masks, s.logprobs) for s in sequences)
            else:
                ids, mask = self.tokenize(rollout.messages, tools)
                rows.append((rollout, ids, mask, None))
        limit = self.config.max_token_length
        tokens: list[list[int]] = []
        masks: list[list[int]] = []
        logprobs: list[list[float]] = []
        for _, ids, mask, lps in rows:
            if limit is not None and len(ids) > limit:
                if self.config.overlong == "drop":
                    return None
                ids, mask, lps = ids[:limit], mask[:limit], lps[:limit] if lps else lps
                self.stats.truncated += 1
            tokens.append(ids)
            masks.append(mask)
            logprobs.append(lps if lps is not None else [NOT_SAMPLED] * len(ids))
        exact = all(lps is not None for *_, lps in rows)
        if self.config.model:
            sampling = self.config.model.sampling.model_dump(exclude_none=True)
        else:  # the embedded default: what its token backend samples with
            token_sampling = getattr(self.model, "sampling", None)
            sampling = token_sampling.model_dump(exclude_none=True) if token_sampling else {}
        return ScoredGroup(
            tokens=tokens,
            masks=masks,
            scores=[float(r.reward or 0.0) for r, *_ in rows],
            inference_logprobs=logprobs if exact and rows else None,
            messages=[r.messages for r, *_ in rows],
            generation_params=sampling or None,
        )

    async def close(self) -> None:
        """Close the pool and the model client."""
        if self.pool is not None:
            await self.pool.close()
        aclose = getattr(self.model, "aclose", None)
        if aclose is not None:
            await aclose()


__all__ = ["MASKED", "Environment", "Rollout"]
