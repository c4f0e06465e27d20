"""`clotho serve`'s lifecycle: it stops at `total_steps`, evaluates at each `steps_per_eval`
boundary once, resumes from its state folder without repeating or skipping an item, and keeps
at most `max_num_workers` groups in flight.

Real parts: `clotho api` (in-process, on 127.0.0.1), a trainer pulling `/batch` over HTTP
(`ScriptedTrainer`, what Atropos' reference trainer does), `clotho serve` as a subprocess,
Harbor task directories verified in bubblewrap sandboxes, the Qwen tokenizer. The model is
`ScriptedOpenAIServer`, the named test double for a hosted model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import yaml
from tests.conftest import TaskFactory, requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.support import wait_until
from tests.test_trainers_support import ScriptedTrainer

from clotho.env.checkpoint import ItemLedger, ServeState, StateDir, rng_state, set_rng_state
from clotho.envs.terminal_tasks import TerminalTasksConfig, TerminalTasksEnv
from clotho.errors import ConfigError
from clotho.trainers.server import ApiServer

pytestmark = requires_bwrap

ITEM = re.compile(r"Task (t\d+):")
PROBE = "Probe:"


class TaskModel:
    """A scripted model for tasks saying "Task <name>: ..." (or "Probe: ..."): it writes ok
    into /app/done.txt, then says done. It counts, per item, rollouts begun (first request)
    and ended (last request), and keeps the most items open at once: an item is open from
    its first rollout's first request to its last rollout's last request, which is inside
    the time its group is in flight, so more open items than workers is a broken bound.
    `block_nth`: the first requests of the nth distinct item wait for `release`."""

    def __init__(self, block_nth: int | None = None) -> None:
        self.lock = threading.Lock()
        self.begun: dict[str, int] = {}
        self.ended: dict[str, int] = {}
        self.order: list[str] = []
        self.most_open = 0
        self.probes = 0
        self.block_nth = block_nth
        self.blocked: str | None = None
        self.arrived = threading.Event()
        self.release = threading.Event()

    def open_items(self) -> int:
        return sum(1 for name, n in self.begun.items() if n > self.ended.get(name, 0))

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        match = ITEM.search(prompt)
        first = messages[-1]["role"] == "user"
        if match is None:
            assert PROBE in prompt
            with self.lock:
                self.probes += first
        else:
            name = match.group(1)
            with self.lock:
                if first:
                    if name not in self.begun:
                        self.order.append(name)
                    self.begun[name] = self.begun.get(name, 0) + 1
                    self.most_open = max(self.most_open, self.open_items())
                    if self.block_nth == len(self.order) and self.blocked in (None, name):
                        self.blocked = name
                else:
                    self.ended[name] = self.ended.get(name, 0) + 1
            if first and name == self.blocked:
                self.arrived.set()
                self.release.wait(60)
        if first:
            return assistant(
                "", [tool_call("write_file", {"path": "/app/done.txt", "content": "ok"})]
            )
        return assistant("done")


def make_tasks(make_task: TaskFactory, tmp_path: Path, n: int) -> Path:
    for i in range(n):
        make_task(f"t{i}", instruction=f"Task t{i}: write ok into /app/done.txt.")
    make_task("probe", root=tmp_path / "eval", instruction=f"{PROBE} write ok into /app/done.txt.")
    config = tmp_path / "env.yaml"
    config.write_text(
        f"tasks: [{tmp_path / 'tasks'}]\neval_tasks: [{tmp_path / 'eval'}]\nmax_turns: 3\n"
    )
    return config


def item_of(group: dict[str, Any]) -> str:
    prompt = next(m["content"] for m in group["messages"][0] if m["role"] == "user")
    match = ITEM.search(prompt)
    assert match, prompt
    return match.group(1)


def log_file(path: Path) -> BinaryIO:
    return path.open("wb")


async def start_serve(
    tmp_path: Path,
    api: ApiServer,
    model: ScriptedOpenAIServer,
    config: Path,
    *extra: str,
    env: dict[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, Path]:
    log = tmp_path / f"serve-{len(list(tmp_path.glob('serve-*.log')))}.log"
    with log_file(log) as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "clotho", "serve", "terminal_tasks", "--api-url", api.url,
            "--config", str(config), "--group-size", "2", "--model", "m",
            "--base-url", model.base_url, "--tokenizer", str(QWEN_DIR),
            "--state-dir", str(tmp_path / "state"), *extra,
            stdout=out, stderr=out, cwd=tmp_path, env=env,
        )  # fmt: skip
    return proc, log


async def ended(proc: asyncio.subprocess.Process, log: Path, timeout_s: float = 60) -> str:
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"serve did not end:\n{log.read_text()}") from None
    # The console wraps long lines where a path's length puts the break: one line of words.
    return " ".join(log.read_text().split())


def evaluations(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "evaluations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def until(condition: Any, timeout_s: float = 60) -> None:
    assert await wait_until(condition, timeout_s), f"{condition} never held"


async def test_serve_stops_at_total_steps_and_evaluates_each_boundary_once(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    config = make_tasks(make_task, tmp_path, 8)  # more than the run takes: one pass
    script = TaskModel()
    with_wandb = importlib.util.find_spec("wandb") is not None  # the extra, when installed
    wandb_args = ["--wandb", "clotho-serve-test"] if with_wandb else []
    wandb_env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }
    wandb_env.pop("WANDB_DIR", None)
    with ScriptedOpenAIServer(default=script) as model:
        async with ApiServer(port=0) as api:
            trainer = ScriptedTrainer(api.url)
            await trainer.register(batch_size=2)  # one group of 2 per batch: a step per group
            await trainer.batch()
            serve, log = await start_serve(
                tmp_path, api, model, config,
                "--total-steps", "4", "--steps-per-eval", "2", "--max-num-workers", "3",
                *wandb_args, env=wandb_env,
            )  # fmt: skip
            try:
                items = []
                for step in range(1, 5):
                    batch = await trainer.pull(timeout_s=60)
                    items += [item_of(g) for g in batch]
                    if step % 2 == 0:  # the next step waits for this boundary's evaluation
                        await until(
                            lambda step=step: (
                                [e["step"] for e in evaluations(tmp_path)][-1:] == [step]
                            )
                        )
                output = await ended(serve, log)
            finally:
                if serve.returncode is None:
                    serve.kill()
            probes_before_restart = script.probes
            # Restarted on the same state at step 4: nothing to do, nothing evaluated again.
            again, again_log = await start_serve(
                tmp_path, api, model, config, "--total-steps", "4", "--steps-per-eval", "2"
            )
            again_output = await ended(again, again_log)
            await trainer.aclose()
    assert serve.returncode == 0, output
    assert "reached total_steps" in output and "at trainer step 4" in output
    assert len(items) == len(set(items)) == 4  # 4 steps of one group each, no item twice
    evals = evaluations(tmp_path)
    assert [(e["step"], e["observed_step"], e["skipped"]) for e in evals] == [
        (2, 2, []),
        (4, 4, []),
    ]
    assert all(e["metrics"]["pass_rate"] == 1.0 and e["error"] is None for e in evals)
    assert "eval @ step 2" in output and "eval @ step 4" in output
    assert probes_before_restart == 2  # the evaluation set is one task
    assert script.most_open <= 3
    assert again.returncode == 0, again_output
    assert "reached total_steps" in again_output and "resumed" in again_output
    assert len(evaluations(tmp_path)) == 2 and script.probes == 2
    state = ServeState.model_validate_json((tmp_path / "state" / "state.json").read_bytes())
    assert state.last_eval_step == 4 and state.groups_sent >= 4
    if with_wandb:
        from tests.test_wandb import read_offline_run

        logged = read_offline_run(tmp_path / "state")
        steps = [h["eval/trainer_step"] for h in logged["history"] if "eval/trainer_step" in h]
        assert steps == [2, 4]
        assert [h["eval/pass_rate"] for h in logged["history"] if "eval/pass_rate" in h] == [1, 1]
        assert sum("train/group_score/mean" in h for h in logged["history"]) >= 4


async def replayed(config_file: Path, state_file: Path) -> list[str]:
    """The items a resume from `state_file` would produce before new ones, oldest first."""
    state = ServeState.model_validate_json(state_file.read_bytes())
    env = TerminalTasksEnv(
        TerminalTasksConfig.model_validate(yaml.safe_load(config_file.read_text()))
    )
    try:
        await env.setup()
        env.load_state_dict(state.next)
        ledger = ItemLedger(env, state.unfinished)
        return [(await ledger.take())[1].name for _ in state.unfinished]
    finally:
        await env.close()


async def task_order(config_file: Path, n: int) -> list[str]:
    """The first `n` items of a fresh environment: the sequence serve must follow."""
    env = TerminalTasksEnv(
        TerminalTasksConfig.model_validate(yaml.safe_load(config_file.read_text()))
    )
    try:
        await env.setup()
        return [(await env.get_next_item()).name for _ in range(n)]
    finally:
        await env.close()


async def test_a_stopped_serve_resumes_without_repeating_or_skipping_an_item(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    config = make_tasks(make_task, tmp_path, 12)  # more than both runs take: one pass
    first = TaskModel(block_nth=2)  # the second item's rollouts hang: in flight at Ctrl-C
    second = TaskModel()
    with (
        ScriptedOpenAIServer(default=first) as model_1,
        ScriptedOpenAIServer(default=second) as model_2,
    ):
        async with ApiServer(port=0) as api:
            trainer = ScriptedTrainer(api.url)
            await trainer.register(batch_size=2)
            await trainer.batch()
            serve, log = await start_serve(tmp_path, api, model_1, config, "--max-num-workers", "2")
            try:
                await asyncio.to_thread(first.arrived.wait, 60)
                # The other worker went on: two groups reached the API while item 2 hangs.
                await until(lambda: len(api.state.queue) >= 2)
                serve.send_signal(signal.SIGINT)
                output = await ended(serve, log)
            finally:
                first.release.set()
                if serve.returncode is None:
                    serve.kill()
            sent_first = [item_of(json.loads(g.body)) for g in api.state.queue]
            resumed, resumed_log = await start_serve(
                tmp_path, api, model_2, config, "--max-num-workers", "2", "--total-steps", "4"
            )
            try:
                pulled = []
                for _ in range(4):
                    pulled += [item_of(g) for g in await trainer.pull(timeout_s=60)]
                resumed_output = await ended(resumed, resumed_log)
            finally:
                if resumed.returncode is None:
                    resumed.kill()
            queued = [item_of(json.loads(g.body)) for g in api.state.queue]
            await trainer.aclose()
    assert serve.returncode == 130, output
    assert resumed.returncode == 0, resumed_output
    assert "resumed: " in resumed_output, output
    # Everything the API received, from both runs: no item twice.
    received = pulled + queued
    assert len(received) == len(set(received)), received
    assert pulled[: len(sent_first)] == sent_first
    # The hanging item was never sent; the resume produced it again, and nothing sent before.
    assert first.blocked not in sent_first and first.blocked in second.order[:2]
    assert first.blocked in received and not set(sent_first) & set(second.order)
    # Nothing skipped: what was received plus what a resume would still produce is exactly
    # the start of the environment's sequence.
    pending = await replayed(config, tmp_path / "state" / "state.json")
    order = await task_order(config, len(received) + len(pending))
    assert sorted(received + pending) == sorted(order), (received, pending, order)
    # max_num_workers=2: with item 2 hanging, the other worker kept going, one item at a time.
    assert first.most_open == 2 and second.most_open <= 2


async def test_the_ledger_keeps_unfinished_items_whatever_order_groups_finish(
    make_task: TaskFactory, tmp_path: Path
) -> None:
    for i in range(5):
        make_task(f"t{i}")
    config = TerminalTasksConfig(tasks=[str(tmp_path / "tasks")], seed=7)
    env = TerminalTasksEnv(config)
    again = TerminalTasksEnv(config)
    try:
        await env.setup()
        ledger = ItemLedger(env)
        taken = [await ledger.take() for _ in range(4)]
        ledger.finish(taken[3][0])  # finished out of order: 3 and 1, while 0 and 2 run
        ledger.finish(taken[1][0])
        async with ledger.lock:
            after, unfinished = ledger.cursor()
        folder = StateDir(tmp_path / "state")
        folder.open()
        state = ServeState(environment=env.name, next=after, unfinished=unfinished)
        await folder.save(state, folder.snapshot_number())
        older = ServeState(environment=env.name, next=after, unfinished=[])
        await folder.save(older, 0)  # an older snapshot never overwrites a newer one
        with pytest.raises(ConfigError, match="another clotho serve"):
            StateDir(tmp_path / "state").open()
        loaded = folder.load()
        folder.close()
        assert loaded is not None and len(loaded.unfinished) == 2

        await again.setup()
        again.load_state_dict(loaded.next)
        resumed = ItemLedger(again, loaded.unfinished)
        rest = [(await resumed.take())[1].name for _ in range(3)]
    finally:
        await env.close()
        await again.close()
    names = [item.name for _, item in taken]
    assert rest[:2] == [names[0], names[2]]  # the unfinished ones first, in their order
    assert sorted([names[1], names[3], *rest]) == [f"t{i}" for i in range(5)]  # one pass


async def test_a_state_that_does_not_fit_is_refused(make_task: TaskFactory, tmp_path: Path) -> None:
    for i in range(3):
        make_task(f"t{i}")
    env = TerminalTasksEnv(TerminalTasksConfig(tasks=[str(tmp_path / "tasks")]))
    try:
        await env.setup()
        good = env.state_dict()
        order = good["order"]
        with pytest.raises(ConfigError, match="another item set"):
            env.load_state_dict({**good, "order": {**order, "items": "0" * 16}})
        with pytest.raises(ConfigError, match="random state"):
            env.load_state_dict({**good, "rng": {"version": 3, "words": "AAAA", "gauss": None}})
        with pytest.raises(ConfigError, match="items left"):
            env.load_state_dict({**good, "order": {**order, "epoch": 1, "left": 99}})
        with pytest.raises(ConfigError, match="no item order"):
            env.load_state_dict({k: v for k, v in good.items() if k != "order"})
        env.load_state_dict(good)
    finally:
        await env.close()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "state.json").write_text('{"environment": 1, "next": []}')
    with pytest.raises(ConfigError, match="not a clotho serve state"):
        StateDir(tmp_path / "bad").load()
    import random

    rng, copy = random.Random(3), random.Random()
    rng.random()
    set_rng_state(copy, json.loads(json.dumps(rng_state(rng))))
    assert copy.random() == rng.random()
