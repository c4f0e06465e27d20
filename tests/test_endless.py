"""The `endless` environment: generated tasks kept only when sound, verified per rollout.

The generator and the agent are `ScriptedOpenAIServer`s (the TEST DOUBLE for a hosted model,
see tests/scripted_openai.py): the generator replays a script of task replies, valid and
invalid; the agent model solves the task in some rollouts and does nothing in others. The
sandboxes, the verifier and `clotho eval` are the real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.docker_probe import requires_docker
from tests.scripted_openai import HTTPError, RawBody, ScriptedOpenAIServer, assistant, tool_call
from tests.support import run_clotho as clotho

from clotho.chat.client import ChatClient, ModelConfig
from clotho.env.registry import load_environment
from clotho.envs import endless, endless_build
from clotho.envs.endless import EndlessConfig, EndlessEnv
from clotho.envs.endless_build import (
    BuildSettings,
    Soundness,
    check_members,
    unpack_workspace,
    verifier_script,
    write_task_dir,
)
from clotho.envs.endless_spec import (
    MAX_DECODE_ATTEMPTS,
    GeneratedTask,
    GenerationLimits,
    Rejected,
    after_thinking,
    fenced_blocks,
    parse_reply,
)
from clotho.errors import ConfigError, ErrorInfo, InfraError, ModelError, TaskError
from clotho.rollout import RolloutOutcome
from clotho.sandbox import DockerSandboxConfig, UnsafeLocalSandboxConfig
from clotho.tasks.harbor import load_task

pytestmark = requires_bwrap

SOLUTION = "wc -l < data/words.txt | tr -d ' ' > /app/count.txt"
GOOD: dict[str, Any] = {
    "name": "Count the lines!",
    "category": "files",
    "difficulty": "easy",
    "instruction": "Count the lines of /app/data/words.txt; write the number to /app/count.txt.",
    "files": {"data/words.txt": "alpha\nbeta\ngamma\n"},
    "setup": "mkdir -p logs && echo started > logs/setup.log",
    # the setup's file must be in the workspace, and the quoting must survive the wrapper
    "tests": 'test -f /app/logs/setup.log\n[ "$(cat /app/count.txt)" = 3 ]\n',
    "solution": SOLUTION,
}


def variant(**changes: Any) -> dict[str, Any]:
    return {**GOOD, **changes}


def reply(task: dict[str, Any] | str, fenced: bool = False) -> dict[str, Any]:
    text = task if isinstance(task, str) else json.dumps(task)
    if fenced:
        text = f"Here is a task:\n```json\n{text}\n```\nEnjoy."
    return assistant(text)


ALREADY_SOLVED = variant(name="solved", files={**GOOD["files"], "count.txt": "3\n"})
WRONG_SOLUTION = variant(name="wrong", solution="echo 4 > /app/count.txt")
GARBLED = "Sure! {name: 'count', tests: oops"
# Checks that pass only where the oracle's /solution folder exists: no agent could pass them.
ORACLE_ONLY = variant(name="oracle-only", tests="test -d /solution && test -f /app/count.txt")
CLIMBING = variant(name="climb", files={"../outside.txt": "x"})
ABSOLUTE = variant(name="abs", files={"/etc/cron.d/evil": "x"})
FAILING_SETUP = variant(name="setup-fails", setup="exit 3")
# A Dockerfile in environment/ would be built (with network) by a container backend.
BUILDING_SETUP = variant(name="builds", setup="printf 'FROM x\\nRUN curl evil\\n' > Dockerfile")


def agent_model(nop_every: int = 2) -> Any:
    """A scripted agent that runs the solution, except every `nop_every`-th rollout (0:
    never), which does nothing."""
    calls = {"n": 0}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] != "user":
            return assistant("done")
        calls["n"] += 1
        if nop_every and calls["n"] % nop_every == 0:
            return assistant("I will not do anything.")
        return assistant("", [tool_call("terminal", {"command": f"cd /app && {SOLUTION}"})])

    return answer


def model_config(server: ScriptedOpenAIServer) -> ModelConfig:
    return ModelConfig(model="m", base_url=server.base_url, max_retries=0, backoff_initial_s=0.01)


def make_env(
    generator: ScriptedOpenAIServer, agent: ScriptedOpenAIServer, **config: Any
) -> EndlessEnv:
    agent_config = model_config(agent)
    config.setdefault("generate_ahead", 0)  # one generation per request: countable
    env_config = EndlessConfig(
        model=agent_config, generator_model=model_config(generator), **config
    )
    return EndlessEnv(env_config, model=ChatClient(agent_config))


async def first_kept_task(
    script: list[Any], saved: Path, attempts: int
) -> tuple[EndlessEnv, Any, ScriptedOpenAIServer, ScriptedOpenAIServer]:
    """The first task an env keeps of what the generator answers from `script` (within
    `attempts`), saved under `saved`; the env set up for it and closed. With the env, the
    task, and the two scripted models (generator, agent) to look at."""
    with ScriptedOpenAIServer(script) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, save_tasks=str(saved), max_generation_attempts=attempts)
        try:
            await env.setup()
            task = await env.get_next_item()
        finally:
            await env.close()
    return env, task, generator, agent


async def test_only_sound_tasks_are_kept_and_discards_are_counted(tmp_path: Path) -> None:
    script = [
        reply(GARBLED),
        reply(ALREADY_SOLVED),
        reply(WRONG_SOLUTION),
        reply(ORACLE_ONLY),
        reply(CLIMBING),
        reply(ABSOLUTE),
        reply(FAILING_SETUP),
        reply(BUILDING_SETUP),
        reply(GOOD, fenced=True),
    ]
    saved = tmp_path / "saved"
    env, task, generator, agent = await first_kept_task(script, saved, attempts=10)
    assert generator.remaining == 0 and not agent.requests
    assert env.stats.tasks_generated == 9 and env.stats.tasks_kept == 1
    assert env.stats.tasks_discarded == 8
    assert env.stats.discarded == {
        "unparseable": 1,
        "passes_initially": 1,
        "solution_fails": 2,
        "invalid": 3,
        "setup_failed": 1,
    }
    assert task.name.startswith("count-the-lines-")
    # only the sound task is saved, nothing of the discarded ones (no staging left either)
    assert sorted(p.name for p in saved.iterdir() if p.is_dir()) == [task.name]
    env_dir = saved / task.name / "environment"
    assert (env_dir / "data" / "words.txt").read_text() == "alpha\nbeta\ngamma\n"
    assert (env_dir / "logs" / "setup.log").read_text() == "started\n"  # the setup ran
    assert not (tmp_path / "outside.txt").exists()


async def test_every_rollout_is_verified_in_its_own_sandbox(tmp_path: Path) -> None:
    with (
        ScriptedOpenAIServer([reply(GOOD)]) as generator,
        ScriptedOpenAIServer(default=agent_model(nop_every=2)) as agent,
    ):
        env = make_env(generator, agent, group_size=4, save_tasks=str(tmp_path / "saved"))
        try:
            await env.setup()
            task = await env.get_next_item()
            group, rollouts = await env.collect_group(task)
            # the task serves later groups too: it is not deleted after a rollout
            again, _ = await env.collect_group(task)
        finally:
            await env.close()
        assert len(generator.requests) == 1  # one task generated, eight rollouts served
    assert group is not None and again is not None
    assert sorted(group.scores) == [0.0, 0.0, 1.0, 1.0]
    assert sorted(again.scores) == [0.0, 0.0, 1.0, 1.0]
    for r in rollouts:
        assert r.error is None and r.verifier is not None
        solved = r.agent is not None and r.agent.tool_calls == 1
        assert r.reward == (1.0 if solved else 0.0)


@requires_docker
async def test_docker_checks_and_verifies_in_the_rollouts_own_containers(tmp_path: Path) -> None:
    """The same pool and backend as the rollouts: with Docker, the workspace is built, the
    soundness checks run and each rollout is verified in containers."""
    with (
        ScriptedOpenAIServer([reply(WRONG_SOLUTION), reply(GOOD)]) as generator,
        ScriptedOpenAIServer(default=agent_model(nop_every=2)) as agent,
    ):
        env = make_env(generator, agent, group_size=2, sandbox=DockerSandboxConfig())
        try:
            await env.setup()
            task = await env.get_next_item()
            group, rollouts = await env.collect_group(task)
        finally:
            await env.close()
    assert env.stats.discarded == {"solution_fails": 1} and env.stats.tasks_kept == 1
    assert group is not None and sorted(group.scores) == [0.0, 1.0]
    assert all(r.error is None for r in rollouts)


async def test_an_agent_that_replaces_a_program_the_checks_name_gets_no_reward() -> None:
    """The generated checks are inlined in tests/test.sh, so the hostile-agent verifier watches
    the programs they name: a fake `expr` (no base program, named only by these checks) that
    would make them pass is tampering, and the tests never run."""
    task = variant(name="expr", tests='expr "$(cat /app/count.txt)" = 3 > /dev/null')
    fake = "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/expr; chmod +x /usr/local/bin/expr"

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        if body["messages"][-1]["role"] != "user":
            return assistant("done")
        return assistant("", [tool_call("terminal", {"command": fake})])

    with (
        ScriptedOpenAIServer([reply(task)]) as generator,
        ScriptedOpenAIServer(default=answer) as agent,
    ):
        env = make_env(generator, agent, group_size=1, min_valid_rollouts=1)
        try:
            await env.setup()
            _, rollouts = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
    (rollout,) = rollouts
    assert rollout.reward is None and rollout.error is not None
    assert rollout.error.kind == "tamper" and "expr" in rollout.error.message


async def test_saved_tasks_pass_clotho_eval_with_the_oracle(tmp_path: Path) -> None:
    second = variant(
        name="sum numbers",
        instruction="Write the sum of the numbers in /app/n.txt to /app/sum.txt.",
        files={"n.txt": "1\n2\n3\n4\n"},
        setup="",
        tests="grep -qx 10 /app/sum.txt",
        solution="awk '{s+=$1} END {print s}' n.txt > sum.txt",
    )
    saved = tmp_path / "saved"
    with (
        ScriptedOpenAIServer([reply(GOOD), reply(second)]) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, save_tasks=str(saved), harbor_base_image="debian:12")
        try:
            await env.setup()
            names = {(await env.get_next_item()).name for _ in range(2)}
        finally:
            await env.close()
    assert {p.name for p in saved.iterdir() if p.is_dir()} == names
    for name in names:  # for Docker-based Harbor runners; the local backend only uploads
        dockerfile = saved / name / "environment" / "Dockerfile"
        assert dockerfile.read_text() == "FROM debian:12\nWORKDIR /app\nCOPY . /app/\n"
    for agent_name, pass_rate in (("oracle", 1.0), ("nop", 0.0)):
        out = tmp_path / f"run-{agent_name}"
        proc = clotho("eval", str(saved), "--agent", agent_name, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert {r["task"] for r in rows} == names
        assert all(r["error"] is None for r in rows), rows
        assert json.loads((out / "metrics.json").read_text())["pass_rate"] == pass_rate


async def test_a_generator_that_never_writes_a_sound_task_ends_with_a_clear_error() -> None:
    with (
        ScriptedOpenAIServer(default=reply(WRONG_SOLUTION)) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, max_generation_attempts=2)
        try:
            await env.setup()
            with pytest.raises(
                TaskError, match=r"no sound task in 2 attempts \(1 solution_fails, 1 duplicate\)"
            ):
                await env.get_next_item()
        finally:
            await env.close()
        assert len(generator.requests) == 2
    assert env.stats.discarded == {"solution_fails": 1, "duplicate": 1}


async def test_runaway_scripts_are_stopped_and_discarded() -> None:
    hanging_setup = variant(name="slow-setup", setup="sleep 1000")
    hanging_solution = variant(name="slow-solution", solution="sleep 1000; " + SOLUTION)
    filling_setup = variant(name="fill", setup="head -c 300000 /dev/urandom > big.bin")
    script = [reply(hanging_setup), reply(hanging_solution), reply(filling_setup)]
    with ScriptedOpenAIServer(script) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(
            generator,
            agent,
            max_generation_attempts=3,
            setup_timeout_s=5,  # the sound setups must finish in time on a busy machine
            solution_timeout_s=5,
            max_workspace_bytes=100_000,
        )
        try:
            await env.setup()
            reasons = "1 setup_failed, 1 solution_fails, 1 workspace_too_large"
            with pytest.raises(TaskError, match=reasons):
                await env.get_next_item()
        finally:
            await env.close()


async def test_a_broken_or_unreachable_generator_is_counted_then_a_model_error() -> None:
    script = [RawBody("{not json"), HTTPError(503)]
    with (
        ScriptedOpenAIServer(script, default=HTTPError(500)) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, max_generation_attempts=3)
        try:
            await env.setup()
            with pytest.raises(ModelError, match="3 model_error"):
                await env.get_next_item()
        finally:
            await env.close()
    assert env.stats.discarded == {"model_error": 3}


# -- the generator's reply, read without a sandbox ----------------------------------------

LIMITS = GenerationLimits(max_script_bytes=1000, max_files=3, max_file_bytes=100)


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ({"../x": "a"}, "'..'"),
        ({"a/../../x": "a"}, "'..'"),
        ({"/etc/passwd": "a"}, "absolute"),
        ({"a//b": "a"}, "empty"),
        ({"./a": "a"}, "'.'"),
        ({"a\nb": "a"}, "control"),
        ({"a\\..\\b": "a"}, "backslash"),
        ({"a": "x", "a/b": "y"}, "both a file and a folder"),
        ({"A": "x", "a": "y"}, "differ only in case"),
        ({"big": "x" * 101}, "larger than 100 bytes"),
        ({f"f{i}": "" for i in range(4)}, "4 files"),
        ({"a": "x\0y"}, "NUL"),
        ({"Dockerfile": "FROM x"}, "container build file"),
        ({"compose.yaml": "services: {}"}, "container build file"),
    ],
)
def test_hostile_file_names_and_sizes_are_rejected(files: dict[str, str], problem: str) -> None:
    with pytest.raises(Rejected, match=problem) as caught:
        parse_reply(json.dumps(variant(files=files)), LIMITS)
    assert caught.value.reason == "invalid"


@pytest.mark.parametrize("key", ["setup", "tests", "solution"])
def test_oversize_scripts_are_rejected(key: str) -> None:
    with pytest.raises(Rejected, match=f"{key} larger than 1000 bytes"):
        parse_reply(json.dumps(variant(**{key: "echo " + "x" * 1000})), LIMITS)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "unparseable"),
        ("no json here", "unparseable"),
        ("[1, 2, 3]", "unparseable"),
        ('{"name": "x"}', "invalid"),  # missing instruction, tests, solution
        (json.dumps(variant(tests="   ")), "invalid"),
        (json.dumps(variant(files="not a map")), "invalid"),
        ("x" * 400_001, "invalid"),
    ],
)
def test_garbled_replies_are_rejected_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(Rejected) as caught:
        parse_reply(text, GenerationLimits())
    assert caught.value.reason == reason


def test_replies_in_prose_fences_or_after_thinking_are_read() -> None:
    body = json.dumps(GOOD)
    for text in (
        body,
        f"<think>{{maybe}}</think>{body}",
        f"Task:\n```json\n{body}\n```",
        f"ok {body} bye",
    ):
        assert parse_reply(text, GenerationLimits()).instruction == GOOD["instruction"]
    listed = variant(files=[{"path": "a.txt", "content": "x"}])
    assert parse_reply(json.dumps(listed), GenerationLimits()).files == {"a.txt": "x"}


def test_the_checks_are_inlined_verbatim_whatever_they_contain(tmp_path: Path) -> None:
    """Quotes, substitutions and even the wrapper's own end marker inside the checks run as
    the generator wrote them (the here-document is quoted and its marker avoids their lines)."""
    out = tmp_path / "out"
    checks = (
        'printf "%s\\n" "$(printf "%s" "`echo a`")" > "$OUT"\n'
        'cat <<CLOTHO_FINAL_STATE_CHECKS >> "$OUT"\n$HOME\nCLOTHO_FINAL_STATE_CHECKS\n'
    )
    script = verifier_script(checks, 30).replace("/logs/verifier", str(tmp_path))
    env = {"OUT": str(out), "HOME": "/home/someone", "PATH": os.environ["PATH"]}
    subprocess.run(["bash", "-c", script], check=True, env=env)
    assert out.read_text() == "a\n/home/someone\n"
    assert (tmp_path / "reward.txt").read_text() == "1\n"
    failing = verifier_script("exit 1", 30).replace("/logs/verifier", str(tmp_path))
    subprocess.run(["bash", "-c", failing], check=True, env=env)
    assert (tmp_path / "reward.txt").read_text() == "0\n"


def test_endless_is_a_registered_environment() -> None:
    assert load_environment("endless") is EndlessEnv


async def test_saved_tasks_are_an_evaluation_set(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    other = variant(name="other", tests="grep -qx 10 /app/sum.txt", solution="echo 10 > sum.txt")
    with (
        ScriptedOpenAIServer([reply(GOOD), reply(other)]) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            await env.get_next_item()
            await env.get_next_item()
            with pytest.raises(ConfigError, match="no evaluation set: give eval_tasks"):
                await env.evaluate()
        finally:
            await env.close()
    # a later run: the agent always counts lines, which solves one of the two saved tasks
    with (
        ScriptedOpenAIServer() as generator,
        ScriptedOpenAIServer(default=agent_model(nop_every=0)) as agent,
    ):
        env = make_env(generator, agent, eval_tasks=[str(saved)])
        try:
            await env.setup()
            samples = await env.evaluate()
        finally:
            await env.close()
        assert not generator.requests  # evaluation generates nothing
    rewards = {s.name.split("-")[0]: s.rollout.reward for s in samples}
    assert rewards == {"count": 1.0, "other": 0.0}


async def test_a_resumed_run_serves_the_recorded_items_again(tmp_path: Path) -> None:
    """With save_tasks, item N is recorded: a run resumed from the state before item N (what
    `clotho serve --state-dir` keeps) gets the same task back without asking the generator."""
    saved = tmp_path / "saved"
    other = variant(name="other", tests="grep -qx 10 /app/sum.txt", solution="echo 10 > sum.txt")
    third = variant(name="third", tests="grep -qx 7 /app/sum.txt", solution="echo 7 > sum.txt")
    with (
        ScriptedOpenAIServer([reply(GOOD), reply(other)]) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            start = env.state_dict()
            first = [(await env.get_next_item()).name for _ in range(2)]
        finally:
            await env.close()
    assert start["item_cursor"] == 0 and env.state_dict()["item_cursor"] == 2
    with ScriptedOpenAIServer([reply(third)]) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            env.load_state_dict(start)
            again = [(await env.get_next_item()).name for _ in range(2)]
            assert not generator.requests  # served from the record, not regenerated
            new = (await env.get_next_item()).name
            assert len(generator.requests) == 1
            elsewhere = make_env(generator, agent, save_tasks=str(tmp_path / "elsewhere"))
            with pytest.raises(ConfigError, match="save_tasks"):
                elsewhere.load_state_dict(start)
        finally:
            await env.close()
    assert again == first and new.startswith("third-") and new not in first


async def test_without_a_generator_model_the_environments_model_writes_the_tasks() -> None:
    """No `generator_model`: the environment's own model (with no model configured at all,
    the embedded one, as `_require_model` builds it) is asked for the task."""
    with ScriptedOpenAIServer([reply(GOOD)], default=agent_model(nop_every=0)) as model:
        config = model_config(model)
        env_config = EndlessConfig(
            model=config, group_size=1, min_valid_rollouts=1, generate_ahead=0
        )  # one server for both: no generation may run during the rollout
        env = EndlessEnv(env_config)
        try:
            await env.setup()
            group, _ = await env.collect_group(await env.get_next_item())
        finally:
            await env.close()
        assert model.requests[0]["messages"][0]["content"].startswith("You invent small")
    assert env.config.generator_model is None and env.stats.tasks_kept == 1
    assert group is not None and group.scores == [1.0]


def test_a_check_that_broke_on_the_backend_is_no_verdict_on_the_task() -> None:
    scored = RolloutOutcome(reward=0.0)
    passed = RolloutOutcome(reward=1.0, passed=True)
    broken = RolloutOutcome(error=ErrorInfo(kind="infra", message="docker daemon gone"))
    timed_out = RolloutOutcome(error=ErrorInfo(kind="verifier", message="timed out"))
    assert Soundness(initial=scored, solved=passed).problem() is None
    with pytest.raises(InfraError, match="docker daemon gone"):
        Soundness(initial=scored, solved=broken).problem()
    problem = Soundness(initial=timed_out, solved=passed).problem()
    assert problem is not None and problem.reason == "check_error"
    problem = Soundness(initial=passed, solved=passed).problem()
    assert problem is not None and problem.reason == "passes_initially"
    problem = Soundness(initial=scored, solved=scored).problem()
    assert problem is not None and problem.reason == "solution_fails"


async def test_clotho_process_endless_saves_its_tasks(tmp_path: Path) -> None:
    """The CLI path: `--save-tasks` reaches the environment, the groups are written and the
    kept task is a Harbor task folder."""
    from tests.test_chat_template import QWEN_DIR

    saved, out = tmp_path / "saved", tmp_path / "groups.jsonl"
    with (
        ScriptedOpenAIServer([reply(GOOD)]) as generator,
        ScriptedOpenAIServer(default=agent_model(nop_every=2)) as agent,
    ):
        generator_model = json.dumps({"model": "m", "base_url": generator.base_url})
        result = await asyncio.to_thread(
            clotho,
            "process", "endless", "--n-groups", "1", "--group-size", "2",
            "--model", "m", "--base-url", agent.base_url, "--tokenizer", str(QWEN_DIR),
            "--set", f"generator_model={generator_model}",
            "--save-tasks", str(saved), "--out", str(out),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (group,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(group["scores"]) == [0.0, 1.0]
    (task,) = [p for p in saved.iterdir() if p.is_dir()]
    assert (task / "instruction.md").is_file() and (task / "tests" / "test.sh").is_file()


# -- review findings: hostile replies, generation ahead, fresh runs, workspaces, TOML --------


class CountingStr(str):
    """A reply that counts the searches made in it (not its slices: those are plain str)."""

    def __new__(cls, text: str) -> CountingStr:
        made = super().__new__(cls, text)
        made.searches = []  # type: ignore[attr-defined]
        return made

    def find(self, sub: Any, *args: Any) -> int:  # type: ignore[override]
        self.searches.append(("find", sub, *args))  # type: ignore[attr-defined]
        return super().find(sub, *args)

    def rfind(self, sub: Any, *args: Any) -> int:  # type: ignore[override]
        self.searches.append(("rfind", sub, *args))  # type: ignore[attr-defined]
        return super().rfind(sub, *args)


def test_thinking_is_cut_with_one_search_from_the_end() -> None:
    """`<think>` repeated (no closing tag) made the lazy regex rescan the rest of the reply
    from every opening: 16 s at 140k characters. Now one reverse search."""
    body = json.dumps(GOOD)
    hostile = CountingStr("<think>" * 50_000 + body)
    assert after_thinking(hostile) == hostile  # no closing tag: nothing is cut
    assert hostile.searches == [("rfind", "</think>")]  # type: ignore[attr-defined]
    text = f"<think>a</think>x<think>{{b}}</think>{body}"
    assert after_thinking(text) == body
    assert parse_reply("<think>" * 50_000 + body, GenerationLimits()).name == GOOD["name"]


@pytest.mark.parametrize(
    "hostile",
    ["```\na" * 20_000, "```" * 100_000, "```json\n" + "x\n```" * 30_000, "``` " * 80_000],
)
def test_fences_are_paired_in_one_pass(hostile: str) -> None:
    """Each search starts past the previous one (no rescanning): linear in the reply."""
    text = CountingStr(hostile)
    fenced_blocks(text)
    starts = [args[2] if len(args) > 2 else 0 for args in text.searches]  # type: ignore[attr-defined]
    assert starts == sorted(starts), "a search went back"
    assert len(starts) <= 2 * (hostile.count("`") // 3) + 2


def test_fenced_blocks_are_read_in_order() -> None:
    text = "a```json\n{1}\n```b``` x\n```\nsecond\n```tail```\nunclosed"
    assert fenced_blocks(text) == ["{1}", "second"]
    assert fenced_blocks("x```json\n{1}\n```y```\n\n{2}\n```") == ["{1}", "{2}"]
    assert fenced_blocks("```python\nprint()\n```") == []  # only json or untagged fences
    assert fenced_blocks("```\nnever closed") == []


@pytest.mark.parametrize(
    "hostile", ['{"":' * 99_999, "```\n" + '{"":' * 99_000 + "\n```", "{" * 399_000]
)
def test_json_decoding_is_tried_a_bounded_number_of_times(
    hostile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode at every `{` of `{"":` repeated took 4 s; at most MAX_DECODE_ATTEMPTS now."""
    attempts = []
    original = json.JSONDecoder.raw_decode

    def counting(self: json.JSONDecoder, s: str, idx: int = 0) -> Any:
        attempts.append(idx)
        return original(self, s, idx)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    with pytest.raises(Rejected) as caught:
        parse_reply(hostile, GenerationLimits())
    assert caught.value.reason == "unparseable"
    assert 0 < len(attempts) <= MAX_DECODE_ATTEMPTS
    # a task after a little garbage is still found
    attempts.clear()
    assert parse_reply("{x} {y} " + json.dumps(GOOD), GenerationLimits()).name == GOOD["name"]
    assert len(attempts) == 3


