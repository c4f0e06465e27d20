"""`endless`: terminal tasks written by a model as they are needed (the Endless-Terminals idea).

`get_next_item` asks the generator model for a task (instruction, initial files and setup
script, final-state tests, reference solution), builds it as a Harbor task directory, and
keeps it only if it is sound: the tests fail on the initial state and pass after the
reference solution, each checked in its own sandbox from the pool through the same trial
path `clotho eval` uses. Anything else (a garbled reply, a hostile file name, a setup that
fails, a task that is already solved or that its own solution cannot solve) is discarded and
counted by reason in `stats.discarded`; after `max_generation_attempts` discarded candidates
in a row, `get_next_item` raises a `TaskError` naming the reasons.

A task takes minutes to write, build and check, and the serve driver takes items one at a
time (under the ledger's lock), so tasks are generated ahead: from the first
`get_next_item`, up to `generate_ahead` (default `max_num_workers`) generations run in the
background, feeding a queue of sound tasks that `get_next_item` takes from. A generation that
gives up keeps its error, which `get_next_item` raises when no task is ready or coming.

The model's reply is read in a thread (`parse_reply`, linear in the reply) and only
bubblewrap or container sandboxes run what it wrote: `unsafe-local` is refused.

A kept task is an ordinary Harbor task, so every rollout of its group is verified like one:
its workspace is uploaded, the verifier's programs are fingerprinted before the agent starts,
and its tests run in the rollout's own sandbox after the agent is stopped (`run_verifier`).
The task folder lives as long as the environment (or for good under `save_tasks`), so all
rollouts of a group, and later groups, can use it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections import Counter, deque
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from clotho.chat.client import ModelConfig
from clotho.chat.models import Model, build_model
from clotho.env.base import Environment
from clotho.env.config import EnvConfig
from clotho.env.scored import GroupStats
from clotho.envs.endless_build import (
    BuildSettings,
    check_soundness,
    discard,
    materialize,
    task_digest,
)
from clotho.envs.endless_spec import (
    SYSTEM_PROMPT,
    USER_PROMPT,
    GenerationLimits,
    Rejected,
    parse_reply,
    slug,
)
from clotho.envs.harbor_rollouts import HarborRollouts
from clotho.errors import ClothoError, ConfigError, ModelError, TaskError
from clotho.tasks.environment import environment_spec
from clotho.tasks.harbor import Task, discover_tasks, load_task

log = logging.getLogger(__name__)

STAGING = ".staging"
_FOLDER = re.compile(r"[a-z0-9][a-z0-9-]*")  # a generated task's folder name, never a path
ITEMS_FILE = ".endless-items.jsonl"  # item number -> task folder, one JSON line per item
_RUN = re.compile(r"[0-9a-f]{32}")  # a run's tag in the item record


_NO_EVALUATION_SET = (
    "endless has no evaluation set: give eval_tasks (folders of Harbor tasks, e.g. an earlier "
    "run's save_tasks), or drop steps_per_eval"
)


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as file:
        file.write(line)
        file.flush()
        os.fsync(file.fileno())


class EndlessConfig(EnvConfig):
    generator_model: ModelConfig | None = Field(
        None, description="the model that writes tasks (default: the environment's model)"
    )
    save_tasks: str | None = Field(
        None,
        description="folder that keeps every sound generated task as a Harbor task directory "
        "(default: a temporary folder removed on close)",
    )
    max_generation_attempts: int = Field(
        8, ge=1, description="candidates in a row before a generation gives up"
    )
    generate_ahead: int | None = Field(
        None,
        ge=0,
        description="sound tasks generated ahead of demand (in flight or ready), each by its "
        "own concurrent generation; None: max_num_workers; 0: only when asked",
    )
    topics: list[str] = Field(
        default_factory=list, description="topics, one drawn per request (none: any task)"
    )
    setup_timeout_s: float = Field(120.0, gt=0, description="the setup script, once per task")
    test_timeout_s: float = Field(60.0, gt=0, description="the final-state checks, per run")
    solution_timeout_s: float = Field(120.0, gt=0, description="the reference solution")
    agent_timeout_s: float = Field(600.0, gt=0, description="task.toml's agent limit")
    max_workspace_bytes: int = Field(16 << 20, ge=1, description="the built workspace, as tar")
    limits: GenerationLimits = Field(default_factory=GenerationLimits)
    harbor_base_image: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$",
        description="write environment/Dockerfile FROM this image into each task (for "
        "Docker-based Harbor runners; container backends then build it per task)",
    )
    eval_tasks: list[str] | None = Field(
        None, description="Harbor task folders for evaluate(), e.g. an earlier save_tasks"
    )


class EndlessStats(GroupStats):
    """Group stats plus what happened to the generated tasks."""

    tasks_generated: int = Field(0, description="candidate tasks requested from the generator")
    tasks_kept: int = Field(0, description="sound tasks (served as items, or ready to be)")
    tasks_discarded: int = 0
    discarded: dict[str, int] = Field(
        default_factory=dict,
        description="discarded candidates by reason: model_error, unparseable, invalid, "
        "duplicate, setup_failed, workspace_too_large, passes_initially, solution_fails, "
        "check_error",
    )


class EndlessEnv(HarborRollouts, Environment[Task]):
    name: ClassVar[str] = "endless"
    config_cls: ClassVar[type[EnvConfig]] = EndlessConfig
    config: EndlessConfig
    stats: EndlessStats

    def __init__(self, config: EnvConfig, **kwargs: Any) -> None:
        """`Environment`'s arguments (model, registry, pool), plus the generation state."""
        super().__init__(config, **kwargs)
        self.stats = EndlessStats()
        self.generator: Model | None = None
        self._own_generator = False
        self._temporary: Path | None = None
        self._init_rollouts()
        self.tasks: list[Task] = []
        self._seen: set[str] = set()
        self._eval_tasks: list[Task] | None = None
        # The item record: this run's items; None after load_state_dict (read it back).
        self._run: str | None = uuid.uuid4().hex
        self._items: dict[int, str] | None = {}
        # Generation ahead: sound tasks ready to be taken, errors of generations that gave up.
        self._ready: deque[Task] = deque()
        self._errors: deque[Exception] = deque()
        self._changed = asyncio.Event()  # a generation ended
        self._producers: set[asyncio.Task[None]] = set()
        self._generating = 0
        self._waiting = 0
        self._closing = False

    # -- setup -------------------------------------------------------------------------

    async def setup(self) -> None:
        if self.config.sandbox.backend == "unsafe-local":
            raise ConfigError(
                "endless runs model-written setup scripts, tests and solutions: it needs an "
                "isolating sandbox (local bubblewrap or docker), not unsafe-local"
            )
        if self.config.steps_per_eval and not self.has_evaluation():
            raise ConfigError(_NO_EVALUATION_SET)
        if self.config.save_tasks:
            self.folder = Path(self.config.save_tasks).resolve()
            await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)
        else:
            self._temporary = Path(
                await asyncio.to_thread(tempfile.mkdtemp, prefix="clotho-endless-")
            )
            self.folder = self._temporary
        self._require_pool()

    def has_evaluation(self) -> bool:
        return bool(self.config.eval_tasks)

    @property
    def build_settings(self) -> BuildSettings:
        c = self.config
        return BuildSettings(
            setup_timeout_s=c.setup_timeout_s,
            test_timeout_s=c.test_timeout_s,
            solution_timeout_s=c.solution_timeout_s,
            agent_timeout_s=c.agent_timeout_s,
            max_workspace_bytes=c.max_workspace_bytes,
            base_image=c.harbor_base_image,
        )

    async def _require_generator(self) -> Model:
        if self.generator is None:
            if self.config.generator_model is not None:
                self.generator = await build_model(self.config.generator_model)
                self._own_generator = True
            else:  # the environment's model (no model configured: the embedded one)
                self.generator = await self._require_model()
        return self.generator

    # -- items -------------------------------------------------------------------------

    async def get_next_item(self) -> Task:
        """The next sound task generated (ahead); a `TaskError` (or `ModelError`) when its
        generation gave up after `max_generation_attempts` discarded candidates. Under
        `save_tasks`, item N is recorded, and served again (not regenerated) when a resumed
        run asks for item N (`load_state_dict`)."""
        index = self.item_cursor
        self.item_cursor += 1  # taken now: concurrent calls get their own numbers
        task = await self._recorded(index)
        if task is None:
            task = await self._take_ready()
            await self._record(index, task)
        return task

    async def _take_ready(self) -> Task:
        """A ready task. A generation's error is raised once no task is ready and none is in
        flight that could bring one (while it waits, no new generation starts)."""
        self._waiting += 1
        try:
            while not self._ready:
                if self._errors and not self._generating:
                    raise self._errors.popleft()
                self._refill()
                self._changed.clear()
                await self._changed.wait()
            task = self._ready.popleft()
        finally:
            self._waiting -= 1
        self._refill()  # the one taken is replaced
        return task

    def _refill(self) -> None:
        """Start generations until `generate_ahead` are in flight or ready (at least one per
        waiting caller, up to `max_num_workers`); none while an error waits to be raised."""
        c = self.config
        ahead = c.max_num_workers if c.generate_ahead is None else c.generate_ahead
        target = max(ahead, min(self._waiting, c.max_num_workers))
        while (
            not self._closing and not self._errors and self._generating + len(self._ready) < target
        ):
            self._generating += 1
            producer = asyncio.create_task(self._produce(), name="endless-generate")
            self._producers.add(producer)
            producer.add_done_callback(self._producers.discard)

    async def _produce(self) -> None:
        """One generation, its task or its error kept for `get_next_item`."""
        try:
            self._ready.append(await self._generate())
        except Exception as exc:  # raised by a get_next_item (`_take_ready`)
            self._errors.append(exc)
        finally:
            self._generating -= 1
            self._changed.set()

    async def _generate(self) -> Task:
        reasons: Counter[str] = Counter()
        last: Rejected | None = None
        for _ in range(self.config.max_generation_attempts):
            try:
                return await self._candidate()
            except Rejected as rejected:
                reasons[rejected.reason] += 1
                last = rejected
                self.stats.tasks_discarded += 1
                self.stats.discarded[rejected.reason] = (
                    self.stats.discarded.get(rejected.reason, 0) + 1
                )
                log.info("generated task discarded: %s", rejected)
        summary = ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
        message = (
            f"the task generator produced no sound task in {self.config.max_generation_attempts} "
            f"attempts ({summary}); last: {last}"
        )
        if set(reasons) == {"model_error"}:
            raise ModelError(message)
        raise TaskError(message)

    def _messages(self) -> list[dict[str, str]]:
        topic = f" about {self.rng.choice(self.config.topics)}" if self.config.topics else ""
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT.format(topic=topic)},
        ]

    async def _candidate(self) -> Task:
        """One generated task, built and checked; `Rejected` when it is not kept."""
        self.stats.tasks_generated += 1
        generator = await self._require_generator()
        try:
            turn = await generator.session().complete(self._messages())
        except ClothoError as exc:
            raise Rejected("model_error", str(exc)[:300]) from exc
        text = turn.content or turn.reasoning or ""
        # up to 400k characters of untrusted text: read off the loop
        spec = await asyncio.to_thread(parse_reply, text, self.config.limits)
        name = f"{slug(spec.name)}-{task_digest(spec)}"
        final = self.folder / name
        if name in self._seen or final.exists():
            raise Rejected("duplicate", f"{name} was generated before")
        self._seen.add(name)  # kept or not: the same candidate is never checked twice
        staging = self.folder / STAGING / f"{name}-{uuid.uuid4().hex[:8]}" / name
        pool = self._require_pool()
        base = self.config.sandbox
        try:
            task = await materialize(spec, staging, base, pool, self.build_settings)
            soundness = await check_soundness(task, base, pool, self.build_settings)
            problem = soundness.problem()
            if problem is not None:
                raise problem
            try:
                await asyncio.to_thread(os.rename, staging, final)
            except OSError as exc:  # another call kept the same task meanwhile
                raise Rejected("duplicate", f"{name}: {exc}") from exc
        except TaskError as exc:  # the directory we wrote does not load: the spec's fault
            raise Rejected("invalid", str(exc)[:300]) from exc
        finally:
            await asyncio.to_thread(discard, staging.parent)
        task = await asyncio.to_thread(load_task, final)
        self._prepared[task.path] = await pool.prepare(base, environment_spec(task))
        self.tasks.append(task)
        self.stats.tasks_kept += 1
        log.info("generated task kept: %s", final)
        return task

    # -- the item record (resume) ------------------------------------------------------

    async def _recorded(self, index: int) -> Task | None:
        """Item `index` as this run (resumed, or before its resume) served it, if its folder
        is kept. A fresh run has no items yet: other runs' records are not its own."""
        if self._items is None:
            self._items = await asyncio.to_thread(self._read_items, self._run)
        name = self._items.get(index)
        if name is None or not (self.folder / name).is_dir():
            return None
        task = await asyncio.to_thread(load_task, self.folder / name)
        if task.path not in self._prepared:
            spec = environment_spec(task)
            self._prepared[task.path] = await self._require_pool().prepare(
                self.config.sandbox, spec
            )
        return task

    async def _record(self, index: int, task: Task) -> None:
        if self._items is not None:
            self._items[index] = task.name
        if self._temporary is None:  # saved tasks: the record outlives the run
            line = json.dumps({"item": index, "task": task.name, "run": self._run}) + "\n"
            await asyncio.to_thread(_append, self.folder / ITEMS_FILE, line)

    def _read_items(self, run: str | None) -> dict[int, str]:
        """The items the record has of `run` (None: those of runs before run tags)."""
        items: dict[int, str] = {}
        path = self.folder / ITEMS_FILE
        if not path.is_file():
            return items
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                entry = json.loads(line)
                index, name, tag = entry["item"], entry["task"], entry.get("run")
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("%s line %d is not an item record; ignored", path, number)
                continue
            if tag != run:
                continue
            if isinstance(index, int) and isinstance(name, str) and _FOLDER.fullmatch(name):
                items[index] = name  # the last record of an item wins
        return items

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "save_tasks": self.config.save_tasks, "run": self._run}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("save_tasks")
        mine = self.config.save_tasks
        if saved is not None and mine is not None and Path(saved).resolve() != Path(mine).resolve():
            raise ConfigError(
                f"the serve state was saved with save_tasks={saved}, not {mine}: "
                "its items are recorded there"
            )
        run = state.get("run")  # absent in states saved before runs were tagged
        if run is not None and not (isinstance(run, str) and _RUN.fullmatch(run)):
            raise ConfigError(f"run in the serve state is {run!r}, not a run tag")
        super().load_state_dict(state)
        self._run = run  # its items are served again, and new ones recorded under it
        self._items = None  # read back on the next get_next_item

    # -- rollouts ----------------------------------------------------------------------

    async def evaluation_items(self) -> list[Task]:
        """Each task under `eval_tasks` (say, the tasks an earlier run saved), once."""
        if not self.config.eval_tasks:
            raise ConfigError(_NO_EVALUATION_SET)
        if self._eval_tasks is None:
            paths = [Path(p) for p in self.config.eval_tasks]
            tasks, errors = await asyncio.to_thread(discover_tasks, paths)
            if errors:
                raise ConfigError("; ".join(str(e) for _, e in errors))
            if not tasks:
                raise ConfigError(f"no tasks under {self.config.eval_tasks}")
            self._prepared.update(
                await self.prepare_environments({t.path: environment_spec(t) for t in tasks})
            )
            self._eval_tasks = tasks
        return self._eval_tasks

    def sample_label(self, item: Task) -> tuple[str, str]:
        return item.name, item.category

    async def close(self) -> None:
        self._closing = True
        producers = list(self._producers)
        for producer in producers:
            producer.cancel()
        await asyncio.gather(*producers, return_exceptions=True)
        try:
            await super().close()
            if self._own_generator and self.generator is not None:
                await self.generator.aclose()
        finally:
            if self._temporary is not None:
                await asyncio.to_thread(shutil.rmtree, self._temporary, True)
            elif getattr(self, "folder", None) is not None:
                await asyncio.to_thread(shutil.rmtree, self.folder / STAGING, True)
