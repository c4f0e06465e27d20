"""The browser toolset with a real headless Chromium inside real sandboxes.

Chromium runs inside the sandbox, so it reaches the sandbox's files and network only: the
host's loopback services stay out of its reach. Under CI=true a missing Chromium fails the
run (conftest turns every skip into a failure there).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import shlex
import shutil
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import EXAMPLES
from tests.docker_probe import fail_without_docker_in_ci, requires_docker
from tests.sandbox_fixtures import host_pids, requires_root, wait_dead

from clotho.agent.loop import AgentLimits, AgentLoop
from clotho.chat.client import ModelConfig
from clotho.chat.models import build_model
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.base import Sandbox
from clotho.sandbox.config import DockerSandboxConfig
from clotho.sandbox.local.bwrap import BwrapSandbox
from clotho.tools.browser import (
    BROWSER_TOOLS,
    browser_back,
    browser_click,
    browser_navigate,
    browser_screenshot,
    browser_select,
    browser_snapshot,
    browser_type,
)
from clotho.tools.builtin import default_registry
from clotho.tools.runtime import ToolFailure, ToolRuntime

pytestmark = [
    pytest.mark.skipif(
        shutil.which("chromium") is None,
        reason="Chromium is not installed: apt-get install chromium (scripts/install-system-deps.sh)",
    ),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

TASK = EXAMPLES / "browser-parcel-form"

FORM_PAGE = b"""<html><head><title>Form</title></head><body>
<h1>Sign up</h1>
<form action="done.html" method="get">
  <label for="who">Name</label> <input id="who" name="who">
  <button type="submit">Send</button>
