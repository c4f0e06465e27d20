"""Mistakes are refused before the first rollout: `clotho process` with a tokenizer that does not
exist, a base URL that is not one, an endpoint where nothing listens or that refuses the key,
ends at once with a one-line error and exit 2, not a run of infra errors that exits 0."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant
from tests.test_trainers_support import free_port

pytestmark = requires_bwrap


def process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`clotho process` with its error message on one line (the console wraps long lines)."""
    out = tmp_path / "groups.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "clotho", "process", "terminal_test", "--out", str(out),
         "--n-groups", "1", "--group-size", "2", "--model", "m", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    proc.stderr = " ".join(proc.stderr.split())
    return proc


@pytest.fixture
def refuses_keys() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that answers every request 401, as a key-checking proxy."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _refuse(self) -> None:
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _refuse

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_tokenizer_that_does_not_exist_is_refused_before_any_rollout(tmp_path: Path) -> None:
    with ScriptedOpenAIServer(default=assistant("done")) as server:
        proc = process(tmp_path, "--base-url", server.base_url, "--tokenizer", "/no/such/tok")
        assert proc.returncode == 2, proc.stderr
        assert "/no/such/tok" in proc.stderr and "does not exist" in proc.stderr
        assert server.requests == []  # no rollout asked the model anything


@pytest.mark.parametrize("url", ["...", "localhost:8000", "ftp://127.0.0.1/v1"])
def test_a_base_url_that_is_not_one_is_refused(tmp_path: Path, url: str) -> None:
    proc = process(tmp_path, "--base-url", url, "--tokenizer", str(QWEN_DIR))
    assert proc.returncode == 2, proc.stderr
    assert "is not an http(s) URL with a host" in proc.stderr or "is not a URL" in proc.stderr


def test_an_endpoint_where_nothing_listens_is_refused(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = process(tmp_path, "--base-url", url, "--tokenizer", str(QWEN_DIR))
    assert proc.returncode == 2, proc.stderr
    assert f"no model server answers at {url}" in proc.stderr


def test_an_endpoint_that_refuses_the_key_is_refused(tmp_path: Path, refuses_keys: str) -> None:
    proc = process(tmp_path, "--base-url", refuses_keys, "--tokenizer", str(QWEN_DIR))
    assert proc.returncode == 2, proc.stderr
    assert "refused the request (HTTP 401)" in proc.stderr
