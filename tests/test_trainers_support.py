"""Shared pieces of the trainer tests: a scripted trainer speaking raw HTTP, and groups.

The trainer does what Atropos' reference trainer does (`/register`, then poll `/batch`) with
plain httpx, so it exercises the server exactly as an upstream trainer would.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx

from clotho.chat.tokens import MASKED
from clotho.env.scored import ScoredGroup

BATCH_KEYS = {
    "tokens",
    "masks",
    "scores",
    "advantages",
    "ref_logprobs",
    "messages",
    "generation_params",
    "inference_logprobs",
    "overrides",
    "group_overrides",
    "images",
    "env_id",
    "distill_token_ids",
    "distill_logprobs",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_group(
    size: int, *, marker: int = 0, prompt_len: int = 3, completion_len: int = 4
) -> ScoredGroup:
    """`size` sequences; each starts with `marker` so a test can tell groups apart."""
    tokens, masks, logprobs, messages = [], [], [], []
    for i in range(size):
        prompt = [marker, *range(100, 100 + prompt_len - 1)]
        completion = [200 + i + k for k in range(completion_len)]
        tokens.append(prompt + completion)
        masks.append([MASKED] * prompt_len + completion)
        logprobs.append([1.0] * prompt_len + [-0.5] * completion_len)
        messages.append(
            [{"role": "user", "content": f"task {marker}"}, {"role": "assistant", "content": "x"}]
        )
    return ScoredGroup(
        tokens=tokens,
        masks=masks,
        scores=[float(i % 2) for i in range(size)],
        inference_logprobs=logprobs,
        messages=messages,
        generation_params={"temperature": 0.8},
        overrides=[{"set_advantage_to_zero": False} for _ in range(size)],
    )


def check_batch(batch: list[dict[str, Any]], batch_size: int) -> None:
    """What a trainer relies on: exact size, whole aligned groups, every key present."""
    assert sum(len(g["tokens"]) for g in batch) == batch_size
    for group in batch:
        assert set(group) == BATCH_KEYS
        n = len(group["tokens"])
        assert len(group["masks"]) == n and len(group["scores"]) == n
        for tokens, mask, lps in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(mask) == len(lps)
            for token, m, lp in zip(tokens, mask, lps, strict=True):
                assert m in (MASKED, token)
                assert (lp == 1.0) if m == MASKED else (lp < 0)


class ScriptedTrainer:
    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(base_url=url, timeout=10, headers=headers)

    async def register(self, batch_size: int, *, starting_step: int = 0) -> dict[str, Any]:
        response = await self.http.post(
            "/register",
            json={
                "wandb_group": "",
                "wandb_project": "",
                "batch_size": batch_size,
                "max_token_len": 2048,
                "checkpoint_dir": "/tmp/ckpt",
                "save_checkpoint_interval": 10,
                "starting_step": starting_step,
                "num_steps": 100,
            },
        )
        response.raise_for_status()
        return response.json()

    async def batch(self) -> list[dict[str, Any]] | None:
        response = await self.http.get("/batch")
        response.raise_for_status()
        return response.json()["batch"]

    async def pull(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll `/batch` until one arrives, like the reference trainer (faster)."""
        async with asyncio.timeout(timeout_s):
            while True:
                batch = await self.batch()
                if batch is not None:
                    return batch
                await asyncio.sleep(0.02)

    async def status(self) -> dict[str, Any]:
        return (await self.http.get("/status")).json()

    async def aclose(self) -> None:
        await self.http.aclose()
