"""Tools: the registry (schemas, validation), toolsets and distributions, and the built-in
tools run against a real bubblewrap sandbox."""

from __future__ import annotations

import json
import random
import re
import shutil
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import ValidationError

from clotho.errors import ConfigError, describe_validation_error
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.base import Sandbox
from clotho.tools import (
    Tool,
    ToolFailure,
    ToolRegistry,
    ToolRuntime,
    Toolset,
    ToolsetDistribution,
    default_registry,
    tool,
)
from clotho.tools.files import edit_file, read_file, search_files, write_file
from clotho.tools.runtime import truncate_middle
from clotho.tools.terminal import terminal
from clotho.tools.tool import parse_docstring


async def call(t: Tool, rt: ToolRuntime, **arguments: Any) -> str:
    return await t.run(rt, t.validate(arguments))


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    sb = await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path / "state")))
    try:
        yield sb
    finally:
        await sb.close()


@pytest.fixture
def rt(sandbox: Sandbox) -> ToolRuntime:
    return ToolRuntime(sandbox=sandbox)


# --- registry: schemas and validation --------------------------------------------------------


@tool
async def sample_tool(
    rt: ToolRuntime,
    name: str,
    count: int = 3,
    mode: Literal["fast", "slow"] = "fast",
    tags: list[str] | None = None,
) -> str:
    """Do a sample thing.

    A second paragraph with details.

    Args:
        name: the name to use.
        count: how many times,
            continued on a second line.
        mode: which mode to run in.

    Returns:
        something nobody reads.
    """
    result = await rt.sandbox.exec(f"printf '%s|%s|%s|%s' {name!r} {count} {mode} {tags!r}")
    return result.stdout


def test_schema_from_hints_and_docstring() -> None:
    schema = sample_tool.schema()
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "sample_tool"
    assert fn["description"] == "Do a sample thing.\n\nA second paragraph with details."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["additionalProperties"] is False
    assert params["required"] == ["name"]
    assert "title" not in params
    props = params["properties"]
    assert list(props) == ["name", "count", "mode", "tags"]  # the runtime is not an argument
    assert props["name"] == {"type": "string", "description": "the name to use."}
    assert props["count"] == {
        "type": "integer",
        "default": 3,
        "description": "how many times, continued on a second line.",
    }
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["mode"]["default"] == "fast"
    assert props["mode"]["description"] == "which mode to run in."
    assert "description" not in props["tags"]  # undocumented
    assert props["tags"]["default"] is None
    assert all("title" not in p for p in props.values())
    json.dumps(schema)  # serialisable as is


def test_parse_docstring_sections() -> None:
    description, params = parse_docstring(
        """Summary line.

        Args:
            a (int): first.
            b: second
                spanning two lines.
        Returns:
            ignored: not a parameter.
        """
    )
    assert description == "Summary line."
    assert params == {"a": "first.", "b": "second spanning two lines."}
    assert parse_docstring(None) == ("", {})


def test_builtin_schemas() -> None:
    registry = default_registry()
    assert set(registry.tools) == {
        "terminal",
        "read_file",
        "write_file",
        "edit_file",
        "search_files",
        "browser_navigate",
        "browser_snapshot",
        "browser_click",
        "browser_type",
        "browser_select",
        "browser_back",
        "browser_screenshot",
        "web_search",
        "web_extract",
        "analyze_image",
    }
    search = registry.tools["search_files"].schema()["function"]["parameters"]
    assert search["properties"]["mode"]["enum"] == ["content", "files"]
    assert search["required"] == ["pattern"]
    assert search["properties"]["limit"]["default"] == 100
    edit = registry.tools["edit_file"].schema()["function"]["parameters"]
    assert edit["required"] == ["path", "old_string", "new_string"]
    assert edit["properties"]["replace_all"] == {
        "type": "boolean",
        "default": False,
        "description": "replace every occurrence instead of exactly one.",
    }
    assert registry.tools["terminal"].parallel is False
    assert registry.tools["read_file"].parallel is True
    for t in registry.tools.values():
        params = t.schema()["function"]["parameters"]
        assert params["additionalProperties"] is False
        assert "rt" not in params["properties"]
        assert t.description
        for name, prop in params["properties"].items():
            assert prop.get("description"), f"{t.name}.{name} has no description"


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        ({"name": 5}, "name"),
        ({"name": "x", "count": "many"}, "count"),
        ({"name": "x", "mode": "medium"}, "mode"),
        ({"name": "x", "tags": "not-a-list"}, "tags"),
        ({"name": "x", "bogus": 1}, "bogus"),
        ({}, "name"),
    ],
)
def test_validation_errors(arguments: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError) as info:
        sample_tool.validate(arguments)
    message = describe_validation_error(info.value)
    assert message.startswith(f"{where}: ")


