"""Where `clotho api` reads its token: a file, an environment variable, or a file it makes.

The token never appears in what the server prints, nor (given by file or variable) on its
command line where `ps` shows it. `clotho api` runs as a user runs it: a real process on
127.0.0.1, stopped with Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from tests.support import http_up
from tests.test_trainers_support import free_port

from clotho.cli.token_source import (
    MAX_TOKEN_FILE_BYTES,
    VISIBLE_ON_COMMAND_LINE,
    made_token_file,
    read_token_file,
    resolve_token,
)
from clotho.errors import ConfigError

pytest.importorskip("uvicorn", reason="uvicorn is not installed (api extra)")

TOKEN = "file-tok-5f0e9c2a7b41"


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "api.token"
    path.write_text(text)
    path.chmod(mode)
    return path


# -- resolving, without a server --------------------------------------------------------------


def test_a_file_is_read_and_named_never_shown(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    source = resolve_token(
        token=None, token_file=path, token_env=None, default_env="UNUSED", environ={}
    )
    assert source is not None and source.token == TOKEN
    assert source.origin == f"the file {path}" and TOKEN not in source.origin
    assert source.warnings == ()


def test_a_file_others_can_read_is_used_with_a_warning(tmp_path: Path) -> None:
    path = token_file(tmp_path, mode=0o644)
    source = read_token_file(path)
    assert source.token == TOKEN
    assert source.warnings == (f"{path} can be read by other users: chmod 600 {path}",)


def test_a_named_variable_or_the_default_one() -> None:
    environ = {"MY_TOKEN": " env-tok-1 ", "CLOTHO_API_TOKEN": "default-tok-2"}
    named = resolve_token(
        token=None, token_file=None, token_env="MY_TOKEN", default_env="CLOTHO_API_TOKEN",
        environ=environ,
    )  # fmt: skip
    assert named is not None and named.token == "env-tok-1"
    assert named.origin == "the environment variable MY_TOKEN"
    default = resolve_token(
        token=None, token_file=None, token_env=None, default_env="CLOTHO_API_TOKEN",
        environ=environ,
    )  # fmt: skip
    assert default is not None and default.token == "default-tok-2"
    assert default.origin == "the environment variable CLOTHO_API_TOKEN"
    nothing = resolve_token(
        token=None, token_file=None, token_env=None, default_env="CLOTHO_API_TOKEN", environ={}
    )
    assert nothing is None


def test_a_token_on_the_command_line_still_works_but_is_warned_about() -> None:
    source = resolve_token(
        token="flag-tok-3", token_file=None, token_env=None, default_env="X", environ={}
    )
    assert source is not None and source.token == "flag-tok-3"
    assert source.warnings == (VISIBLE_ON_COMMAND_LINE,)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ({"token_env": "NOT_SET_ANYWHERE"}, "--token-env NOT_SET_ANYWHERE: .* not set"),
        ({"token": "a", "token_env": "X"}, "one way, not --token-env and --token"),
        ({"file_text": ""}, "the token is empty"),
        ({"file_text": "two words\n"}, "one word of printable ASCII"),
        ({"file_text": "tok\nen\n"}, "one word of printable ASCII"),
        ({"file_text": "x" * (MAX_TOKEN_FILE_BYTES + 1)}, "not a token file"),
        ({"file_text": "tökén"}, "not ASCII"),
        ({"missing_file": True}, "cannot read it"),
    ],
)
def test_mistakes_are_config_errors_naming_the_flag(
    tmp_path: Path, setup: dict[str, object], message: str
) -> None:
    path: Path | None = None
    if "file_text" in setup:
        path = token_file(tmp_path, str(setup["file_text"]))
    elif setup.get("missing_file"):
        path = tmp_path / "absent"
    with pytest.raises(ConfigError, match=message) as info:
        resolve_token(
            token=setup.get("token"),  # type: ignore[arg-type]
            token_file=path,
            token_env=setup.get("token_env"),  # type: ignore[arg-type]
            default_env="X",
            environ={"X": "unused"},
        )
    assert "two words" not in str(info.value), "a malformed token is not echoed either"


def test_a_made_token_file_is_private_and_removed_after() -> None:
    with made_token_file("made-tok-4", "clotho-test-") as path:
        assert path.read_text() == "made-tok-4\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert not path.exists() and not path.parent.exists()


# -- clotho api, as a user runs it ------------------------------------------------------------


@asynccontextmanager
async def clotho_api(
    *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k != "CLOTHO_API_TOKEN"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clotho", "api", "--port", str(port), *args,
        env={**base, "COLUMNS": "300", **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await http_up(f"{url}/")
        yield process, url
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def stop(process: asyncio.subprocess.Process, *, check: bool = True) -> str:
    """Ctrl-C, then what it printed (stdout and stderr); with `check`, it must exit 0."""
    process.send_signal(signal.SIGINT)
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    if check:
        assert process.returncode == 0, stderr.decode()
    return stdout.decode() + stderr.decode()


def command_line(process: asyncio.subprocess.Process) -> str:
    """What `ps` shows of the process."""
    return Path(f"/proc/{process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


async def status(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        return (await http.get("/info")).status_code


async def test_clotho_api_reads_its_token_from_a_file(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    async with clotho_api("--token-file", str(path)) as (process, url):
        assert TOKEN not in command_line(process)
        assert await status(url, None) == 401
        assert await status(url, "wrong") == 401
        assert await status(url, TOKEN) == 200
        text = await stop(process)
    assert f"token: read from the file {path}" in text
    assert TOKEN not in text


async def test_clotho_api_reads_its_token_from_a_named_variable() -> None:
    async with clotho_api("--token-env", "MY_API_TOKEN", env={"MY_API_TOKEN": TOKEN}) as (
        process,
        url,
    ):
        assert TOKEN not in command_line(process)
        assert await status(url, TOKEN) == 200
        text = await stop(process)
    assert "token: read from the environment variable MY_API_TOKEN" in text
    assert TOKEN not in text


async def test_without_a_token_clotho_api_makes_one_in_a_private_file() -> None:
    async with clotho_api() as (process, url):
        assert await status(url, None) == 401
        # The server names the file once it listens; read the line it printed so far.
        assert process.stderr is not None
        printed = b""
        async with asyncio.timeout(30):
            while b"made a token" not in printed or b"trainers" not in printed:
                printed += await process.stderr.readline()
        found = re.search(r"made a token, in (\S+)", printed.decode())
        assert found, printed
        path = Path(found.group(1))
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        made = path.read_text().strip()
        assert await status(url, made) == 200
        assert f"CLOTHO_API_TOKEN=$(cat {path})" in printed.decode()
        assert url.replace("://", f"://clotho:$(cat {path})@") in printed.decode()
        text = printed.decode() + await stop(process)
    assert made not in text, "the made token is never printed"
    assert not path.exists(), "the made token is removed with the server"


async def test_a_token_flag_is_warned_about_and_not_printed() -> None:
    async with clotho_api("--token", TOKEN) as (process, url):
        assert await status(url, TOKEN) == 200
        text = await stop(process)
    assert f"warning: {VISIBLE_ON_COMMAND_LINE}" in text
    assert TOKEN not in text


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--token-env", "NOT_SET_ANYWHERE"], {}, "NOT_SET_ANYWHERE: that environment variable"),
        (["--token-file", "/nonexistent/token"], {}, "cannot read it"),
        (["--no-auth", "--token-env", "T"], {"T": TOKEN}, "--no-auth serves without a token"),
        (["--token", "a", "--token-env", "T"], {"T": TOKEN}, "one way"),
    ],
)
async def test_token_mistakes_stop_clotho_api_with_one_line(
    args: list[str], env: dict[str, str], message: str
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clotho", "api", "--port", str(free_port()), *args,
        env={**os.environ, "COLUMNS": "300", **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 30)
    text = stderr.decode()
    assert process.returncode == 2, text
    assert message in text and "Traceback" not in text
    assert TOKEN not in text
