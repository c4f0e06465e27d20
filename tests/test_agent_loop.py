"""AgentLoop end to end: ChatClient -> scripted model server, real tools in a bwrap sandbox."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from typing import Any

import pytest
from tests.model_helpers import Held
from tests.sandbox_fixtures import processes_mentioning
from tests.scripted_openai import (
    HTTPError,
    Reply,
    ScriptedOpenAIServer,
    assistant,
    chat_client,
    fast_config,
    tool_call,
    usage,
)
from tests.support import PATIENCE_S, wait_until

from clotho.agent import AgentContext, AgentLimits, AgentLoop, AgentResult, LLMAgent
from clotho.agent.result import ToolErrorRecord
from clotho.chat import Usage
from clotho.errors import SandboxError
from clotho.sandbox import Sandbox
from clotho.tools import Tool, ToolRuntime, default_registry, tool

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
pytest_plugins = ("tests.sandbox_fixtures",)  # sandbox

USER = {"role": "user", "content": "Do the task."}
BUILTIN_NAMES = {"terminal", "read_file", "write_file", "edit_file", "search_files"}


def builtin_tools() -> list[Tool]:
    return default_registry().resolve(["terminal", "file"])


async def run_loop(
    server: ScriptedOpenAIServer,
    sandbox: Sandbox,
    *,
    tools: list[Tool] | None = None,
    limits: AgentLimits | None = None,
    messages: list[dict[str, Any]] | None = None,
    **config: Any,
) -> AgentResult:
    async with chat_client(fast_config(server.base_url, **config)) as client:
        loop = AgentLoop(
            client,
            tools if tools is not None else builtin_tools(),
            ToolRuntime(sandbox=sandbox),
            limits,
        )
        return await loop.run(messages or [USER])


def assert_well_formed(messages: list[dict[str, Any]]) -> None:
    """Every assistant tool call is answered, in order, by the tool messages right after it."""
    i = 0
    while i < len(messages):
        message = messages[i]
        calls = message.get("tool_calls") or []
        if message["role"] == "assistant" and calls:
            answers = messages[i + 1 : i + 1 + len(calls)]
            assert [m["role"] for m in answers] == ["tool"] * len(calls)
            assert [m["tool_call_id"] for m in answers] == [c["id"] for c in calls]
            i += len(calls)
        else:
            assert message["role"] != "tool", f"tool message without a call at {i}"
        i += 1


# -- a full run ---------------------------------------------------------------------------------


async def test_multi_turn_run_creates_a_file_reads_it_and_finishes(sandbox: Sandbox) -> None:
    command = "mkdir -p out && echo hello from the sandbox > out/greeting.txt && echo created"
    script = [
        Reply(
            assistant(
                "I will create the file.",
                [tool_call("terminal", {"command": command}, id="call_a")],
                reasoning_content="Need a file first.",
            ),
            usage=usage(100, 10),
        ),
        Reply(
            assistant(None, [tool_call("read_file", {"path": "out/greeting.txt"}, id="call_b")]),
            usage=usage(150, 5),
        ),
        Reply(assistant("Done: the file greets."), usage=usage(200, 7)),
    ]
    system = {"role": "system", "content": "You are a test agent."}
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox, messages=[system, USER])

    # The terminal call really ran in the sandbox.
    assert await sandbox.read_file("/app/out/greeting.txt") == b"hello from the sandbox\n"

    assert result.stop_reason == "finished"
    assert result.error is None
    assert result.turns == 3
    assert result.tool_calls == 2
    assert result.tool_errors == []
    assert result.usage == Usage(prompt_tokens=450, completion_tokens=22, total_tokens=472)
    assert len(result.timings) == 3
    assert result.timings[0].tools_s > 0
    assert result.reasoning == ["Need a file first.", None, None]

    messages = result.messages
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert_well_formed(messages)
    assert messages[2]["content"] == "I will create the file."
    assert messages[2]["reasoning_content"] == "Need a file first."
    assert messages[2]["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
    ]
    assert messages[3]["tool_call_id"] == "call_a"
    assert json.loads(messages[3]["content"]) == {
        "output": "created\n",
        "exit_code": 0,
        "timed_out": False,
    }
    assert messages[4]["content"] == ""  # null content becomes ""
    assert "reasoning_content" not in messages[4]
    assert messages[5]["tool_call_id"] == "call_b"
    assert messages[5]["content"] == "     1\thello from the sandbox"
    assert messages[6] == {"role": "assistant", "content": "Done: the file greets."}

    # What the model was sent: the growing conversation and the tool schemas every time.
    assert len(server.requests) == 3
    assert server.remaining == 0
    assert server.messages(0) == [system, USER]
    assert server.messages(1) == messages[:4]
    assert server.messages(2) == messages[:6]
    for body in server.requests:
        assert {t["function"]["name"] for t in body["tools"]} == BUILTIN_NAMES


async def test_messages_passed_in_are_not_mutated(sandbox: Sandbox) -> None:
    messages = [dict(USER)]
    script = [assistant("", [tool_call("terminal", {"command": "true"})]), assistant("done")]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox, messages=messages)
    assert messages == [USER]
    assert len(result.messages) == 4


async def test_arguments_sent_as_an_object_are_accepted(sandbox: Sandbox) -> None:
    call = {
        "id": "obj",
        "type": "function",
        "function": {"name": "terminal", "arguments": {"command": "echo -n object > o.txt"}},
    }
    script = [{"role": "assistant", "content": "", "tool_calls": [call]}, assistant("done")]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox)
    assert result.tool_errors == []
    assert await sandbox.read_file("o.txt") == b"object"
    sent = result.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert isinstance(sent, str)
    assert json.loads(sent) == {"command": "echo -n object > o.txt"}


# -- tool errors are told to the model ----------------------------------------------------------


@tool
async def explode(rt: ToolRuntime, what: str) -> str:
    """Fail with an unexpected exception.

    Args:
        what: what blew up.
    """
    raise RuntimeError(f"{what} blew up")


MARKER = "touch /app/ran"

ERROR_CASES = [
    pytest.param(
        "no_such_tool",
        json.dumps({"command": MARKER}),
        ["Error: unknown tool 'no_such_tool'", "Available tools: edit_file, explode, read_file"],
        id="unknown-tool",
    ),
    pytest.param(
        "terminal",
        '{"command": "touch /app/ran"',
        ["Error: the arguments of 'terminal' are not valid JSON", "nothing ran"],
        id="invalid-json",
    ),
    pytest.param(
        "terminal",
        json.dumps([MARKER]),
        ["Error: the arguments of 'terminal' must be a JSON object", "nothing ran"],
        id="json-array",
    ),
    pytest.param(
        "terminal",
        json.dumps({"cmd": MARKER}),
        ["Error: invalid arguments for 'terminal'", "command: Field required", "cmd: Extra"],
        id="missing-required",
    ),
    pytest.param(
        "terminal",
        json.dumps({"command": MARKER, "timeout": "soon"}),
        ["Error: invalid arguments for 'terminal'", "timeout: Input should be a valid integer"],
        id="wrong-type",
    ),
    pytest.param(
        "terminal",
        json.dumps({"command": MARKER, "sudo": True}),
        ["Error: invalid arguments for 'terminal'", "sudo: Extra inputs are not permitted"],
        id="unexpected-key",
    ),
    pytest.param(
        "read_file",
        json.dumps({"path": "missing.txt"}),
        ["Error: file not found: missing.txt"],
        id="tool-failure",
    ),
    pytest.param(
        "explode",
        json.dumps({"what": "the flux capacitor"}),
        ["Error: tool 'explode' failed: RuntimeError: the flux capacitor blew up"],
        id="tool-exception",
    ),
]


@pytest.mark.parametrize(("name", "arguments", "expected"), ERROR_CASES)
async def test_tool_error_is_fed_back_to_the_model(
    sandbox: Sandbox, name: str, arguments: str, expected: list[str]
) -> None:
    script = [
        assistant("", [tool_call(name, arguments, id="bad_call")]),
        assistant("I see the error; stopping."),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox, tools=[*builtin_tools(), explode])

    tool_message = result.messages[2]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "bad_call"
    assert tool_message["content"].startswith("Error")
    for fragment in expected:
        assert fragment in tool_message["content"]
    assert result.tool_errors == [
        ToolErrorRecord(turn=1, tool=name, arguments=arguments, error=tool_message["content"])
    ]
    # The model is told: the next request ends with exactly this tool message.
    assert server.messages(1)[-1] == tool_message
    assert result.stop_reason == "finished"
    assert result.turns == 2
    # A call that was rejected before running had no effect in the sandbox.
    assert (await sandbox.exec("test -e /app/ran")).exit_code == 1


async def test_long_arguments_are_cut_in_the_error_record(sandbox: Sandbox) -> None:
    arguments = json.dumps({"command": "x" * 2000, "bogus": 1})
    script = [assistant("", [tool_call("terminal", arguments)]), assistant("ok")]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox)
    [record] = result.tool_errors
    assert record.arguments == arguments[:500]
    # The conversation itself keeps the full arguments.
    assert result.messages[1]["tool_calls"][0]["function"]["arguments"] == arguments


async def test_good_and_bad_calls_in_one_turn(sandbox: Sandbox) -> None:
    calls = [
        tool_call("terminal", {"command": "echo -n one > one.txt"}, id="c1"),
        tool_call("read_file", {"path": "nope.txt"}, id="c2"),
        tool_call("no_such_tool", {}, id="c3"),
        tool_call("write_file", {"path": "two.txt", "content": "two"}, id="c4"),
    ]
    with ScriptedOpenAIServer([assistant("", calls), assistant("done")]) as server:
        result = await run_loop(server, sandbox)
    assert_well_formed(result.messages)
    outputs = [m["content"] for m in result.messages[2:6]]
    assert json.loads(outputs[0])["exit_code"] == 0
    assert outputs[1] == "Error: file not found: nope.txt"
    assert outputs[2].startswith("Error: unknown tool 'no_such_tool'")
    assert outputs[3] == "wrote 3 bytes to /app/two.txt"
    assert [(e.turn, e.tool) for e in result.tool_errors] == [(1, "read_file"), (1, "no_such_tool")]
    assert result.tool_calls == 4
    assert await sandbox.read_file("one.txt") == b"one"
    assert await sandbox.read_file("two.txt") == b"two"


async def test_sandbox_error_in_a_tool_propagates(sandbox: Sandbox) -> None:
    @tool
    async def broken(rt: ToolRuntime) -> str:
        """Break the sandbox."""
        raise SandboxError("the sandbox shell is gone")

    with (
        ScriptedOpenAIServer([assistant("", [tool_call("broken")])]) as server,
        pytest.raises(SandboxError, match="shell is gone"),
    ):
        await run_loop(server, sandbox, tools=[broken])


async def test_sandbox_error_in_a_parallel_call_cancels_its_siblings(sandbox: Sandbox) -> None:
    """Parallel calls share a TaskGroup: the broken one's SandboxError (itself, not an
    exception group) ends the run at once, and the sibling still waiting is cancelled."""
    log: list[str] = []
    waiting = asyncio.Event()

    @tool
    async def endless(rt: ToolRuntime) -> str:
        """Wait for ever: only cancelling ends it."""
        log.append("started")
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        return "unreachable"

    @tool
    async def broken(rt: ToolRuntime) -> str:
        """Break the sandbox once the other call is waiting."""
        await waiting.wait()
        raise SandboxError("the sandbox shell is gone")

    script = [assistant("", [tool_call("endless"), tool_call("broken")])]
    with (
        ScriptedOpenAIServer(script) as server,
        pytest.raises(SandboxError, match="shell is gone"),
    ):
        async with asyncio.timeout(PATIENCE_S):  # a run left waiting on `endless` fails
            await run_loop(server, sandbox, tools=[endless, broken])
    assert log == ["started", "cancelled"]


# -- several calls in one turn --------------------------------------------------------------


Log = list[tuple[str, str]]


def nap_tools(log: Log) -> list[Tool]:
    """Tools that log ("start", label) and ("end", label), and end when the test says: after
    the calls named in `together` have started and those in `after` have ended. The order of
    the log is then the order the loop ran them in, on any machine."""

    def happened(kind: str, labels: str) -> bool:
        return all((kind, label) in log for label in labels.split(",") if label)

    async def nap_for(label: str, together: str, after: str) -> None:
        log.append(("start", label))
        for _ in range(3):  # a call running alongside gets to start meanwhile
            await asyncio.sleep(0)
        # Run one at a time, a call waiting for another would wait in vain: it fails.
        if not await wait_until(lambda: happened("start", together) and happened("end", after)):
            raise RuntimeError(f"{label}: {together or after} never came")
        log.append(("end", label))

    @tool
    async def nap(rt: ToolRuntime, label: str, together: str = "", after: str = "") -> str:
        """Nap, and say so. Safe to run in parallel.

        Args:
            label: a name for this nap.
            together: comma-separated labels of naps that must have started before it ends.
            after: comma-separated labels of naps that must have ended before it ends.
        """
        await nap_for(label, together, after)
        return f"napped {label}"

    @tool(parallel=False)
    async def nap_alone(rt: ToolRuntime, label: str) -> str:
        """Nap, and say so. Never runs alongside another call.

        Args:
            label: a name for this nap.
        """
        await nap_for(label, "", "")
        return f"napped alone {label}"

    return [nap, nap_alone]


async def test_parallel_safe_calls_run_concurrently(sandbox: Sandbox) -> None:
    log: Log = []
    calls = [tool_call("nap", {"label": x, "together": "a,b,c"}, id=f"n{x}") for x in "abc"]
    with ScriptedOpenAIServer([assistant("", calls), assistant("rested")]) as server:
        result = await run_loop(server, sandbox, tools=nap_tools(log))
    assert log[:3] == [("start", "a"), ("start", "b"), ("start", "c")]  # every start first
    assert sorted(log[3:]) == [("end", "a"), ("end", "b"), ("end", "c")]
    assert [m["content"] for m in result.messages[2:5]] == ["napped a", "napped b", "napped c"]
    assert_well_formed(result.messages)


async def test_results_keep_call_order_when_calls_finish_out_of_order(sandbox: Sandbox) -> None:
    log: Log = []
    calls = [
        tool_call("nap", {"label": "slow", "after": "medium"}, id="slow"),
        tool_call("nap", {"label": "fast"}, id="fast"),
        tool_call("nap", {"label": "medium", "after": "fast"}, id="medium"),
    ]
    with ScriptedOpenAIServer([assistant("", calls), assistant("ok")]) as server:
        result = await run_loop(server, sandbox, tools=nap_tools(log))
    finished = [label for kind, label in log if kind == "end"]
    assert finished == ["fast", "medium", "slow"]
    tool_messages = result.messages[2:5]
    assert [m["tool_call_id"] for m in tool_messages] == ["slow", "fast", "medium"]
    assert [m["content"] for m in tool_messages] == ["napped slow", "napped fast", "napped medium"]


async def test_non_parallel_calls_run_one_after_another(sandbox: Sandbox) -> None:
    log: Log = []
    calls = [tool_call("nap_alone", {"label": x}, id=f"s{x}") for x in "abc"]
    with ScriptedOpenAIServer([assistant("", calls), assistant("ok")]) as server:
        result = await run_loop(server, sandbox, tools=nap_tools(log))
    # Each yields to the loop before it ends: run together, their starts would interleave.
    assert log == [(kind, x) for x in "abc" for kind in ("start", "end")]
    assert [m["content"] for m in result.messages[2:5]] == [
        "napped alone a",
        "napped alone b",
        "napped alone c",
    ]


async def test_a_non_parallel_call_splits_the_parallel_batches(sandbox: Sandbox) -> None:
    log: Log = []
    calls = [
        tool_call("nap", {"label": "p1", "together": "p1,p2"}),
        tool_call("nap", {"label": "p2", "together": "p1,p2"}),
        tool_call("nap_alone", {"label": "s"}),
        tool_call("nap", {"label": "p3"}),
    ]
    with ScriptedOpenAIServer([assistant("", calls), assistant("ok")]) as server:
        result = await run_loop(server, sandbox, tools=nap_tools(log))
    assert log[:2] == [("start", "p1"), ("start", "p2")]  # together
    assert sorted(log[2:4]) == [("end", "p1"), ("end", "p2")]
    # s after the batch before it, and before the one after it.
    assert log[4:] == [("start", "s"), ("end", "s"), ("start", "p3"), ("end", "p3")]
    assert [m["content"] for m in result.messages[2:6]] == [
        "napped p1",
        "napped p2",
        "napped alone s",
        "napped p3",
    ]


async def test_several_read_file_calls_in_one_turn(sandbox: Sandbox) -> None:
    for name in ("a", "b", "c"):
        await sandbox.write_file(f"{name}.txt", f"content of {name}\n".encode())
    calls = [tool_call("read_file", {"path": f"{x}.txt"}, id=f"r{x}") for x in "cab"]
    with ScriptedOpenAIServer([assistant("", calls), assistant("read")]) as server:
        result = await run_loop(server, sandbox)
    assert_well_formed(result.messages)
    assert [m["content"] for m in result.messages[2:5]] == [
        "     1\tcontent of c",
        "     1\tcontent of a",
        "     1\tcontent of b",
    ]
    assert server.messages(1)[-3:] == result.messages[2:5]


# -- limits ---------------------------------------------------------------------------------


def forever_calling(tool_name: str = "terminal", arguments: Any = None, **reply: Any) -> Reply:
    arguments = arguments if arguments is not None else {"command": "echo again"}
    return Reply(assistant("", [tool_call(tool_name, arguments)]), **reply)


async def test_max_turns(sandbox: Sandbox) -> None:
    with ScriptedOpenAIServer(default=forever_calling()) as server:
        result = await run_loop(server, sandbox, limits=AgentLimits(max_turns=3))
    assert result.stop_reason == "max_turns"
    assert result.turns == 3
    assert result.tool_calls == 3
    assert len(server.requests) == 3
    assert result.messages[-1]["role"] == "tool"
    assert_well_formed(result.messages)


# Long enough for one answer from the scripted model on a busy machine: the limits below
# must strike during what the test holds open (a command, a model request), not before.
LIMIT_S = 10.0


async def test_time_limit_closes_the_open_calls(sandbox: Sandbox) -> None:
    """The command outlives any patience; the limit kills it and the run goes on without it.
    (A unique duration finds this command among the host's processes.)"""
    seconds = f"{3600 + random.random():.9f}"
    calls = [
        tool_call("terminal", {"command": f"sleep {seconds} && touch done"}, id="sleeper"),
        tool_call("read_file", {"path": "x.txt"}, id="never_ran"),
    ]
    with ScriptedOpenAIServer([assistant("", calls), assistant("unreachable")]) as server:
        async with asyncio.timeout(PATIENCE_S):  # a run that waited for the command fails
            result = await run_loop(server, sandbox, limits=AgentLimits(time_limit_s=LIMIT_S))
    assert result.stop_reason == "time_limit"
    assert result.duration_s >= LIMIT_S - 0.01  # the limit ended it, not anything before
    assert len(server.requests) == 1
    assert result.messages[-2:] == [
        {
            "role": "tool",
            "tool_call_id": "sleeper",
            "content": "Error: the agent's time limit was reached",
        },
        {
            "role": "tool",
            "tool_call_id": "never_ran",
            "content": "Error: the agent's time limit was reached",
        },
    ]
    assert_well_formed(result.messages)
    # The command was killed, not left running or waited for, and the sandbox is usable.
    assert await wait_until(lambda: processes_mentioning(seconds) == [])
    done = await sandbox.exec("test -e done && echo done || echo killed", timeout=PATIENCE_S)
    assert done.stdout == "killed\n"


async def test_time_limit_while_waiting_for_the_model(sandbox: Sandbox) -> None:
    held = Held()
    script = [assistant("", [tool_call("terminal", {"command": "true"}, id="quick")]), held]
    with ScriptedOpenAIServer(script) as server:
        try:
            async with asyncio.timeout(PATIENCE_S):  # a run that waited for the answer fails
                result = await run_loop(server, sandbox, limits=AgentLimits(time_limit_s=LIMIT_S))
            # The limit struck while the model was asked: nothing had answered.
            assert (len(server.requests), held.answered) == (2, 0)
        finally:
            held.release.set()
    assert result.stop_reason == "time_limit"
    assert result.turns == 1
    assert_well_formed(result.messages)
    assert result.messages[-1]["tool_call_id"] == "quick"  # no extra error message added
    assert len(result.messages) == 3


async def test_token_limit(sandbox: Sandbox) -> None:
    with ScriptedOpenAIServer(default=forever_calling(usage=usage(50, 10))) as server:
        result = await run_loop(server, sandbox, limits=AgentLimits(max_total_tokens=100))
    assert result.stop_reason == "token_limit"
    assert result.turns == 2
    assert result.usage == Usage(prompt_tokens=100, completion_tokens=20, total_tokens=120)
    assert len(server.requests) == 2
    assert_well_formed(result.messages)


async def test_model_error_stops_the_run_without_raising(sandbox: Sandbox) -> None:
    with ScriptedOpenAIServer(default=HTTPError(500, "upstream exploded")) as server:
        result = await run_loop(server, sandbox, max_retries=2)
    assert result.stop_reason == "model_error"
    assert result.error is not None
    assert "HTTP 500" in result.error and "upstream exploded" in result.error
    assert result.turns == 0
    assert result.messages == [USER]
    assert len(server.requests) == 3


async def test_model_error_after_some_turns_keeps_the_conversation(sandbox: Sandbox) -> None:
    script = [assistant("", [tool_call("terminal", {"command": "echo -n hi > hi.txt"})])]
    with ScriptedOpenAIServer(script, default=HTTPError(503)) as server:
        result = await run_loop(server, sandbox, max_retries=1)
    assert result.stop_reason == "model_error"
    assert result.error is not None and "HTTP 503" in result.error
    assert result.turns == 1
    assert [m["role"] for m in result.messages] == ["user", "assistant", "tool"]
    assert await sandbox.read_file("hi.txt") == b"hi"


async def test_client_error_stops_the_run_at_once(sandbox: Sandbox) -> None:
    with ScriptedOpenAIServer(default=HTTPError(400, "prompt too long")) as server:
        result = await run_loop(server, sandbox, max_retries=5)
    assert result.stop_reason == "model_error"
    assert result.error is not None and "prompt too long" in result.error
    assert len(server.requests) == 1


# -- ids and reasoning ----------------------------------------------------------------------


async def test_duplicate_and_missing_tool_call_ids_are_made_unique(sandbox: Sandbox) -> None:
    def echo(text: str, id: str | None) -> dict[str, Any]:
        return tool_call("terminal", {"command": f"echo {text}"}, id=id)

    script = [
        # Two calls with the same id in one turn.
        {"role": "assistant", "content": "", "tool_calls": [echo("1", "dup"), echo("2", "dup")]},
        # The same id again in a later turn.
        {"role": "assistant", "content": "", "tool_calls": [echo("3", "dup")]},
        # No ids at all, and an empty one.
        {"role": "assistant", "content": "", "tool_calls": [echo("4", None), echo("5", "")]},
        assistant("done"),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox)

    ids = [c["id"] for m in result.messages for c in m.get("tool_calls") or []]
    assert len(ids) == 5
    assert len(set(ids)) == 5
    assert ids[0] == "dup"
    assert all(isinstance(i, str) and i for i in ids)
    assert_well_formed(result.messages)
    # Each answer belongs to its own call.
    outputs = [json.loads(m["content"])["output"] for m in result.messages if m["role"] == "tool"]
    assert outputs == ["1\n", "2\n", "3\n", "4\n", "5\n"]
    # The model is sent the unique ids too.
    sent = [c["id"] for m in server.messages(-1) for c in m.get("tool_calls") or []]
    assert sent == ids


async def test_reasoning_is_recorded_per_turn(sandbox: Sandbox) -> None:
    call = tool_call("terminal", {"command": "true"})
    script = [
        assistant("Step one.", [call], reasoning_content="plan A"),
        assistant("<think>checking the output</think>Looks fine.", [call]),
        assistant("No thoughts here.", [call]),
        assistant("All done.", reasoning_details=[{"type": "reasoning.text", "text": "wrap up"}]),
    ]
    with ScriptedOpenAIServer(script) as server:
        result = await run_loop(server, sandbox)
    assert result.reasoning == ["plan A", "checking the output", None, "wrap up"]
    turns = [m for m in result.messages if m["role"] == "assistant"]
    assert [m["content"] for m in turns] == [
        "Step one.",
        "Looks fine.",
        "No thoughts here.",
        "All done.",
    ]
    assert [m.get("reasoning_content") for m in turns] == result.reasoning
    # The reasoning goes back to the model with the assistant message; <think> does not.
    second_request_assistant = server.messages(1)[1]
    assert second_request_assistant["reasoning_content"] == "plan A"
    assert "<think>" not in json.dumps(server.requests[-1])


# -- LLMAgent -------------------------------------------------------------------------------


async def test_llm_agent_sends_system_prompt_and_instruction(sandbox: Sandbox) -> None:
    script = [
        assistant("", [tool_call("write_file", {"path": "answer.txt", "content": "42"})]),
        assistant("Wrote the answer."),
    ]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            agent = LLMAgent(client, builtin_tools())
            result = await agent.run(
                AgentContext(instruction="Answer in answer.txt", sandbox=sandbox)
            )
    first = server.messages(0)
    assert [m["role"] for m in first] == ["system", "user"]
    assert "/app" in first[0]["content"]
    assert "{workdir}" not in first[0]["content"]
    assert first[1]["content"] == "Answer in answer.txt"
    assert result.stop_reason == "finished"
    assert await sandbox.read_file("/app/answer.txt") == b"42"


async def test_llm_agent_uses_the_shorter_time_limit(sandbox: Sandbox) -> None:
    script = [assistant("", [tool_call("terminal", {"command": "sleep 30"})])]
    with ScriptedOpenAIServer(script) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            agent = LLMAgent(client, builtin_tools(), limits=AgentLimits(time_limit_s=100))
            ctx = AgentContext(instruction="wait", sandbox=sandbox, time_limit_s=0.4)
            result = await agent.run(ctx)
    # Under the agent's own 100 s limit the command would end and the script run out (a
    # model error); the context's 0.4 s struck first.
    assert result.stop_reason == "time_limit"
    assert agent.limits.time_limit_s == 100  # the agent's own limits are left alone


async def test_llm_agent_without_system_prompt(sandbox: Sandbox) -> None:
    with ScriptedOpenAIServer([assistant("nothing to do")]) as server:
        async with chat_client(fast_config(server.base_url)) as client:
            agent = LLMAgent(client, builtin_tools(), system_prompt=None)
            result = await agent.run(AgentContext(instruction="hi", sandbox=sandbox))
    assert server.messages(0) == [{"role": "user", "content": "hi"}]
    assert result.turns == 1