def test_validation_accepts_and_fills_defaults() -> None:
    args = sample_tool.validate({"name": "n", "tags": ["a"]})
    assert (args.name, args.count, args.mode, args.tags) == ("n", 3, "fast", ["a"])
    unknown = describe_validation_error(_error({"name": "n", "extra_arg": 1}))
    assert "extra_arg" in unknown and "Extra inputs are not permitted" in unknown


def _error(arguments: dict[str, Any]) -> ValidationError:
    try:
        sample_tool.validate(arguments)
    except ValidationError as exc:
        return exc
    raise AssertionError("no validation error")


def test_non_async_function_is_rejected() -> None:
    def sync_tool(rt: ToolRuntime, x: str) -> str:
        """Not async."""
        return x

    with pytest.raises(TypeError, match="async"):
        tool(sync_tool)
    with pytest.raises(TypeError, match="async"):
        tool(name="renamed")(sync_tool)


def test_missing_type_hint_is_rejected() -> None:
    async def untyped(rt: ToolRuntime, x) -> str:  # type: ignore[no-untyped-def]
        return str(x)

    with pytest.raises(TypeError, match="type hint"):
        tool(untyped)


def test_decorator_options() -> None:
    @tool(name="renamed", parallel=False)
    async def original(rt: ToolRuntime, x: int) -> str:
        """Renamed tool."""
        return str(x)

    assert original.name == "renamed"
    assert original.parallel is False
    assert original.schema()["function"]["name"] == "renamed"
    assert original.schema()["function"]["description"] == "Renamed tool."


@pytest.mark.bwrap
async def test_tool_run_passes_validated_arguments(rt: ToolRuntime) -> None:
    out = await call(sample_tool, rt, name="n", count=7, mode="slow")
    assert out == "n|7|slow|None"


# --- toolsets --------------------------------------------------------------------------------


def _named_tool(tool_name: str) -> Tool:
    async def fn(rt: ToolRuntime) -> str:
        """A test tool."""
        return tool_name

    return tool(name=tool_name)(fn)


@pytest.fixture
def registry() -> ToolRegistry:
    reg = ToolRegistry()
    for name in ("t1", "t2", "t3", "t4", "t5"):
        reg.add_tool(_named_tool(name))
    reg.add_toolset(Toolset(name="a", tools=["t1", "t2"]))
    reg.add_toolset(Toolset(name="b", tools=["t3"]))
    reg.add_toolset(Toolset(name="c", tools=["t4"], includes=["a", "b"]))
    reg.add_toolset(Toolset(name="d", tools=["t5", "t2"]))
    return reg


def names(tools: list[Tool]) -> list[str]:
    return [t.name for t in tools]


def test_toolset_includes(registry: ToolRegistry) -> None:
    assert registry.toolset_tools("c") == ["t4", "t1", "t2", "t3"]
    assert names(registry.resolve(["c"])) == ["t4", "t1", "t2", "t3"]
    assert names(registry.resolve(["c", "d"])) == ["t4", "t1", "t2", "t3", "t5"]
    assert names(registry.resolve()) == ["t1", "t2", "t3", "t4", "t5"]


def test_resolve_applies_enabled_and_disabled(registry: ToolRegistry) -> None:
    assert names(registry.resolve(["c"], ["a"])) == ["t4", "t3"]
    assert names(registry.resolve(["c"], ["d"])) == ["t4", "t1", "t3"]
    assert names(registry.resolve(None, ["c"])) == ["t5"]
    assert names(registry.resolve(["c"], ["c"])) == []
    assert names(registry.resolve(["a"], [])) == ["t1", "t2"]