def test_a_lone_surrogate_is_an_invalid_task_not_a_crash() -> None:
    text = json.dumps(variant(instruction="count \ud83d lines"), ensure_ascii=True)
    with pytest.raises(Rejected, match="unicode string") as caught:
        parse_reply(text, GenerationLimits())
    assert caught.value.reason == "invalid"


def test_task_toml_keeps_an_emoji_category_quotes_and_control_characters(tmp_path: Path) -> None:
    """json.dumps wrote an emoji as a surrogate pair escape, which TOML rejects: the sound
    task was discarded as invalid."""
    task = GeneratedTask.model_validate(
        variant(category="🐍 python", difficulty='so "hard"\\ \x01\t\n\x7f')
    )
    settings = BuildSettings(
        setup_timeout_s=1, test_timeout_s=1, solution_timeout_s=1, agent_timeout_s=1,
        max_workspace_bytes=1,
    )  # fmt: skip
    write_task_dir(task, tmp_path / "t", settings)
    (tmp_path / "t" / "environment").mkdir()
    loaded = load_task(tmp_path / "t")
    assert loaded.category == "🐍 python"
    assert loaded.config.metadata.difficulty == 'so "hard"\\ \x01\t\n\x7f'


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def test_the_reply_and_the_workspace_are_read_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """parse_reply (up to 400k characters of untrusted text) and the base64 decoding of the
    workspace (up to 16 MiB) run in threads, not on the loop that serves every rollout."""
    where: dict[str, list[bool]] = {"parse": [], "decode": []}
    parse, decode = endless.parse_reply, endless_build.base64.b64decode

    def watched_parse(*args: Any) -> Any:
        where["parse"].append(_on_loop())
        return parse(*args)

    def watched_decode(*args: Any, **kwargs: Any) -> Any:
        where["decode"].append(_on_loop())
        return decode(*args, **kwargs)

    monkeypatch.setattr(endless, "parse_reply", watched_parse)
    monkeypatch.setattr(endless_build.base64, "b64decode", watched_decode)
    with ScriptedOpenAIServer([reply(GOOD)]) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent)
        try:
            await env.setup()
            await env.get_next_item()
        finally:
            await env.close()
    assert where["parse"] == [False]
    assert where["decode"] and not any(where["decode"])


