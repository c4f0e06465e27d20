"""SWE instances as an RL environment (`clotho process|serve|evaluate swe`): the problem
statement is the prompt, the repository at its base commit is the workspace (/testbed), the
instance's FAIL_TO_PASS and PASS_TO_PASS tests are the reward. Instances come from files
(`instances`: .jsonl/.json/.parquet files, `hf:NAME` datasets, `DatasetSource`s whose
`fields` map differently named columns), or are generated on the fly from a repository
(`generate`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from clotho.agent.llm import LLMAgent
from clotho.data import DatasetSource, source_list
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.pass_order import PassOrder, PassOrdered
from clotho.errors import ConfigError
from clotho.rollout import RolloutSpec
from clotho.sandbox import PreparedEnvironment
from clotho.swe.examples import TOY_INSTANCES
from clotho.swe.instance import SweInstance, SweOptions, load_instances
from clotho.swe.repos import RepoCache
from clotho.swe.trial import SweTrial, instruction
from clotho.tools.tool import Tool


class SweEnvConfig(EnvConfig):
    instances: list[str | DatasetSource] = Field(
        default_factory=lambda: [str(TOY_INSTANCES)],
        description="instance files (.jsonl/.json/.parquet), `hf:NAME?split=test` datasets, "
        "or dataset sources ({path|hub, split, config, fields, limit, ...})",
    )
    eval_instances: list[str | DatasetSource] | None = Field(
        None, description="like `instances`; default: the training ones"
    )
    generate: str | None = Field(
        None, description="a git repository to generate instances from (instead of files)"
    )
    generate_n: int = Field(10, ge=1)
    max_items: int = Field(0, ge=0, description="instances used (0: all)")
    shuffle: bool = True
    swe: SweOptions = Field(default_factory=SweOptions)


class SweEnv(PassOrdered, Environment[SweInstance]):
    name: ClassVar[str] = "swe"
    config_cls: ClassVar[type[EnvConfig]] = SweEnvConfig
    config: SweEnvConfig

    async def setup(self) -> None:
        options = self.config.swe
        self.cache = RepoCache(
            options.cache_path(),
            repos_dir=Path(options.repos_dir) if options.repos_dir else None,
            network=options.network_clone,
        )
        if self.config.generate:
            from clotho.swe.generate import generate

            records = await generate(
                Path(self.config.generate), n=self.config.generate_n, seed=self.config.seed,
                sandbox_config=self.config.sandbox,
            )  # fmt: skip
            self.instances = [SweInstance.model_validate(r) for r in records]
        else:
            self.instances = await self._load(self.config.instances)
        if self.config.max_items:
            self.instances = self.instances[: self.config.max_items]
        if not self.instances:
            raise ConfigError("no SWE instances to run")
        self.eval_instances = (
            await self._load(self.config.eval_instances)
            if self.config.eval_instances
            else self.instances
        )
        self.trials = {
            i.instance_id: SweTrial(i, options, self.cache)
            for i in [*self.instances, *self.eval_instances]
        }
        self._order = PassOrder(
            self.instances, lambda i: i.instance_id,
            seed=self.config.seed, shuffle=self.config.shuffle,
        )  # fmt: skip
        specs = {}  # one preparation per image, several at a time
        for trial in self.trials.values():
            spec = trial.environment_spec()
            specs.setdefault(spec.image or "", spec)
        self._prepared: dict[str, PreparedEnvironment] = await self.prepare_environments(specs)

    @staticmethod
    async def _load(sources: list[str | DatasetSource]) -> list[SweInstance]:
        """Every instance of every source (read in a worker thread); a bad record stops the
        setup with its error (and the count of others), since a training set with holes
        would skew what the trainer sees without anyone noticing."""
        found: list[SweInstance] = []
        seen: set[str] = set()
        for source in source_list(sources):
            instances, errors = await asyncio.to_thread(load_instances, source)
            if errors:
                more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
                raise ConfigError("; ".join(str(e) for _, e in errors[:5]) + more)
            for instance in instances:
                if instance.instance_id in seen:
                    raise ConfigError(
                        f"{source.label}: instance {instance.instance_id} is also in an "
                        "earlier source"
                    )
                seen.add(instance.instance_id)
            found += instances
        return found

    def agent(self, tools: Sequence[Tool]) -> LLMAgent:
        """The base agent, bounded by `swe.agent_timeout_s` unless `time_limit_s` is set: a
        SWE rollout is never unbounded in time (clotho eval bounds it the same way)."""
        agent = super().agent(tools)
        if self.config.time_limit_s is None:
            limit = self.config.swe.agent_timeout_s
            agent.limits = agent.limits.model_copy(update={"time_limit_s": limit})
        return agent

    def format_prompt(self, item: SweInstance) -> str:
        return instruction(item, self.config.swe.testbed)

    def rollout_spec(self, item: SweInstance, tools: Sequence[Tool]) -> RolloutSpec:
        """The attempt `clotho eval` makes at the instance (`SweTrial.rollout`: the repository
        at its base commit, the install, the program baseline, the instance's tests and its
        wall clock), with this environment's agent."""
        prepared = self._prepared[item.docker_image or ""]
        spec = self.trials[item.instance_id].rollout(self.agent(tools), prepared)
        spec.solution_dir = None  # the model's agent never sees the reference patch
        return spec

    async def evaluation_items(self) -> list[SweInstance]:
        return self.eval_instances

    def sample_label(self, item: SweInstance) -> tuple[str, str]:
        return item.instance_id, item.repo_category