def test_default_registry_resolve() -> None:
    reg = default_registry()
    assert names(reg.resolve(["coding"])) == [
        "terminal",
        "read_file",
        "write_file",
        "edit_file",
        "search_files",
    ]
    assert names(reg.resolve(["coding"], ["file"])) == ["terminal"]
    assert names(reg.resolve(["coding"], ["terminal"])) == [
        "read_file",
        "write_file",
        "edit_file",
        "search_files",
    ]
    # Fresh registries: changing one does not touch another.
    reg.add_tool(_named_tool("extra"))
    assert "extra" not in default_registry().tools


def test_toolset_errors(registry: ToolRegistry) -> None:
    registry.add_toolset(Toolset(name="x", includes=["y"]))
    registry.add_toolset(Toolset(name="y", includes=["z"]))
    registry.add_toolset(Toolset(name="z", includes=["x"]))
    registry.add_toolset(Toolset(name="self", tools=["t1"], includes=["self"]))
    registry.add_toolset(Toolset(name="ghost", tools=["nope"]))
    registry.add_toolset(Toolset(name="dangling", includes=["missing"]))
    for enabled in (["x"], ["self"]):
        with pytest.raises(ConfigError, match="includes itself"):
            registry.resolve(enabled)
    with pytest.raises(ConfigError, match="includes itself"):
        registry.resolve(["a"], ["y"])
    with pytest.raises(ConfigError, match="unknown tool 'nope'"):
        registry.resolve(["ghost"])
    with pytest.raises(ConfigError, match="unknown toolset 'missing'"):
        registry.resolve(["dangling"])
    with pytest.raises(ConfigError, match="unknown toolset"):
        registry.resolve(["a"], ["no-such-set"])
    with pytest.raises(ConfigError, match="registered twice"):
        registry.add_tool(_named_tool("t1"))


def test_diamond_include_is_not_a_cycle(registry: ToolRegistry) -> None:
    registry.add_toolset(Toolset(name="left", includes=["a"]))
    registry.add_toolset(Toolset(name="right", includes=["a"]))
    registry.add_toolset(Toolset(name="top", includes=["left", "right"]))
    assert names(registry.resolve(["top"])) == ["t1", "t2"]


# --- distributions ---------------------------------------------------------------------------


def test_sampling_is_never_empty(registry: ToolRegistry) -> None:
    dist = ToolsetDistribution(name="rare", probabilities={"a": 1e-9, "b": 1e-6, "d": 0.0})
    rng = random.Random(0)
    samples = [dist.sample(rng) for _ in range(1000)]
    assert all(samples)
    assert all(s == ["b"] for s in samples)  # the most likely toolset is the fallback
    registry.add_distribution(dist)
    for _ in range(1000):
        assert names(registry.sample("rare", rng)) == ["t3"]


def test_sampling_respects_probabilities() -> None:
    dist = ToolsetDistribution(name="d", probabilities={"a": 0.2, "b": 0.5, "c": 0.9})
    rng = random.Random(12345)
    n = 20_000
    counts: Counter[str] = Counter()
    for _ in range(n):
        counts.update(dist.sample(rng))
    # Nothing drawn (0.8 * 0.5 * 0.1 = 4 %) falls back to the most likely one, "c".
    expected = {"a": 0.2, "b": 0.5, "c": 0.9 + 0.04}
    for key, p in expected.items():
        assert abs(counts[key] / n - p) < 0.03, (key, counts[key] / n)


def test_sampling_is_reproducible_with_a_seed() -> None:
    dist = ToolsetDistribution(name="d", probabilities={"a": 0.5, "b": 0.5, "c": 0.5})
    first = [dist.sample(random.Random(99)) for _ in range(5)]
    again = [dist.sample(random.Random(99)) for _ in range(5)]
    assert first == again
    rng1, rng2 = random.Random(5), random.Random(5)
    assert [dist.sample(rng1) for _ in range(50)] == [dist.sample(rng2) for _ in range(50)]


