"""Mistakes are refused before the first rollout: `clotho process` with a tokenizer that does not
exist, a base URL that is not one, an endpoint where nothing listens or that refuses the key,
ends at once with a one-line error and exit 2, not a run of infra errors that exits 0.

And the check itself gives way: Ctrl-C while an endpoint keeps the probe waiting ends the
command then, not when the probe would have given up."""

from __future__ import annotations

import asyncio
import http.server
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import requires_bwrap
from tests.real_tokenizers import QWEN_DIR
from tests.scripted_openai import ScriptedOpenAIServer, assistant
from tests.support import wait_until, wait_until_sync
from tests.test_trainers_support import free_port

from clotho.chat.probe import probe_endpoint

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


class EndlessAnswer:
    """An HTTP server on 127.0.0.1 that begins every answer and never finishes it: a byte of body
    every tenth of a second, so a client's read timeout never fires and a request it holds
    ends only when the client hangs up. `answering` counts the answers begun; `hung_up` is set
    when a client closes one (seen while the server still had more to send)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self.answering = 0
        self.hung_up = threading.Event()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # shut down by stop()
                return
            thread = threading.Thread(target=self._answer, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            self.answering += 1
            while not self._stop.is_set():
                # Waiting for the client to speak (or hang up) paces the body's bytes.
                readable, _, _ = select.select([conn], [], [], 0.1)
                try:
                    if readable and not conn.recv(4096):
                        self.hung_up.set()
                        return
                    conn.sendall(b"1\r\n \r\n")
                except OSError:
                    self.hung_up.set()
                    return

    def stop(self) -> None:
        self._stop.set()
        self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone would not)
        self._sock.close()
        for thread in self._threads:
            thread.join()


@pytest.fixture
def endless() -> Iterator[EndlessAnswer]:
    server = EndlessAnswer()
    try:
        yield server
    finally:
        server.stop()


async def test_a_cancelled_probe_hangs_up_at_once(endless: EndlessAnswer) -> None:
    # The answer never ends and its bytes keep the probe's timeout from firing: only the
    # cancellation can end the probe. A probe run where the cancellation does not reach (a
    # loop of its own in a worker thread) would keep the request open; this one closes it.
    probe = asyncio.create_task(probe_endpoint(endless.url, None))
    assert await wait_until(lambda: endless.answering == 1)
    probe.cancel()
    with pytest.raises(asyncio.CancelledError):
        await probe
    assert await wait_until(endless.hung_up.is_set), "the cancelled probe kept its request open"
    assert endless.answering == 1


def test_ctrl_c_during_the_endpoint_check_ends_the_command(
    tmp_path: Path, endless: EndlessAnswer
) -> None:
    # Through the real command: the check has begun when the server answers its request; the
    # server is still answering (only the fixture stops it) when the command has ended, so the
    # probe did not end on its own (no timeout can fire) and nothing waited for it.
    out = tmp_path / "groups.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "process", "terminal_test", "--out", str(out),
         "--n-groups", "1", "--group-size", "2", "--model", "m",
         "--base-url", endless.url, "--tokenizer", str(QWEN_DIR)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert wait_until_sync(lambda: endless.answering == 1 or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()[0]
        proc.send_signal(signal.SIGINT)
        ended = wait_until_sync(lambda: proc.poll() is not None)
        assert ended, "Ctrl-C waited for the endpoint check"
    finally:
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate()[0]
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert endless.answering == 1  # one check, not retried