def numbered(n: int) -> dict[str, Any]:
    return variant(name=f"task {n}", tests=f"grep -qx {n} /app/n.txt", solution=f"echo {n} > n.txt")


async def test_tasks_are_generated_ahead_by_max_num_workers_generations_at_once() -> None:
    """The driver takes items one at a time, so generating on demand meant one generation at
    a time. With two workers, two generations are in flight together: the first two
    requests meet at a barrier in the server before either is answered (serially, the first
    would wait for the second until the barrier breaks)."""
    import threading

    meeting = threading.Barrier(2, timeout=120)
    met: list[bool] = []
    count = {"n": 0}
    lock = threading.Lock()

    def answer(body: dict[str, Any]) -> Any:
        with lock:
            count["n"] += 1
            n = count["n"]
        if n > 2:
            return HTTPError(503)  # later generations: not needed here
        try:
            meeting.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
        return reply(numbered(n))

    with ScriptedOpenAIServer(default=answer) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, max_num_workers=2, generate_ahead=None)
        try:
            await env.setup()
            first = await env.get_next_item()
            second = await env.get_next_item()
        finally:
            await env.close()
    assert met == [True, True]
    assert first.name != second.name
    assert {first.name.split("-")[1], second.name.split("-")[1]} == {"1", "2"}