def test_registry_sample_applies_disabled(registry: ToolRegistry) -> None:
    registry.add_distribution(ToolsetDistribution(name="all", probabilities={"c": 1.0}))
    rng = random.Random(1)
    assert names(registry.sample("all", rng)) == ["t4", "t1", "t2", "t3"]
    assert names(registry.sample("all", rng, disabled=["a"])) == ["t4", "t3"]
    with pytest.raises(ConfigError, match="unknown toolset distribution"):
        registry.sample("nope", rng)


@pytest.mark.parametrize(
    "probabilities",
    [
        {"a": 1.5},
        {"a": -0.1},
        {"a": 0.5, "b": 2.0},
        {"a": float("nan")},
        {"a": float("inf")},
        {"a": 0.0, "b": 0.0},
        {},
    ],
)
def test_bad_probabilities_rejected(probabilities: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        ToolsetDistribution(name="bad", probabilities=probabilities)


def test_probability_bounds_are_inclusive() -> None:
    dist = ToolsetDistribution(name="ok", probabilities={"a": 0.0, "b": 1.0})
    assert dist.sample(random.Random(0)) == ["b"]


def test_distribution_with_unknown_toolset_rejected(registry: ToolRegistry) -> None:
    with pytest.raises(ConfigError, match="unknown toolsets"):
        registry.add_distribution(
            ToolsetDistribution(name="x", probabilities={"a": 0.5, "nope": 0.5})
        )


def test_builtin_distributions() -> None:
    reg = default_registry()
    rng = random.Random(3)
    for _ in range(200):
        assert names(reg.sample("terminal_only", rng)) == ["terminal"]
        assert reg.sample("development", rng)


# --- truncation helper -----------------------------------------------------------------------


def test_truncate_middle() -> None:
    assert truncate_middle("short", 10) == "short"
    assert truncate_middle("x" * 10, 10) == "x" * 10
    text = "".join(str(i % 10) for i in range(1000))
    out = truncate_middle(text, 100)
    head, marker, tail = out.split("\n")
    assert head == text[:50]
    assert tail == text[-50:]
    assert marker == "[... 900 characters truncated ...]"


# --- terminal --------------------------------------------------------------------------------


@pytest.mark.bwrap
async def test_terminal_json_and_merged_stderr(rt: ToolRuntime) -> None:
    out = json.loads(await call(terminal, rt, command="echo out; echo err >&2; echo out2; exit 3"))
    assert out == {"output": "out\nerr\nout2\n", "exit_code": 3, "timed_out": False}


@pytest.mark.bwrap
async def test_terminal_is_a_session_that_starts_in_the_workdir(rt: ToolRuntime) -> None:
    await call(terminal, rt, command="mkdir -p sub/dir && cd sub && export X=1")
    out = json.loads(await call(terminal, rt, command='pwd; echo "${X-unset}"'))
    assert out["output"] == "/app\n1\n"  # variables persist, the directory starts over
    out = json.loads(await call(terminal, rt, command="exit 4"))
    assert out["exit_code"] == 4
    out = json.loads(await call(terminal, rt, command='echo "${X-unset}"'))
    assert out["output"] == "unset\n"  # `exit` started a fresh session
    out = json.loads(await call(terminal, rt, command="pwd", workdir="sub/dir"))
    assert out["output"] == "/app/sub/dir\n"
    out = json.loads(await call(terminal, rt, command="printf 'é\\n'"))
    assert out["output"] == "é\n"


@pytest.mark.bwrap
async def test_terminal_truncates_head_and_tail(sandbox: Sandbox) -> None:
    rt = ToolRuntime(sandbox=sandbox, max_output_chars=1000)
    out = json.loads(await call(terminal, rt, command="seq 1 20000"))
    full = "".join(f"{i}\n" for i in range(1, 20001))
    text = out["output"]
    match = re.search(r"\n\[\.\.\. (\d+) characters truncated \.\.\.\]\n", text)
    assert match is not None
    head, tail = text[: match.start()], text[match.end() :]
    assert full.startswith(head) and head.startswith("1\n2\n3\n")
    assert full.endswith(tail) and tail.endswith("19999\n20000\n")
    assert len(head) + len(tail) == 1000
    assert int(match.group(1)) == len(full) - 1000
    assert out["exit_code"] == 0


@pytest.mark.bwrap
async def test_terminal_timeout_is_clamped_and_flagged(sandbox: Sandbox) -> None:
    rt = ToolRuntime(sandbox=sandbox, max_timeout_s=1.0)
    out = json.loads(await call(terminal, rt, command="echo started; sleep 30", timeout=600))
    assert out["timed_out"] is True
    assert out["exit_code"] == -9
    # The session shell may add its own note ("Killed  sleep 30") after the output.
    assert out["output"].startswith("started\n")
    assert "timed out after 1 s" in out["error"]
    out = json.loads(await call(terminal, rt, command="echo next"))
    assert out == {"output": "next\n", "exit_code": 0, "timed_out": False}


# --- read_file -------------------------------------------------------------------------------


@pytest.mark.bwrap
async def test_read_file_line_numbers_offset_limit(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("ten.txt", "".join(f"line {i}\n" for i in range(1, 11)).encode())
    out = await call(read_file, rt, path="ten.txt")
    assert out.splitlines()[0] == "     1\tline 1"
    assert out.splitlines()[-1] == "    10\tline 10"
    assert "offset=" not in out
    out = await call(read_file, rt, path="ten.txt", offset=4, limit=3)
    assert out.splitlines() == [
        "     4\tline 4",
        "     5\tline 5",
        "     6\tline 6",
        "[lines 4-6 of 10; use offset=7 to read on]",
    ]
    out = await call(read_file, rt, path="/app/ten.txt", offset=9, limit=5)
    assert out.splitlines() == ["     9\tline 9", "    10\tline 10"]
    with pytest.raises(ToolFailure, match="past the end"):
        await call(read_file, rt, path="ten.txt", offset=11)
    with pytest.raises(ToolFailure, match="at least 1"):
        await call(read_file, rt, path="ten.txt", offset=0)


@pytest.mark.bwrap
async def test_read_file_line_numbers_match_grep(rt: ToolRuntime) -> None:
    # Form feeds, lone carriage returns and U+2028 are not line breaks for grep, sed or editors.
    content = "first\fpage\nsecond\rstill second\nthird \u2028 x\nfourth target\n"
    await rt.sandbox.write_file("odd.txt", content.encode())
    found = await call(search_files, rt, pattern="target", path="odd.txt")
    assert found == "4:fourth target"
    out = await call(read_file, rt, path="odd.txt", offset=4, limit=1)
    assert out == "     4\tfourth target"
    out = await call(read_file, rt, path="odd.txt")
    assert len(out.split("\n")) == 4


@pytest.mark.bwrap
async def test_read_file_long_lines_and_empty(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("long.txt", b"a" * 2500 + b"\nshort")
    out = await call(read_file, rt, path="long.txt")
    first, second = out.split("\n")
    assert first == "     1\t" + "a" * 2000 + " [... 500 more characters]"
    assert second == "     2\tshort"
    await rt.sandbox.write_file("empty.txt", b"")
    assert "empty" in await call(read_file, rt, path="empty.txt")


@pytest.mark.bwrap
async def test_read_file_failures(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("bin.dat", b"\x7fELF\x00\x01\x02" + bytes(range(256)))
    with pytest.raises(ToolFailure, match="binary"):
        await call(read_file, rt, path="bin.dat")
    await rt.sandbox.write_file("latin1.txt", "café".encode("latin-1"))
    with pytest.raises(ToolFailure, match="not UTF-8"):
        await call(read_file, rt, path="latin1.txt")
    with pytest.raises(ToolFailure, match=r"file not found: nope\.txt"):
        await call(read_file, rt, path="nope.txt")
    await rt.sandbox.exec("mkdir -p d")
    with pytest.raises(ToolFailure, match="is a directory"):
        await call(read_file, rt, path="d")


@pytest.mark.bwrap
async def test_read_file_output_is_truncated(sandbox: Sandbox) -> None:
    rt = ToolRuntime(sandbox=sandbox, max_output_chars=500)
    await sandbox.write_file("many.txt", "".join(f"{i}\n" for i in range(400)).encode())
    out = await call(read_file, rt, path="many.txt")
    assert "characters truncated" in out
    assert out.startswith("     1\t0\n")
    assert out.endswith("   400\t399")


# --- write_file ------------------------------------------------------------------------------


@pytest.mark.bwrap
async def test_write_file_creates_parents(rt: ToolRuntime) -> None:
    out = await call(write_file, rt, path="deep/er/new.txt", content="héllo\n")
    assert out == "wrote 7 bytes to /app/deep/er/new.txt"
    assert await rt.sandbox.read_file("/app/deep/er/new.txt") == "héllo\n".encode()
    await call(write_file, rt, path="deep/er/new.txt", content="")
    assert await rt.sandbox.read_file("deep/er/new.txt") == b""
    with pytest.raises(ToolFailure, match="is a directory"):
        await call(write_file, rt, path="deep", content="x")


# --- edit_file -------------------------------------------------------------------------------

SOURCE = "def f():\n    return 1\n\n\ndef g():\n    return 1\n"


@pytest.mark.bwrap
async def test_edit_file_unique_replace_returns_diff(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("m.py", SOURCE.encode())
    diff = await call(
        edit_file,
        rt,
        path="m.py",
        old_string="def g():\n    return 1",
        new_string="def g():\n    return 2",
    )
    lines = diff.splitlines()
    assert lines[0] == "--- a/m.py"
    assert lines[1] == "+++ b/m.py"
    assert lines[2].startswith("@@")
    assert "-    return 1" in lines
    assert "+    return 2" in lines
    assert (
        await rt.sandbox.read_file("m.py")
        == SOURCE.replace("def g():\n    return 1", "def g():\n    return 2").encode()
    )


@pytest.mark.bwrap
async def test_edit_file_non_unique(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("m.py", SOURCE.encode())
    with pytest.raises(ToolFailure, match="occurs 2 times"):
        await call(edit_file, rt, path="m.py", old_string="return 1", new_string="return 3")
    assert await rt.sandbox.read_file("m.py") == SOURCE.encode()  # untouched
    diff = await call(
        edit_file, rt, path="m.py", old_string="return 1", new_string="return 3", replace_all=True
    )
    assert diff.count("+    return 3") == 2
    assert await rt.sandbox.read_file("m.py") == SOURCE.replace("return 1", "return 3").encode()


@pytest.mark.bwrap
async def test_edit_file_failures(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("m.py", SOURCE.encode())
    with pytest.raises(ToolFailure, match="not found"):
        await call(edit_file, rt, path="m.py", old_string="return 42", new_string="x")
    with pytest.raises(ToolFailure, match="must not be empty"):
        await call(edit_file, rt, path="m.py", old_string="", new_string="x")
    with pytest.raises(ToolFailure, match="the same"):
        await call(edit_file, rt, path="m.py", old_string="f", new_string="f")
    with pytest.raises(ToolFailure, match="file not found"):
        await call(edit_file, rt, path="missing.py", old_string="a", new_string="b")
    await rt.sandbox.write_file("bin.dat", b"a\x00b")
    with pytest.raises(ToolFailure, match="binary"):
        await call(edit_file, rt, path="bin.dat", old_string="a", new_string="b")
    assert await rt.sandbox.read_file("m.py") == SOURCE.encode()


@pytest.mark.bwrap
async def test_edit_file_without_trailing_newline_diff_is_readable(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("n.txt", b"one\ntwo = 1")
    diff = await call(edit_file, rt, path="n.txt", old_string="two = 1", new_string="two = 2")
    lines = diff.splitlines()
    assert "-two = 1" in lines
    assert "+two = 2" in lines
    assert await rt.sandbox.read_file("n.txt") == b"one\ntwo = 2"


@pytest.mark.bwrap
async def test_edit_file_diff_splits_lines_on_newline_only(rt: ToolRuntime) -> None:
    await rt.sandbox.write_file("ff.c", b"a\fb\nold\nc\n")
    diff = await call(edit_file, rt, path="ff.c", old_string="old", new_string="new")
    assert diff.split("\n")[2:] == ["@@ -1,3 +1,3 @@", " a\fb", "-old", "+new", " c", ""]
    assert "No newline" not in diff


# --- search_files ----------------------------------------------------------------------------


@pytest.fixture
async def tree(rt: ToolRuntime) -> ToolRuntime:
    files = {
        "src/a.py": "import os\nTODO = 1\n# TODO: fix\n",
        "src/b.py": "print('todo lowercase')\n",
        "src/notes.md": "TODO in markdown\n",
        "src/sub/c.py": "x = 'TODO'\n",
        ".git/config": "TODO inside git\n",
        ".git/objects/x.py": "TODO\n",
        "many.txt": "".join(f"match {i}\n" for i in range(50)),
    }
    for path, content in files.items():
        await rt.sandbox.write_file(path, content.encode())
    await rt.sandbox.write_file("src/blob.bin", b"TODO\x00binary")
    return rt


@pytest.mark.bwrap
async def test_search_content_with_glob(tree: ToolRuntime) -> None:
    out = await call(search_files, tree, pattern="TODO", path="src", glob="*.py")
    assert sorted(out.splitlines()) == [
        "src/a.py:2:TODO = 1",
        "src/a.py:3:# TODO: fix",
        "src/sub/c.py:1:x = 'TODO'",
    ]
    out = await call(search_files, tree, pattern="TODO")
    lines = out.splitlines()
    assert "./src/notes.md:1:TODO in markdown" in lines
    assert not any(".git" in line for line in lines)
    assert not any("blob.bin" in line for line in lines)  # binary files are skipped
    out = await call(search_files, tree, pattern="^(import|print)\\b", path="src")
    assert sorted(out.splitlines()) == [
        "src/a.py:1:import os",
        "src/b.py:1:print('todo lowercase')",
    ]
    assert await call(search_files, tree, pattern="nothing-matches-this") == "no matches"


@pytest.mark.bwrap
async def test_search_content_limit(tree: ToolRuntime) -> None:
    out = await call(search_files, tree, pattern="match", path="many.txt", limit=5)
    lines = out.splitlines()
    assert lines[:5] == [f"{i + 1}:match {i}" for i in range(5)]
    assert lines[5] == "[more than 5 matches; narrow the search or raise limit]"
    assert len(lines) == 6
    out = await call(search_files, tree, pattern="match", path="many.txt", limit=50)
    assert len(out.splitlines()) == 50
    assert "more than" not in out
    with pytest.raises(ToolFailure, match="limit"):
        await call(search_files, tree, pattern="match", limit=0)


@pytest.mark.bwrap
async def test_search_files_mode(tree: ToolRuntime) -> None:
    out = await call(search_files, tree, pattern="*.py", mode="files")
    assert sorted(out.splitlines()) == ["./src/a.py", "./src/b.py", "./src/sub/c.py"]
    out = await call(search_files, tree, pattern="*.md", path="/app/src", mode="files")
    assert out.splitlines() == ["/app/src/notes.md"]
    out = await call(search_files, tree, pattern="*", mode="files", limit=2)
    assert len(out.splitlines()) == 3
    assert "more than 2 matches" in out


@pytest.mark.bwrap
async def test_search_failures(tree: ToolRuntime) -> None:
    with pytest.raises(ToolFailure, match="search failed"):
        await call(search_files, tree, pattern="(unclosed")
    with pytest.raises(ToolFailure, match="search failed"):
        await call(search_files, tree, pattern="x", path="no/such/dir")
    with pytest.raises(ValidationError):
        search_files.validate({"pattern": "x", "mode": "regex"})


@pytest.mark.bwrap
async def test_search_keeps_the_agents_shell_session(tree: ToolRuntime) -> None:
    """A search (matching, not matching, failing) must not end the session shell, which
    holds what the agent exported and set."""
    await call(terminal, tree, command="export AGENT_STATE=kept; LOCAL_VAR=also")
    assert await call(search_files, tree, pattern="TODO", path="src/a.py") != "no matches"
    assert await call(search_files, tree, pattern="nothing-matches-this") == "no matches"
    assert await call(search_files, tree, pattern="*.none", mode="files") == "no matches"
    with pytest.raises(ToolFailure, match="search failed"):
        await call(search_files, tree, pattern="x", path="no/such/dir")
    out = json.loads(await call(terminal, tree, command='echo "$AGENT_STATE $LOCAL_VAR"'))
    assert out["output"] == "kept also\n"