</form>
<a href="other.html">another page</a>
</body></html>"""
DONE_PAGE = (
    b"<html><head><title>Done</title></head><body><p>Thanks for signing up</p></body></html>"
)
OTHER_PAGE = b"<html><head><title>Other</title></head><body><p>The other page</p></body></html>"


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[BwrapSandbox]:
    """A local sandbox without network (the default)."""
    sb = await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path / "state")))
    assert isinstance(sb, BwrapSandbox)
    try:
        yield sb
    finally:
        await sb.close()


def refs(snapshot: str) -> dict[str, int]:
    """{first words of an element's description: its number} from a snapshot."""
    found: dict[str, int] = {}
    for number, described in re.findall(r"\[(\d+)\] ([^\[\n]+)", snapshot):
        found.setdefault(described.strip(), int(number))
    return found


def ref_of(snapshot: str, needle: str) -> int:
    for described, number in refs(snapshot).items():
        if needle in described:
            return number
    raise AssertionError(f"no element with {needle!r} in:\n{snapshot}")


async def test_the_bundled_task_page_is_solved_through_the_browser(sandbox: Sandbox) -> None:
    """The example task's page, driven as an agent would: its script-built list is read,
    the form filled and sent, and the code it shows is the one the task's tests expect."""
    await sandbox.upload(TASK / "environment" / "site", "/app/site")
    rt = ToolRuntime(sandbox=sandbox)
    page = await browser_navigate.fn(rt, url="file:///app/site/index.html")
    assert "Title: Parcel desk" in page
    # The table exists only after the script ran: its rows are in the snapshot.
    rows = dict(re.findall(r"(P-\d{4}) \| Oslo \| ([\d.]+)", page))
    assert rows == {"P-2291": "14.2", "P-4410": "27.9", "P-5802": "9.6", "P-7719": "27.5"}
    heaviest = max(rows, key=lambda k: float(rows[k]))

    page = await browser_type.fn(rt, ref=ref_of(page, 'name="parcel"'), text=heaviest)
    assert f'value="{heaviest}"' in page
    page = await browser_select.fn(rt, ref=ref_of(page, 'name="service"'), option="Express")
    assert 'selected="Express"' in page
    page = await browser_click.fn(rt, ref=ref_of(page, '"Request dispatch"'))
    code = re.search(r"Confirmation code: (PCL-[0-9A-F]{8})", page)
    assert code is not None, page
    expected = re.search(r'EXPECTED = "([^"]+)"', (TASK / "tests" / "check.py").read_text())
    assert expected is not None and code.group(1) == expected.group(1)


async def test_a_wrong_request_is_refused_by_the_page(sandbox: Sandbox) -> None:
    await sandbox.upload(TASK / "environment" / "site", "/app/site")
    rt = ToolRuntime(sandbox=sandbox)
    page = await browser_navigate.fn(rt, url="file:///app/site/index.html")
    page = await browser_type.fn(rt, ref=ref_of(page, 'name="parcel"'), text="P-8046")
    page = await browser_click.fn(rt, ref=ref_of(page, '"Request dispatch"'))
    assert "Request refused" in page and "Confirmation code" not in page


async def test_form_submission_navigates_and_back_returns(sandbox: Sandbox) -> None:
    for name, data in (("form.html", FORM_PAGE), ("done.html", DONE_PAGE)):
        await sandbox.write_file(f"/app/{name}", data)
    await sandbox.write_file("/app/other.html", OTHER_PAGE)
    rt = ToolRuntime(sandbox=sandbox)
    page = await browser_navigate.fn(rt, url="file:///app/form.html")
    page = await browser_type.fn(rt, ref=ref_of(page, 'name="who"'), text="Ada L", submit=True)
    # Enter submitted the form: the browser waited for the next page before reading it.
    assert "URL: file:///app/done.html?who=Ada+L" in page
    assert "Thanks for signing up" in page
    page = await browser_back.fn(rt)
    assert "URL: file:///app/form.html" in page
    page = await browser_click.fn(rt, ref=ref_of(page, '"another page"'))
    assert "The other page" in page
    snapshot = await browser_snapshot.fn(rt)
    assert "Title: Other" in snapshot


async def test_a_stale_or_unknown_element_number_is_told(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/other.html", OTHER_PAGE)
    rt = ToolRuntime(sandbox=sandbox)
    await browser_navigate.fn(rt, url="file:///app/other.html")
    with pytest.raises(ToolFailure, match=r"no element \[7\]"):
        await browser_click.fn(rt, ref=7)
    with pytest.raises(ToolFailure, match="could not open"):
        await browser_navigate.fn(rt, url="file:///app/missing.html")


async def test_screenshot_is_a_png_written_in_the_sandbox(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/other.html", OTHER_PAGE)
    rt = ToolRuntime(sandbox=sandbox)
    await browser_navigate.fn(rt, url="file:///app/other.html")
    said = await browser_screenshot.fn(rt, path="shots/page.png")
    assert "/app/shots/page.png" in said
    data = await sandbox.read_file("/app/shots/page.png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == (1280, 800)


@contextlib.asynccontextmanager
async def host_server(host: str) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A server of the host's on `host` whose page says HOST SECRET: (its port, the requests
    it got). Closed on exit."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(1024))
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\nHOST SECRET")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, host, 0)
    try:
        yield server.sockets[0].getsockname()[1], received
    finally:
        server.close()
        await server.wait_closed()


async def test_the_browser_reaches_the_sandbox_network_only(sandbox: Sandbox) -> None:
    """A server on the host's loopback is out of the browser's reach (it gets no request);
    a server the agent starts inside the sandbox answers it."""
    async with host_server("127.0.0.1") as (port, received):
        rt = ToolRuntime(sandbox=sandbox)
        with pytest.raises(ToolFailure, match="could not open"):
            await browser_navigate.fn(rt, url=f"http://127.0.0.1:{port}/")
        await sandbox.write_file("/app/www/index.html", b"<p>served inside</p>")
        # A threaded server, as `python3 -m http.server` is; it prints its port, then lets go
        # of the pipe, so the command returns once the server listens.
        serve = (
            "import http.server,os,sys\n"
            "s=http.server.ThreadingHTTPServer(('127.0.0.1',0),http.server.SimpleHTTPRequestHandler)\n"
            "print(s.server_address[1],flush=True)\n"
            "os.dup2(os.open(os.devnull,os.O_WRONLY),1)\n"
            "s.serve_forever()"
        )
        started = await sandbox.exec(
            f"cd /app/www && ( python3 -c {shlex.quote(serve)} 2>/dev/null & ) | head -n 1",
            timeout=60,
        )
        inner_port = int(started.stdout.strip())
        page = await browser_navigate.fn(rt, url=f"http://127.0.0.1:{inner_port}/")
        assert "served inside" in page and "HOST SECRET" not in page
    assert received == []


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses, loopback and interfaces."""
    import fcntl
    import socket as sk

    found = {"127.0.0.1"}
    for _, name in sk.if_nameindex():
        with sk.socket(sk.AF_INET, sk.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15])
                )  # SIOCGIFADDR
            except OSError:
                continue
            found.add(sk.inet_ntoa(packed[20:24]))
    return sorted(found)


@requires_root
async def test_a_networked_sandbox_browser_stays_off_the_host(tmp_path: Path) -> None:
    """With the task's network on (slirp4netns, guarded), the browser still reaches none of
    the host's own addresses, nor the host's loopback through slirp's gateway: the server
    listening on all of them gets no request."""
    config = LocalSandboxConfig(state_dir=str(tmp_path / "state"), network=True)
    async with host_server("0.0.0.0") as (port, received), await open_sandbox(config) as sb:
        rt = ToolRuntime(sandbox=sb)
        for address in [*host_addresses(), "10.0.2.2"]:
            # Refused, unreachable, or dropped (then the tool's bound ends the wait).
            with pytest.raises(ToolFailure, match="could not open"):
                await browser_navigate.fn(rt, url=f"http://{address}:{port}/")
        await sb.write_file("/app/other.html", OTHER_PAGE)
        page = await browser_navigate.fn(rt, url="file:///app/other.html")
        assert "The other page" in page  # the browser is still usable
    assert received == []


async def test_the_browser_ends_with_its_sandbox(tmp_path: Path) -> None:
    """Chromium is a process of the sandbox: closing the sandbox ends it."""
    sb = await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path / "state")))
    try:
        await sb.write_file("/app/other.html", OTHER_PAGE)
        await browser_navigate.fn(ToolRuntime(sandbox=sb), url="file:///app/other.html")
        found = await sb.exec("ls -d /tmp/clotho-browser.*")
        profile = found.stdout.split()[0]
        flag = f"--user-data-dir={profile}".encode()
        pids = host_pids(lambda line: flag in line)
        assert pids, "Chromium's processes are visible on the host"
    finally:
        await sb.close()
    assert await wait_dead(pids) == []


async def test_a_browser_the_agent_killed_is_started_again(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/other.html", OTHER_PAGE)
    rt = ToolRuntime(sandbox=sandbox)
    await browser_navigate.fn(rt, url="file:///app/other.html")
    await sandbox.exec("pkill -KILL -f clotho-browser; true")
    page = await browser_navigate.fn(rt, url="file:///app/other.html")
    assert "The other page" in page


@requires_docker
async def test_an_image_without_chromium_is_a_clear_error() -> None:
    """The Docker base image has python3 and no Chromium: the tool says what is missing."""
    fail_without_docker_in_ci()
    sb = await open_sandbox(DockerSandboxConfig(), labels={"clotho.test": "browser"})
    try:
        with pytest.raises(ToolFailure, match="Chromium is not installed in this sandbox"):
            await browser_navigate.fn(ToolRuntime(sandbox=sb), url="about:blank")
    finally:
        await sb.close()


def test_the_browser_toolset_is_registered() -> None:
    registry = default_registry()
    names = [t.name for t in registry.resolve(["browser"])]
    assert names == [t.name for t in BROWSER_TOOLS]
    assert all(not t.parallel for t in BROWSER_TOOLS)  # one page, calls in order
    assert [t.name for t in registry.sample("browser_only", random.Random(0))] == (names)


async def test_an_agent_loop_drives_the_browser(sandbox: Sandbox) -> None:
    """Through the agent loop with a scripted model (a test double for a hosted model): the
    tool results the model receives are the page's text."""
    from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call

    await sandbox.write_file("/app/other.html", OTHER_PAGE)
    script = [
        assistant(tool_calls=[tool_call("browser_navigate", {"url": "file:///app/other.html"})]),
        assistant("done"),
    ]
    with ScriptedOpenAIServer(script) as server:
        model = await build_model(
            ModelConfig(model="m", base_url=server.base_url, api_key_env=None, max_retries=0)
        )
        try:
            tools = default_registry().resolve(["browser"])
            loop = AgentLoop(model.session(), tools, ToolRuntime(sandbox=sandbox), AgentLimits())
            result = await loop.run([{"role": "user", "content": "open the page"}])
        finally:
            await model.aclose()
        assert result.stop_reason == "finished" and not result.tool_errors
        tool_message = server.messages(-1)[-1]
        assert tool_message["role"] == "tool" and "The other page" in tool_message["content"]


def test_clotho_eval_solves_the_bundled_task_with_the_browser(tmp_path: Path) -> None:
    """`clotho eval --agent llm` on the bundled browser task, the model a scripted test double
    that reads what the tools return: the code it writes comes from the page it was shown,
    and the task's own tests score it 1."""
    from tests.scripted_openai import ScriptedOpenAIServer, assistant, tool_call
    from tests.test_eval_cli import clotho, results

    def last_tool_text(body: dict[str, Any]) -> str:
        return str(body["messages"][-1]["content"])

    def fill(body: dict[str, Any]) -> dict[str, Any]:
        page = last_tool_text(body)
        rows = dict(re.findall(r"(P-\d{4}) \| Oslo \| ([\d.]+)", page))
        heaviest = max(rows, key=lambda k: float(rows[k]))
        return assistant(
            "",
            [tool_call("browser_type", {"ref": ref_of(page, 'name="parcel"'), "text": heaviest})],
        )

    def choose(body: dict[str, Any]) -> dict[str, Any]:
        page = last_tool_text(body)
        ref = ref_of(page, 'name="service"')
        return assistant("", [tool_call("browser_select", {"ref": ref, "option": "Express"})])

    def send(body: dict[str, Any]) -> dict[str, Any]:
        page = last_tool_text(body)
        return assistant("", [tool_call("browser_click", {"ref": ref_of(page, "dispatch")})])

    def write(body: dict[str, Any]) -> dict[str, Any]:
        found = re.search(r"Confirmation code: (PCL-[0-9A-F]+)", last_tool_text(body))
        code = found.group(1) if found else "NOT-SHOWN"
        return assistant(
            "", [tool_call("write_file", {"path": "confirmation.txt", "content": code + "\n"})]
        )

    script = [
        assistant("", [tool_call("browser_navigate", {"url": "file:///app/site/index.html"})]),
        fill,
        choose,
        send,
        write,
        assistant("Booked; the code is in /app/confirmation.txt."),
    ]
    tasks = tmp_path / "tasks"
    shutil.copytree(TASK, tasks / TASK.name)
    out = tmp_path / "run"
    with ScriptedOpenAIServer(script) as server:
        proc = clotho(
            "eval", str(tasks), "--agent", "llm", "--model", "m", "--base-url", server.base_url,
            "--set", 'toolsets=["coding","browser"]', "--out", str(out),
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = results(out)
    assert row["stop_reason"] == "finished" and row["tool_calls"] == 5, row
    assert row["passed"] is True and row["reward"] == 1.0, row
    names = {t["function"]["name"] for t in server.requests[0]["tools"]}
    assert {"terminal", "browser_navigate", "browser_click"} <= names
