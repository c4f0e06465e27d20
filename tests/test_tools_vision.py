"""The vision toolset and image content, against a TEST DOUBLE of a vision model.

A hosted multimodal model cannot run here: `ScriptedOpenAIServer` (tests/scripted_openai.py,
a real HTTP server on 127.0.0.1) stands in for it, and its scripted entries decode the
image part they receive and compare it with the bytes of the file in the sandbox. The
sandboxes, the file reads and clotho's HTTP client are real.
"""

from __future__ import annotations

import base64
import shutil
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.scripted_openai import HTTPError, ScriptedOpenAIServer, assistant

from clotho.chat.client import ModelConfig
from clotho.chat.models import build_model
from clotho.chat.types import image_mime, image_part, user_message
from clotho.errors import ConfigError
from clotho.sandbox import LocalSandboxConfig, open_sandbox
from clotho.sandbox.base import Sandbox
from clotho.tools.builtin import ToolsConfig, default_registry
from clotho.tools.runtime import ToolFailure, ToolRuntime
from clotho.tools.tool import Tool
from clotho.tools.vision import VisionConfig

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is missing")

KEY_VAR = "CLOTHO_TEST_VISION_KEY"


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


RED = png(4, 3, (255, 0, 0))


def image_bytes_in(body: dict[str, Any]) -> list[bytes]:
    """The images of a chat request, decoded from their data: URLs."""
    found = []
    for message in body["messages"]:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") == "image_url":
                url = part["image_url"]["url"]
                assert url.startswith("data:image/png;base64,")
                found.append(base64.b64decode(url.split(",", 1)[1]))
    return found


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[Sandbox]:
    sb = await open_sandbox(LocalSandboxConfig(state_dir=str(tmp_path / "state")))
    try:
        yield sb
    finally:
        await sb.close()


def analyze_tool(server: ScriptedOpenAIServer, **extra: Any) -> Tool:
    config = ToolsConfig(
        vision=VisionConfig(
            base_url=server.base_url, model="vision-double", api_key_env=KEY_VAR, **extra
        )
    )
    registry = default_registry(config, environ={KEY_VAR: "vk-1"})
    (tool,) = registry.resolve(["vision"])
    return tool


async def test_analyze_image_sends_the_sandbox_file_to_the_vision_model(
    sandbox: Sandbox,
) -> None:
    """An image the agent made in the sandbox reaches the model byte for byte."""
    made = await sandbox.exec(
        'python3 -c "import struct,zlib,sys\n'
        "def c(k,d): return struct.pack('>I',len(d))+k+d+struct.pack('>I',zlib.crc32(k+d))\n"
        "raw=b''.join(b'\\x00'+b'\\x00\\x00\\xff'*5 for _ in range(2))\n"
        "sys.stdout.buffer.write(b'\\x89PNG\\r\\n\\x1a\\n'+c(b'IHDR',struct.pack('>IIBBBBB',5,2,8,2,0,0,0))"
        "+c(b'IDAT',zlib.compress(raw))+c(b'IEND',b''))\" > /app/blue.png"
    )
    assert made.ok, made.stderr
    on_disk = await sandbox.read_file("/app/blue.png")

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        images = image_bytes_in(body)
        ok = images == [on_disk]
        return assistant("a blue bar" if ok else f"WRONG IMAGE {len(images)}")

    with ScriptedOpenAIServer([answer]) as server:
        tool = analyze_tool(server)
        out = await tool.fn(ToolRuntime(sandbox=sandbox), path="blue.png", question="Colour?")
        assert out == "a blue bar"
        body = server.requests[-1]
        assert body["model"] == "vision-double"
        (message,) = body["messages"]
        assert message["content"][0] == {"type": "text", "text": "Colour?"}
        assert {k.lower(): v for k, v in server.headers[-1].items()}[
            "authorization"
        ] == "Bearer vk-1"


