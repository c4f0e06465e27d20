"""`clotho api` as a user runs it: a separate process, stopped with Ctrl-C."""

from __future__ import annotations

import asyncio
import sys

import httpx
from tests.support import PATIENCE_S
from tests.test_api_token_sources import clotho_api, stop
from tests.test_trainers_support import free_port, make_group

from clotho.trainers.client import ApiClientConfig, AtroposClient
from clotho.trainers.protocol import RegisterEnv


async def test_clotho_api_serves_and_stops_on_ctrl_c() -> None:
    args = ("--batch-size", "4", "--max-token-len", "512")
    async with clotho_api(*args, env={"CLOTHO_API_TOKEN": "given-tok-42"}) as (process, url):
        auth = {"Authorization": "Bearer given-tok-42"}
        async with httpx.AsyncClient(base_url=url, headers=auth) as http:
            info = (await http.get("/info")).json()
            assert info == {"batch_size": 4, "max_token_len": 512}
            # --batch-size presets the shape: an environment registers with no trainer yet.
            config = ApiClientConfig(
                url=url, token="given-tok-42", heartbeat_s=0, register_timeout_s=5
            )
            async with AtroposClient(config) as client:
                reply = await client.register_env(
                    RegisterEnv(max_token_length=512, desired_name="e", weight=1, group_size=4)
                )
                assert reply.env_id == 0
                await client.send_group(make_group(4))
            batch = (await http.get("/batch")).json()["batch"]
            assert [len(g["tokens"]) for g in batch] == [4]
            assert (await http.get("/info", headers={"Authorization": ""})).status_code == 401
        text = await stop(process)
    assert process.returncode == 0, text
    assert f"listening on {url}" in text and "stopped" in text
    assert "given-tok-42" not in text  # a token given is not printed


async def test_no_auth_is_loopback_only_and_warns() -> None:
    async with clotho_api("--no-auth") as (process, url):
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/info")).status_code == 200
        text = await stop(process, check=False)
    assert "warning" in text and "--no-auth" in text
    refused = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "clotho", "api", "--no-auth", "--host", "0.0.0.0",
        "--port", str(free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(refused.communicate(), PATIENCE_S)
    assert refused.returncode == 2 and "without a token" in stderr.decode()
