"""`clotho api` as a user runs it: a separate process, stopped with Ctrl-C."""

from __future__ import annotations

import asyncio
import signal
import sys

import httpx
from tests.test_trainers_support import free_port, make_group

from clotho.trainers.client import ApiClientConfig, AtroposClient
from clotho.trainers.protocol import RegisterEnv


async def test_clotho_api_serves_and_stops_on_ctrl_c() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "clotho",
        "api",
        "--port",
        str(port),
        "--batch-size",
        "4",
        "--max-token-len",
        "512",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            async with asyncio.timeout(15):
                while True:
                    try:
                        info = (await http.get("/info")).json()
                        break
                    except httpx.TransportError:
                        await asyncio.sleep(0.05)
            assert info == {"batch_size": 4, "max_token_len": 512}
            # --batch-size presets the shape: an environment registers with no trainer yet.
            config = ApiClientConfig(url=url, heartbeat_s=0, register_timeout_s=5)
            async with AtroposClient(config) as client:
                reply = await client.register_env(
                    RegisterEnv(max_token_length=512, desired_name="e", weight=1, group_size=4)
                )
                assert reply.env_id == 0
                await client.send_group(make_group(4))
            batch = (await http.get("/batch")).json()["batch"]
            assert [len(g["tokens"]) for g in batch] == [4]
        process.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(process.communicate(), 15)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = stderr.decode()
    assert process.returncode == 0, text
    assert f"listening on http://127.0.0.1:{port}" in text and "stopped" in text