async def test_a_generation_that_gives_up_ahead_surfaces_its_error() -> None:
    with (
        ScriptedOpenAIServer(default=reply(WRONG_SOLUTION)) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, max_generation_attempts=2, generate_ahead=None)
        try:
            await env.setup()
            with pytest.raises(TaskError, match="no sound task in 2 attempts"):
                await env.get_next_item()
            with pytest.raises(TaskError, match="no sound task in 2 attempts"):
                await env.get_next_item()
        finally:
            await env.close()
    assert env._producers == set()  # close() stopped the generations still running


async def test_a_fresh_run_generates_instead_of_replaying_an_earlier_runs_items(
    tmp_path: Path,
) -> None:
    """The item record in save_tasks is tagged with its run: a new run (no load_state_dict)
    appends its own items; resuming it serves its items, not the earlier run's."""
    saved = tmp_path / "saved"
    with (
        ScriptedOpenAIServer([reply(numbered(1)), reply(numbered(2))]) as generator,
        ScriptedOpenAIServer() as agent,
    ):
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            earlier = [(await env.get_next_item()).name for _ in range(2)]
        finally:
            await env.close()
    with ScriptedOpenAIServer([reply(numbered(3))]) as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            start = env.state_dict()
            fresh = (await env.get_next_item()).name
            assert len(generator.requests) == 1  # generated, not item 0 of the earlier run
        finally:
            await env.close()
    assert fresh not in earlier and fresh.startswith("task-3-")
    with ScriptedOpenAIServer() as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, save_tasks=str(saved))
        try:
            await env.setup()
            env.load_state_dict(start)
            assert (await env.get_next_item()).name == fresh
        finally:
            await env.close()
        assert not generator.requests
    records = [
        json.loads(line) for line in (saved / ".endless-items.jsonl").read_text().splitlines()
    ]
    assert [r["item"] for r in records] == [0, 1, 0]
    assert len({r["run"] for r in records}) == 2


