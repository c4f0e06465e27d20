"""Who `clotho view` answers, on a real server (`clotho view` as a user starts it, on
127.0.0.1): a Host it does not answer to is refused (DNS rebinding), so are other pages'
cross-site requests, and with a token every request without it; off loopback it does not
start without a token. The token is never printed. Then: every field a run's files hold is
data, numbers included (the API hands the page numbers or nothing; the export's text escapes
them).
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from tests.support import port_open, wait_until_sync

from clotho.view.export import render
from clotho.view.guard import HostCheck
from clotho.view.sample import write_groups, write_run
from clotho.view.sources import COLUMNS, discover

TOKEN = "view-token-5f0c2b9e"
HOSTILE = '<img src=x onerror="window.__pwned=1">'


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@contextmanager
def viewer(
    paths: list[Path], *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, str]]:
    """`clotho view PATHS ARGS` running: (its URL, what it printed so far)."""
    environ = {k: v for k, v in os.environ.items() if k != "CLOTHO_VIEW_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "clotho", "view", *map(str, paths), *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**environ, **(env or {})},
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        match = re.search(r"http://\S+:(\d+)/", first)
        assert match, f"no address printed: {first!r}"
        port = int(match.group(1))
        assert wait_until_sync(lambda: port_open(port)), "clotho view never listened"
        printed = first
        if "--token-file" in args or env:
            printed += proc.stderr.readline()
        yield f"http://127.0.0.1:{port}", printed
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("guard") / "runs"
    write_run(root / "secret-run", 4)
    return root


@pytest.fixture(scope="module")
def served(runs: Path) -> Iterator[str]:
    with viewer([runs]) as (url, _):
        yield url


def test_the_host_header_must_name_the_viewer(served: str) -> None:
    port = served.rsplit(":", 1)[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
        answer = httpx.get(served + "/api/runs", headers={"Host": host})
        assert answer.status_code == 200, host
        assert answer.json()[0]["name"] == "secret-run"
    # A page that rebinds its own name to 127.0.0.1 still sends that name.
    for host in (f"attacker.example:{port}", "127.0.0.1.attacker.example", "localhost.evil"):
        for path in ("/", "/api/runs", "/api/run/0/trial/0", "/static/app.js"):
            answer = httpx.get(served + path, headers={"Host": host})
            assert answer.status_code == 421, (host, path)
            assert "secret-run" not in answer.text and "task-0000" not in answer.text
    # HTTP/1.0 without any Host header
    with socket.create_connection(("127.0.0.1", int(port))) as raw:
        raw.sendall(b"GET /api/runs HTTP/1.0\r\n\r\n")
        reply = b""
        while chunk := raw.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 421") and b"secret-run" not in reply


def test_other_pages_cross_site_requests_are_refused_but_links_work(served: str) -> None:
    port = served.rsplit(":", 1)[1]
    cross = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    assert httpx.get(served + "/api/runs", headers=cross).status_code == 403
    same_site = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors"}
    assert httpx.get(served + "/api/runs", headers=same_site).status_code == 403
    foreign = {"Origin": "http://attacker.example"}
    assert httpx.get(served + "/api/runs", headers=foreign).status_code == 403
    own = {"Origin": f"http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"}
    assert httpx.get(served + "/api/runs", headers=own).status_code == 200
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    page = httpx.get(served + "/", headers=link)
    assert page.status_code == 200
    # The page runs only its own script; markup that got past escaping would not run.
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"


def test_with_a_token_every_request_carries_it(runs: Path, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with viewer([runs], "--token-file", str(token_file)) as (url, printed):
        assert TOKEN not in printed and f"read from the file {token_file}" in printed
        for path in ("/", "/api/runs", "/static/app.js"):
            refused = httpx.get(url + path)
            assert refused.status_code == 401 and "secret-run" not in refused.text
            assert refused.headers["www-authenticate"].startswith('Basic realm="clotho view"')
        for wrong in (basic("u", "nope"), "Bearer nope", basic("", ""), "Basic !!!"):
            assert httpx.get(url + "/api/runs", headers={"Authorization": wrong}).status_code == 401
        # what a browser sends once it asked: any user name, the token as password
        for right in (basic("anyone", TOKEN), f"Bearer {TOKEN}"):
            answer = httpx.get(url + "/api/runs", headers={"Authorization": right})
            assert answer.status_code == 200 and answer.json()[0]["name"] == "secret-run"
        # the token does not replace the Host check
        rebound = {"Authorization": f"Bearer {TOKEN}", "Host": "attacker.example"}
        assert httpx.get(url + "/api/runs", headers=rebound).status_code == 421


def test_off_loopback_the_viewer_needs_a_token(runs: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "CLOTHO_VIEW_TOKEN"}
    refused = subprocess.run(
        [sys.executable, "-m", "clotho", "view", str(runs), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )
    assert refused.returncode == 2, refused.stderr
    assert "without a token" in refused.stderr and "--token-file" in refused.stderr
    with viewer([runs], "--host", "0.0.0.0", env={"CLOTHO_VIEW_TOKEN": TOKEN}) as (url, printed):
        assert TOKEN not in printed and "CLOTHO_VIEW_TOKEN" in printed
        assert httpx.get(url + "/api/runs").status_code == 401
        answer = httpx.get(url + "/api/runs", headers={"Authorization": basic("me", TOKEN)})
        assert answer.status_code == 200
        # bound to every address: any address of the machine names it, no other name does
        bad = {"Authorization": basic("me", TOKEN), "Host": "attacker.example"}
        assert httpx.get(url + "/api/runs", headers=bad).status_code == 421


def test_host_check_rules() -> None:
    one = HostCheck("10.1.2.3", "10.1.2.3", ["runs.lab.example"])
    assert one.allows("10.1.2.3:8000") and one.allows("localhost:1") and one.allows("[::1]")
    assert one.allows("runs.lab.example:8000") and one.allows("RUNS.lab.example.")
    assert not one.allows("10.1.2.4:8000") and not one.allows("lab.example")
    assert not one.allows("") and not one.allows("10.1.2.3.attacker.example")
    named = HostCheck("box.lan", "192.168.0.7")
    assert named.allows("box.lan:80") and named.allows("192.168.0.7") and not named.allows("box")
    every = HostCheck("0.0.0.0", "0.0.0.0")
    assert every.allows("192.168.0.9:80") and every.allows(socket.gethostname())
    assert not every.allows("attacker.example")
    loop = HostCheck.loopback()
    assert loop.allows("127.0.0.2:9") and not loop.allows("10.0.0.1")


# --- every field is data ------------------------------------------------------------------


def hostile_run(root: Path) -> Path:
    """A run whose files hold markup in every number field (and some text fields)."""
    run = write_run(root / "hostile", 2)
    lines = (run / "results.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    for key in ("attempt", "reward", "turns", "tool_calls", "tool_errors", "duration_s"):
        first[key] = HOSTILE
    first["finished_at"] = HOSTILE
    lines[0] = json.dumps(first)
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    detail_file = run / json.loads(lines[1])["detail"]  # the second trial's detail file
    detail = json.loads(detail_file.read_text())
    detail["verifier"]["exit_code"] = HOSTILE
    detail["agent_result"]["usage"]["total_tokens"] = HOSTILE
    detail["agent_result"]["tool_errors"] = [
        {"turn": HOSTILE, "tool": "t", "arguments": "{}", "error": "e"}
    ]
    detail["agent_result"]["sequences"][0]["tokens"][0] = HOSTILE
    detail_file.write_text(json.dumps(detail))
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(complete=False, n_planned=HOSTILE, n_finished=HOSTILE, duration_s=HOSTILE)
    (run / "metrics.json").write_text(json.dumps(metrics))
    os.utime(run / "results.jsonl", (1, 1))  # older: the metrics file is read, as it is
    config = json.loads((run / "config.json").read_text())
    config["concurrency"] = HOSTILE
    (run / "config.json").write_text(json.dumps(config))
    groups = write_groups(root / "hostile.jsonl", 2)
    lines = groups.read_text().splitlines()
    bad = json.loads(lines[0])
    bad["scores"] = [HOSTILE, 1.0]
    odd = json.loads(lines[1])
    odd["tokens"] = [HOSTILE, 7]
    groups.write_text(json.dumps(bad) + "\n" + json.dumps(odd) + "\n")
    return root


def test_number_fields_reach_the_page_as_numbers_or_not_at_all(tmp_path: Path) -> None:
    root = hostile_run(tmp_path / "runs")
    with viewer([root]) as (url, _):
        runs = httpx.get(url + "/api/runs").json()
        run = next(r for r in runs if r["name"] == "hostile")
        groups = next(r for r in runs if r["name"] == "hostile.jsonl")
        assert run["status"] == "stopped"
        assert (run["n_planned"], run["n_finished"]) == (None, None)
        assert isinstance(run["wall_s"], int | float | None) and run["wall_s"] != HOSTILE
        rows = httpx.get(f"{url}/api/run/{run['id']}/trials").json()["rows"]
        first = dict(zip(COLUMNS, rows[0], strict=True))
        for key in ("attempt", "reward", "turns", "tool_calls", "tool_errors", "duration_s"):
            assert first[key] is None, key
        assert all(isinstance(x, int) for x in rows[1][COLUMNS.index("turns") :][:3])
        # a group with a non-number score is no group; one with odd tokens still reads
        assert groups["n_groups"] == 1
        rows = httpx.get(f"{url}/api/groups/{groups['id']}").json()["rows"]
        assert rows[0]["tokens"][0] == 0


def test_the_exports_text_escapes_every_field(tmp_path: Path) -> None:
    root = hostile_run(tmp_path / "runs")
    html = render(discover([root]))
    noscript = re.search(r"<noscript>(.*)</noscript>", html, re.S)
    assert noscript is not None and "(stopped)" in noscript.group(1)
    assert "<img" not in noscript.group(1) and "onerror" not in noscript.group(1)
    assert not re.search(r"<img\b", html)  # the data is JSON with "<" written \u003c


def test_a_line_of_any_shape_makes_a_row_or_none() -> None:
    """Shapes a hand-edited or hostile results.jsonl may hold: never an exception (which
    would fail every page of the run), numbers only where numbers belong."""
    from clotho.view.sources import _row

    def row(line: dict[str, object]) -> dict[str, object]:
        values = _row(3, line)
        assert values is not None
        return dict(zip(COLUMNS, values, strict=True))

    odd = {"task": "t", "category": "c", "error": {"kind": ["x"], "message": {"a": 1}}}
    got = row(odd | {"turns": float("nan"), "passed": "yes"})
    assert (got["error"], got["message"], got["turns"], got["passed"]) == (None, None, None, False)
    assert _row(0, {"task": 1, "category": "c"}) is None
    got = row({"task": "t", "category": "c", "turns": True})
    assert got["turns"] is None and got["attempt"] == 0 and got["i"] == 3
