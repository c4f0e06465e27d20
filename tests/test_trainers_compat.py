"""Our client and scripted trainer against upstream `run-api` (atroposlib), if installed, and
upstream's own API tests and HTTP clients against `clotho api`.

The upstream package pulls in a heavy dependency tree, so it lives in its own virtual
environment, never the project's: `make test` builds it once (`scripts/atropos-venv.sh`,
in ~/.cache/clotho/atropos-venv, or CLOTHO_ATROPOS_VENV); without it these tests skip.

Upstream clients send no credentials of their own; they authenticate to `clotho api` with
the token in the URL they are given (`http://clotho:<token>@host:port`), which `requests`
(upstream's trainer and tests) and `aiohttp` (its environments, sft and dpo tools) send as
HTTP Basic.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.support import PATIENCE_S, http_up
from tests.test_trainers_support import ScriptedTrainer, check_batch, free_port, make_group

from clotho.trainers.client import ApiClientConfig, AtroposClient
from clotho.trainers.protocol import RegisterEnv
from clotho.trainers.server import ApiServer
from clotho.trainers.state import ApiSettings

VENV = Path(
    os.environ.get("CLOTHO_ATROPOS_VENV", Path.home() / ".cache" / "clotho" / "atropos-venv")
)
RUN_API = VENV / "bin" / "run-api"

pytestmark = pytest.mark.skipif(
    not RUN_API.exists(),
    reason=f"upstream atroposlib not installed at {VENV} (bash scripts/atropos-venv.sh {VENV})",
)


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        str(RUN_API),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await http_up(f"{url}/info")
        yield url
    finally:
        process.terminate()
        await process.wait()


async def test_client_against_upstream_run_api(upstream: str) -> None:
    trainer = ScriptedTrainer(upstream)
    config = ApiClientConfig(url=upstream, heartbeat_s=0, register_poll_s=0.05, gzip_min_bytes=4096)
    client = AtroposClient(config)
    try:
        registering = asyncio.create_task(
            client.register_env(
                RegisterEnv(max_token_length=2048, desired_name="compat", weight=1, group_size=4)
            )
        )
        # Upstream holds registration back until a trainer has started: it cannot complete.
        done, _ = await asyncio.wait({registering}, timeout=0.2)
        assert not done  # upstream: "wait for trainer to start"
        await trainer.register(8)
        assert await trainer.batch() is None
        reply = await asyncio.wait_for(registering, PATIENCE_S)
        assert (reply.env_id, reply.wandb_name) == (0, "compat_0")
        assert client.trainer_info is not None and client.trainer_info.batch_size == 8

        single = await client.send_group(make_group(4, marker=1))
        assert single.status == "received"
        listed = await client.send_groups(
            [make_group(4, marker=2, completion_len=400), make_group(4, marker=3)]
        )  # about 25 KB: gzipped on the way in
        assert listed.groups_processed == 2
        status = await client.status_env()  # GET with a JSON body
        assert status.self_queue_size == 3 and status.env_weight == 1.0

        batch = await trainer.pull()
        check_batch(batch, 8)
        assert [g["env_id"] for g in batch] == [0, 0]
        await client.wait_for_room()  # one group left: below 3 batches, returns at once
    finally:
        await client.aclose()  # disconnect-env
        await trainer.aclose()


UPSTREAM_API_TESTS = (
    "api_test_utils.py",
    "test_api_legacy.py",
    "test_api_compression.py",
    "test_api_messages_handling.py",
)


TOKEN = "compat-token"


def _rewrite_for_clotho(text: str, port: int, token: str | None = TOKEN) -> str:
    """Swap upstream's launch command for `clotho api`, its fixed port 8000 for ours, and its
    URLs for ones that carry the token (the server reads it from CLOTHO_API_TOKEN). Without a
    token (None) the server is `clotho api --no-auth` and the URLs are upstream's own, plain."""
    base = f"http://clotho:{token}@localhost:{port}" if token else f"http://localhost:{port}"
    command = '"clotho", "api",' if token else '"clotho", "api", "--no-auth",'
    text = (
        text.replace("from atroposlib.tests.api_test_utils import", "from api_test_utils import")
        .replace("sys.executable,", f"{sys.executable!r},")
        .replace('"atroposlib.cli.run_api",', command)
        .replace("http://localhost:8000", base)
        .replace('"8000"', f'"{port}"')
    )
    assert "atroposlib.cli.run_api" not in text and "8000" not in text  # else: testing upstream
    return text


@pytest.mark.parametrize("token", [TOKEN, None], ids=["token", "no-auth"])
async def test_upstream_api_test_suite_passes_against_clotho_api(
    tmp_path: Path, token: str | None
) -> None:
    """Upstream's own black-box API tests (messages, compression, legacy), run on our server:
    with a token in their URLs, and as they are written (no credentials at all, `GET
    /reset_data` between tests) against `clotho api --no-auth`."""
    python = VENV / "bin" / "python"
    found = sorted(VENV.glob("lib/python*/site-packages/atroposlib/tests"))
    probe = await asyncio.create_subprocess_exec(str(python), "-c", "import pytest, requests")
    if not found or await probe.wait() != 0:
        pytest.skip(f"upstream tests or pytest missing in {VENV} ({VENV}/bin/pip install pytest)")
    port = free_port()
    for name in UPSTREAM_API_TESTS:
        text = (found[0] / name).read_text()
        (tmp_path / name).write_text(_rewrite_for_clotho(text, port, token))
    for name in UPSTREAM_API_TESTS:
        text = (tmp_path / name).read_text()
        if token:
            assert "http://localhost" not in text.replace(f"http://clotho:{token}@localhost", "")
        else:
            assert "http://clotho:" not in text
    if not token:  # the server upstream's helper starts is the open one
        assert '"clotho", "api", "--no-auth"' in (tmp_path / "api_test_utils.py").read_text()
    env = {k: v for k, v in os.environ.items() if k != "CLOTHO_API_TOKEN"}
    if token:
        env["CLOTHO_API_TOKEN"] = token
    run = await asyncio.create_subprocess_exec(
        str(python),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        str(tmp_path),
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(run.communicate(), 120)
    text = output.decode()
    assert run.returncode == 0, text[-3000:]
    passed = re.search(r"(\d+) passed", text)
    assert passed and int(passed.group(1)) >= 30, text[-3000:]


AIOHTTP_PROBE = """
import asyncio, sys, aiohttp

async def main(url):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/info") as response:
            print(response.status)
        async with session.get(f"{url}/reset_data") as response:  # as atropos-sft-gen does
            print(response.status)

asyncio.run(main(sys.argv[1]))
"""


async def test_aiohttp_clients_authenticate_with_the_token_in_the_url() -> None:
    """How an upstream environment (`BaseEnv`, aiohttp) reaches a `clotho api` with a token."""
    python = VENV / "bin" / "python"
    async with ApiServer(ApiSettings(token=TOKEN), port=0) as server:
        statuses = []
        for url in (server.url.replace("://", f"://clotho:{TOKEN}@"), server.url):
            probe = await asyncio.create_subprocess_exec(
                str(python), "-c", AIOHTTP_PROBE, url, stdout=asyncio.subprocess.PIPE
            )
            output, _ = await asyncio.wait_for(probe.communicate(), 60)
            assert probe.returncode == 0
            statuses.append(output.decode().split())
    assert statuses == [["200", "200"], ["401", "401"]]