async def test_unsafe_local_and_an_evaluation_without_tasks_are_refused_in_setup() -> None:
    with ScriptedOpenAIServer() as generator, ScriptedOpenAIServer() as agent:
        env = make_env(generator, agent, sandbox=UnsafeLocalSandboxConfig())
        with pytest.raises(ConfigError, match="not unsafe-local"):
            await env.setup()
        await env.close()
        env = make_env(generator, agent, steps_per_eval=10)
        with pytest.raises(ConfigError, match="no evaluation set: give eval_tasks"):
            await env.setup()
        await env.close()
        assert not generator.requests


async def test_setups_that_leave_links_out_or_special_files_are_rejected(tmp_path: Path) -> None:
    """Each is rejected as invalid by the member checks (the data filter alone called them
    setup failures), and nothing is written outside the task folder. The chained link is
    inside by name (b/c/../..) but outside for real (b/c -> ../x): the check after unpacking
    resolves it."""
    script = [
        reply(variant(name="abs-link", setup="ln -s /etc/passwd x")),
        reply(variant(name="up-link", setup="ln -s .. up")),
        reply(variant(name="fifo", setup="mkfifo f")),
        reply(variant(name="chain", setup="mkdir b && ln -s ../x b/c && ln -s b/c/../.. esc")),
        reply(GOOD),
    ]
    env, task, _, _ = await first_kept_task(script, tmp_path / "saved", attempts=5)
    assert env.stats.discarded == {"invalid": 4}, env.stats.discarded
    assert task.name.startswith("count-the-lines-")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]


