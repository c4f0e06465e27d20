"""The `tools.*` settings on the commands: `clotho eval`, `generate`, `process` and `evaluate`
take the web provider and vision model from --config / --set like any other setting, and a
chosen toolset that cannot work (no provider, no key, an unreachable provider) ends the command
at setup with exit 2 and the setting to fix, before any model request or rollout.

The model is `ScriptedOpenAIServer` and the search provider `ProviderDouble`: TEST DOUBLES of
hosted services (real HTTP servers on 127.0.0.1); the CLI, the registry and the tools are real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
from tests.test_tools_web import KEY_VAR, SEARCH_RESULTS, ProviderDouble, free_port

TASK = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "browser-parcel-form"


def clotho(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI, its error on one line (the console wraps long lines)."""
    proc = subprocess.run(
        [sys.executable, "-m", "clotho", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
    proc.stderr = " ".join(proc.stderr.split())
    return proc


def command(name: str, tmp_path: Path, base_url: str) -> list[str]:
    """`name` run on something small, with the scripted model; toolsets and tools.* to add."""
    if name == "eval":
        tasks = tmp_path / "tasks"
        shutil.copytree(TASK, tasks / TASK.name, dirs_exist_ok=True)
        return ["eval", str(tasks), "--agent", "llm", "--model", "m", "--base-url", base_url,
                "--out", str(tmp_path / "run")]  # fmt: skip
    if name == "generate":
        prompts = tmp_path / "prompts.jsonl"
        prompts.write_text(json.dumps({"prompt": "look something up"}) + "\n")
        return ["generate", str(prompts), "--model", "m", "--base-url", base_url,
                "--out", str(tmp_path / "gen")]  # fmt: skip
    if name == "process":
        return ["process", "terminal_test", "--out", str(tmp_path / "groups.jsonl"),
                "--n-groups", "1", "--group-size", "2", "--model", "m",
                "--base-url", base_url]  # fmt: skip
    assert name == "evaluate"
    (tmp_path / "env.yaml").write_text(f"tasks: [{TASK}]\nmax_turns: 2\n")
    return ["evaluate", "terminal_tasks", "--out", str(tmp_path / "ev"), "--config",
            str(tmp_path / "env.yaml"), "--model", "m", "--base-url", base_url]  # fmt: skip


COMMANDS = ["eval", "generate", "process", "evaluate"]


@pytest.mark.parametrize("name", COMMANDS)
def test_web_without_a_provider_is_refused_at_setup(name: str, tmp_path: Path) -> None:
    with ScriptedOpenAIServer(default=assistant("done")) as model:
        args = command(name, tmp_path, model.base_url)
        proc = clotho(*args, "--set", "toolsets=[terminal, web]")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "tools.web.base_url" in proc.stderr, proc.stderr
    assert model.requests == []  # refused before the first model request


@pytest.mark.parametrize("name", COMMANDS)
def test_an_unreachable_provider_is_refused_at_setup(name: str, tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}/api"
    with ScriptedOpenAIServer(default=assistant("done")) as model:
        args = command(name, tmp_path, model.base_url)
        proc = clotho(
            *args,
            "--set", "toolsets=[web]",
            "--set", f"tools.web.base_url={nowhere}",
            "--set", f"tools.web.api_key_env={KEY_VAR}",
            env={KEY_VAR: "sk-test"},
        )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert f"provider {nowhere} is unreachable" in proc.stderr, proc.stderr
    assert model.requests == []


def test_a_distribution_that_can_draw_vision_needs_its_model(tmp_path: Path) -> None:
    """An environment's distribution: every toolset it can draw is checked at setup."""
    with ScriptedOpenAIServer(default=assistant("done")) as model:
        args = command("process", tmp_path, model.base_url)
        proc = clotho(*args, "--set", "distribution=browser_tasks")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "tools.vision.base_url" in proc.stderr and "tools.vision.model" in proc.stderr
    assert model.requests == []


@requires_bwrap
def test_eval_gives_the_agent_the_configured_web_provider(tmp_path: Path) -> None:
    """tools.web from a --config file reaches the agent's web_search: the provider is asked
    with the key from the named variable, and its results come back to the model."""
    seen: list[str] = []

    def after_search(body: dict[str, Any]) -> dict[str, Any]:
        seen.append(str(body["messages"][-1]["content"]))
        return assistant("nothing more to do")

    script = [
        assistant("", [tool_call("web_search", {"query": "parcel rules"})]),
        after_search,
    ]
    with (
        ProviderDouble({"/api/search": (200, SEARCH_RESULTS)}) as provider,
        ScriptedOpenAIServer(script) as model,
    ):
        config = tmp_path / "eval.yaml"
        config.write_text(
            "toolsets: [terminal, web]\n"
            f"tools:\n  web:\n    base_url: {provider.base_url}\n    api_key_env: {KEY_VAR}\n"
        )
        args = command("eval", tmp_path, model.base_url)
        proc = clotho(*args, "--config", str(config), env={KEY_VAR: "sk-test-123"})
    assert proc.returncode == 0, proc.stderr
    names = {t["function"]["name"] for t in model.requests[0]["tools"]}
    assert {"terminal", "web_search", "web_extract"} <= names and "browser_navigate" not in names
    ((path, headers, body),) = provider.requests
    assert path == "/api/search" and body["query"] == "parcel rules"
    assert headers["Authorization"] == "Bearer sk-test-123"
    assert seen and "Parcel rules" in seen[0] and "https://example.test/oslo" in seen[0]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["tools"]["web"]["base_url"] == provider.base_url
