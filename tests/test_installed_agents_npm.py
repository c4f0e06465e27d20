"""codex, claude-code and opencode, the real npm packages (pinned, installed once from npm's
configured registry into ~/.cache/clotho), run headless in real sandboxes (local and Docker)
on a bundled task, their model calls through the gateway (codex: the Responses API;
claude-code: Anthropic Messages; opencode: OpenAI chat) to `ScriptedOpenAIServer`, the TEST
DOUBLE of a hosted model. Led through the task's own solution each earns reward 1; told
nothing useful, 0. The trial keeps the gateway's record and the agent's own log."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.sandbox_fixtures import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

from clotho.errors import TaskError
from clotho.gateway import GatewayLimits
from clotho.installed_agents import InstalledAgentRunner, agent_names, installed_agent
from clotho.installed_agents.base import default_cache_dir
from clotho.installed_agents.claude_code import ClaudeCode
from clotho.installed_agents.native import LOADER, glibc_problem
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.config import DockerSandboxConfig, SandboxConfig
from clotho.sandbox.pool import SlotPool
from clotho.tasks.harbor import load_task
from clotho.tasks.trial import HarborTrial, run_trial

# npm installs the agents; under CI its absence is a failure (the install says so), elsewhere
# the tests are skipped with the reason shown.
requires_npm = pytest.mark.skipif(
    shutil.which("npm") is None and os.environ.get("CI") != "true",
    reason="npm is not installed: the npm agents are installed with it",
)
pytestmark = [pytest.mark.bwrap, requires_bwrap, requires_npm]
pytest_plugins = ("tests.gateway_fixtures",)  # gateway_for

TASK = Path(__file__).parents[1] / "examples" / "tasks" / "fix-roman-numerals"
SOLVED = "CLOTHO_SOLVED"
SOLUTION = "bash -c " + shlex.quote((TASK / "solution" / "solve.sh").read_text())
SOLVE = f"{SOLUTION} && echo {SOLVED}"


def _tool_outputs(body: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in body["messages"] if m.get("role") == "tool"]


# --- scripted policies (what the model says), per agent's tools ------------------------------


def codex_solving(body: dict[str, Any]) -> dict[str, Any]:
    """Run the task's solution with codex's `exec_command` until a run of it prints SOLVED
    (a run still going when codex yields is polled with `write_stdin`), then finish."""
    outputs = _tool_outputs(body)
    last = outputs[-1] if outputs else ""
    if SOLVED in last.replace(f"echo {SOLVED}", ""):
        return assistant("The converter is fixed.")
    running = re.search(r"session ID (\d+)", last)
    if running:
        poll = {"session_id": int(running.group(1)), "chars": "", "yield_time_ms": 30000}
        return assistant("", [tool_call("write_stdin", poll)])
    return assistant("", [tool_call("exec_command", {"cmd": SOLVE, "yield_time_ms": 30000})])


def codex_giving_up(body: dict[str, Any]) -> dict[str, Any]:
    if not _tool_outputs(body):
        return assistant("", [tool_call("exec_command", {"cmd": "ls /app"})])
    return assistant("Nothing to do.")


def claude_solving(body: dict[str, Any]) -> dict[str, Any]:
    """Run the task's solution with Claude Code's `Bash` until a run of it prints SOLVED."""
    outputs = _tool_outputs(body)
    if outputs and SOLVED in outputs[-1].replace(f"echo {SOLVED}", ""):
        return assistant("The converter is fixed.")
    arguments = {"command": SOLVE, "description": "apply the fix", "timeout": 600000}
    return assistant("", [tool_call("Bash", arguments)])


def claude_giving_up(body: dict[str, Any]) -> dict[str, Any]:
    if not _tool_outputs(body):
        return assistant("", [tool_call("Bash", {"command": "ls /app", "description": "look"})])
    return assistant("Nothing to do.")


def opencode_solving(body: dict[str, Any]) -> dict[str, Any]:
    """Run the task's solution with OpenCode's `bash` until a run of it prints SOLVED; its
    calls without tools (a title for the session) get a title."""
    if not body.get("tools"):
        return assistant("Fix the Roman numerals")
    outputs = _tool_outputs(body)
    if outputs and SOLVED in outputs[-1].replace(f"echo {SOLVED}", ""):
        return assistant("The converter is fixed.")
    arguments = {"command": SOLVE, "description": "apply the fix", "timeout": 600000}
    return assistant("", [tool_call("bash", arguments)])


def opencode_giving_up(body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("tools"):
        return assistant("Look around")
    if not _tool_outputs(body):
        return assistant("", [tool_call("bash", {"command": "ls /app", "description": "look"})])
    return assistant("Nothing to do.")


POLICIES = {
    "codex": (codex_solving, codex_giving_up),
    "claude-code": (claude_solving, claude_giving_up),
    "opencode": (opencode_solving, opencode_giving_up),
}
API = {"codex": "openai-responses", "claude-code": "anthropic-messages", "opencode": "openai-chat"}
AGENTS = list(POLICIES)


async def _attempt(
    name: str,
    policy: Callable[[dict[str, Any]], dict[str, Any]],
    gateway_for: Any,
    config: SandboxConfig,
) -> tuple[Any, Any, ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=policy) as server:
        runner = InstalledAgentRunner(
            installed_agent(name), gateway_for(server), GatewayLimits(max_turns=12)
        )
        async with SlotPool() as pool:
            outcome = await run_trial(HarborTrial(load_task(TASK)), runner, config, pool)
    assert len(runner.runs) == 1, outcome.error  # the agent ran (else: why not)
    return outcome, runner.runs[0], server


def _check_solved(name: str, outcome: Any, run: Any, server: ScriptedOpenAIServer) -> None:
    assert outcome.error is None, (outcome.error, run.output)
    assert (outcome.reward, outcome.passed) == (1.0, True), (outcome.verifier, run.output)
    record = run.record
    assert record.turns == len(server.requests) >= 2
    assert {e.api for e in record.exchanges} == {API[name]}
    assert all(e.status == 200 for e in record.exchanges), [e.error for e in record.exchanges]
    first = record.exchanges[0]
    # The task's instruction reached the model, as the agent sent it.
    assert "Roman numeral" in json.dumps(first.request)
    assert first.forwarded is not None and first.response is not None
    # The last request carries the solution's output (SOLVED) back to the model.
    assert any(SOLVED in out for out in _tool_outputs(server.requests[-1]))
    # The agent's own log, read from the sandbox before it closed, says it finished.
    assert run.trajectory is not None and run.exit_code == 0, run.output
    events = [json.loads(line) for line in run.trajectory.splitlines() if line.strip()]
    if name == "codex":
        assert events[-1]["type"] == "turn.completed"
    elif name == "claude-code":
        assert events[-1]["type"] == "result" and events[-1]["subtype"] == "success"
    else:
        assert events[-1]["type"] == "step_finish" and events[-1]["part"]["reason"] == "stop"
    assert outcome.agent is not None and outcome.agent.stop_reason == "finished"
    assert outcome.agent.turns == record.turns
    assert outcome.agent.messages[-1]["content"] == "The converter is fixed."


def _check_failed(name: str, outcome: Any, run: Any, server: ScriptedOpenAIServer) -> None:
    assert outcome.error is None, (outcome.error, run.output)
    assert (outcome.reward, outcome.passed) == (0.0, False)
    assert run.record.turns == len(server.requests)
    assert len([r for r in server.requests if r.get("tools")]) == 2  # a look, then the end
    assert run.exit_code == 0 and run.trajectory is not None, run.output  # ran to its own end


# Each agent twice on each backend: led through the solution it passes, giving up it fails.
BACKENDS = [
    pytest.param(LocalSandboxConfig, id="locally"),
    pytest.param(DockerSandboxConfig, id="on-docker", marks=requires_docker),
]
ENDINGS = {"led-to-the-solution-passes": (0, _check_solved), "giving-up-fails": (1, _check_failed)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("name", AGENTS)
async def test_led_to_the_solution_passes_and_giving_up_fails(
    name: str, ending: str, backend: type[SandboxConfig], gateway_for: Any
) -> None:
    policy, check = ENDINGS[ending]
    outcome, run, server = await _attempt(name, POLICIES[name][policy], gateway_for, backend())
    check(name, outcome, run, server)


def test_the_npm_agents_are_registered_and_pinned() -> None:
    assert {"codex", "claude-code", "mini-swe-agent"} <= set(agent_names())
    for name in AGENTS:
        assert re.fullmatch(r"\d+\.\d+\.\d+", installed_agent(name).version)


async def test_the_installs_hold_self_contained_binaries() -> None:
    """codex's binary is static (any Linux image); claude's and opencode's are native, linked
    to glibc only (no Node anywhere in the installs)."""
    cache = default_cache_dir()
    codex = await installed_agent("codex").prepare("3.11", cache)
    claude = await installed_agent("claude-code").prepare("3.11", cache)
    opencode = await installed_agent("opencode").prepare("3.11", cache)
    assert codex.root == cache / "agents" / "codex-0.171.0"
    head = (codex.site / "bin" / "codex").read_bytes()[:64]
    assert head[:4] == b"\x7fELF"
    interp = _elf_interpreter(codex.site / "bin" / "codex")
    assert interp is None  # static: no loader to find in the image
    assert _elf_interpreter(claude.site / "bin" / "claude") == LOADER
    assert _elf_interpreter(opencode.site / "bin" / "opencode") == LOADER
    for install in (codex, claude, opencode):
        assert not list(install.site.rglob("node")) and not list(install.site.rglob("*.js"))
        assert install.stamp.bytes > 0 and install.stamp.python == "any"


def _elf_interpreter(path: Path) -> str | None:
    """The PT_INTERP of an ELF64 little-endian file (None: statically linked)."""
    import struct

    with path.open("rb") as f:
        header = f.read(64)
        phoff, = struct.unpack_from("<Q", header, 32)  # fmt: skip
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", table, i * phentsize)
            if kind == 3:  # PT_INTERP
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode()
    return None


def test_an_image_without_a_recent_glibc_is_named() -> None:
    def problem(said: str) -> str | None:
        return glibc_problem(said, "claude-code", (2, 26))

    assert problem("glibc 2.36") is None and problem("glibc 2.26") is None
    assert "claude-code agent needs glibc >= 2.26" in str(problem("glibc 2.17"))
    assert "it has 2.17" in str(problem("glibc 2.17"))
    assert "no glibc" in str(problem("none")) and "no glibc" in str(problem(""))
    assert problem("glibc unknown") is None  # the loader is there; the binary decides


async def test_check_image_passes_a_glibc_sandbox(tmp_path: Path) -> None:
    from clotho.sandbox import open_sandbox

    async with await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path))) as sandbox:
        await ClaudeCode().check_image(sandbox)  # the host's glibc: no error
        await sandbox.exec("mkdir -p /tmp/bare")
        with pytest.raises(TaskError, match=r"claude-code agent needs glibc >= 2\.26"):
            await ClaudeCode().check_image(sandbox, loader="/tmp/bare/ld-linux-x86-64.so.2")


class _ClaudeCodeOnABareImage(ClaudeCode):
    """claude-code judging the image by a loader that is not there, as in an image without
    glibc (every image here has one)."""

    async def check_image(self, sandbox: Any, *, loader: str = LOADER) -> None:
        await super().check_image(sandbox, loader="/nonexistent/ld-linux-x86-64.so.2")


async def test_a_trial_on_an_image_the_agent_cannot_run_is_the_tasks_error(
    gateway_for: Any,
) -> None:
    """The runner checks the image before anything else: the trial is `task` (not scored,
    not retried as infra), naming what is missing, and the model is never asked."""
    with ScriptedOpenAIServer(default=lambda body: assistant("done")) as server:
        runner = InstalledAgentRunner(
            _ClaudeCodeOnABareImage(), gateway_for(server), GatewayLimits(max_turns=2)
        )
        async with SlotPool() as pool:
            trial = HarborTrial(load_task(TASK))
            outcome = await run_trial(trial, runner, LocalSandboxConfig(), pool)
    assert outcome.error is not None and outcome.error.kind == "task", outcome.error
    assert "claude-code agent needs glibc" in outcome.error.message
    assert server.requests == [] and runner.runs == []