def _escaping_tar() -> bytes:
    """The 2025 tarfile filter bypass (CVE-2025-4517 style): links chained past PATH_MAX, so
    the data filter's realpath stops resolving, then a file written through them."""
    import io
    import tarfile

    comp, steps, path = "d" * 247, "abcdefghijklmnop", ""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for step in steps:
            folder = tarfile.TarInfo(os.path.join(path, comp))
            folder.type = tarfile.DIRTYPE
            tar.addfile(folder)
            link = tarfile.TarInfo(os.path.join(path, step))
            link.type, link.linkname = tarfile.SYMTYPE, comp
            tar.addfile(link)
            path = os.path.join(path, comp)
        long_link = os.path.join("/".join(steps), "l" * 254)
        back = tarfile.TarInfo(long_link)
        back.type, back.linkname = tarfile.SYMTYPE, "../" * len(steps)
        tar.addfile(back)
        escape = tarfile.TarInfo("escape")
        escape.type, escape.linkname = tarfile.SYMTYPE, long_link + "/.."
        tar.addfile(escape)
        data = b"written outside\n"
        planted = tarfile.TarInfo("escape/planted.txt")
        planted.size = len(data)
        tar.addfile(planted, io.BytesIO(data))
    return buffer.getvalue()


def test_a_workspace_tar_that_bypasses_the_data_filter_is_rejected(tmp_path: Path) -> None:
    import base64

    packed = base64.b64encode(_escaping_tar()).decode()
    with pytest.raises(Rejected, match="under a link") as caught:
        unpack_workspace(packed, 1 << 24, tmp_path / "dest")
    assert caught.value.reason == "invalid"
    assert not (tmp_path / "planted.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["dest"]


@pytest.mark.parametrize(
    ("members", "problem"),
    [
        ([("sym", "a", "/etc"), ("file", "a/x", "")], "out of the workspace"),
        ([("sym", "a", "b"), ("file", "a/x", "")], "under a link"),
        ([("file", "a", ""), ("sym", "a", "b")], "twice"),
        ([("hard", "h", "/etc/passwd")], "hard link"),
        ([("sym", "s", "x"), ("hard", "h", "s")], "hard link"),
        ([("file", "../x", "")], "outside"),
        ([("file", "/x", "")], "outside"),
        ([("sym", ".", "x")], "not a folder"),
    ],
)
def test_workspace_members_are_checked_before_unpacking(
    members: list[tuple[str, str, str]], problem: str
) -> None:
    import tarfile

    infos = []
    for kind, name, target in members:
        info = tarfile.TarInfo(name)
        info.type = {"file": tarfile.REGTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE}[kind]
        info.linkname = target
        infos.append(info)
    with pytest.raises(Rejected, match=problem):
        check_members(infos)


def test_a_link_chain_that_leaves_only_for_real_is_rejected_after_unpacking(
    tmp_path: Path,
) -> None:
    """esc -> b/c/../.. is inside by name, but b/c -> ../x makes it the folder's parent. In
    this order (esc before b/c) the data filter lets both pass; the real resolution after
    unpacking does not."""
    import base64
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, kind, target in [
            ("b", tarfile.DIRTYPE, ""),
            ("esc", tarfile.SYMTYPE, "b/c/../.."),
            ("b/c", tarfile.SYMTYPE, "../x"),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = kind, target
            tar.addfile(info)
    packed = base64.b64encode(buffer.getvalue()).decode()
    with pytest.raises(Rejected, match="'esc': a link out of it") as caught:
        unpack_workspace(packed, 1 << 20, tmp_path / "dest")
    assert caught.value.reason == "invalid"