async def test_a_shipped_image_is_read_from_the_task_files(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    """A picture the task ships (uploaded into the sandbox) goes the same way."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "chart.png").write_bytes(RED)
    await sandbox.upload(tmp_path / "task", "/app/task")
    with ScriptedOpenAIServer(
        [lambda body: assistant("red" if image_bytes_in(body) == [RED] else "other")]
    ) as server:
        out = await analyze_tool(server, detail="low").fn(
            ToolRuntime(sandbox=sandbox), path="/app/task/chart.png"
        )
        assert out == "red"
        part = server.requests[-1]["messages"][0]["content"][1]
        assert part["image_url"]["detail"] == "low"


async def test_what_is_not_an_image_never_reaches_the_model(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/notes.txt", b"just text")
    await sandbox.write_file("/app/big.png", RED + b"\x00" * 4096)
    with ScriptedOpenAIServer([]) as server:
        tool = analyze_tool(server, max_image_bytes=2048)
        rt = ToolRuntime(sandbox=sandbox)
        with pytest.raises(ToolFailure, match="is not a PNG, JPEG, GIF or WebP image"):
            await tool.fn(rt, path="notes.txt")
        with pytest.raises(ToolFailure, match="file not found"):
            await tool.fn(rt, path="nothing.png")
        with pytest.raises(ToolFailure, match=r"cannot read big\.png as an image"):
            await tool.fn(rt, path="big.png")
        assert server.requests == []


async def test_a_failing_vision_model_is_a_tool_error(sandbox: Sandbox) -> None:
    await sandbox.write_file("/app/red.png", RED)
    with ScriptedOpenAIServer([HTTPError(500)]) as server:
        tool = analyze_tool(server, max_retries=0)
        with pytest.raises(ToolFailure, match="the vision model failed"):
            await tool.fn(ToolRuntime(sandbox=sandbox), path="red.png")


def test_vision_without_a_model_fails_at_setup() -> None:
    with pytest.raises(ConfigError, match="needs a vision model"):
        default_registry().resolve(["vision"])
    config = ToolsConfig(
        vision=VisionConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="NOPE_KEY")
    )
    with pytest.raises(ConfigError, match="set the environment variable NOPE_KEY"):
        default_registry(config, environ={}).resolve(["vision"])
    # No key named: a local server without one is fine.
    config = ToolsConfig(vision=VisionConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    assert [t.name for t in default_registry(config).resolve(["vision"])] == ["analyze_image"]


def test_image_parts_and_types() -> None:
    assert image_mime(RED) == "image/png"
    assert image_mime(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert image_mime(b"GIF89a...") == "image/gif"
    assert image_mime(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert image_mime(b"<svg/>") is None
    with pytest.raises(ValueError, match="not an image"):
        image_part(b"plain")
    assert user_message("hi") == {"role": "user", "content": "hi"}
    message = user_message("look", [RED])
    assert message["content"][0] == {"type": "text", "text": "look"}
    assert image_bytes_in({"messages": [message]}) == [RED]


async def test_the_chat_client_sends_image_content_to_the_model() -> None:
    """An image a task ships, in the first user message of a rollout: the model's request
    carries it as an image_url part, unchanged."""
    with ScriptedOpenAIServer([assistant("I see red")]) as server:
        model = await build_model(
            ModelConfig(model="m", base_url=server.base_url, api_key_env=None, max_retries=0)
        )
        try:
            turn = await model.session().complete([user_message("What colour?", [RED])], None)
        finally:
            await model.aclose()
        assert turn.content == "I see red"
        assert image_bytes_in(server.requests[-1]) == [RED]


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Chromium is not installed")
async def test_a_browser_screenshot_goes_to_the_vision_model(sandbox: Sandbox) -> None:
    """The agent's own image: a screenshot the browser toolset wrote, sent as it is on disk."""
    from clotho.tools.browser import browser_navigate, browser_screenshot

    await sandbox.write_file("/app/page.html", b"<body style='background:#0f0'><h1>Hi</h1></body>")
    rt = ToolRuntime(sandbox=sandbox)
    await browser_navigate.fn(rt, url="file:///app/page.html")
    await browser_screenshot.fn(rt, path="shot.png")
    shot = await sandbox.read_file("/app/shot.png")
    with ScriptedOpenAIServer(
        [lambda body: assistant("green page" if image_bytes_in(body) == [shot] else "other")]
    ) as server:
        out = await analyze_tool(server).fn(rt, path="shot.png", question="What colour?")
    assert out == "green page"
