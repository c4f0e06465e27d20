"""`create_concurrency`: a cluster backend creates at most that many sandboxes at once.

Against the project's test doubles (Modal and Nomad cannot run here): each double holds a
creation open until the test lets it finish, and counts how many are open at once. A burst
of rollouts waits its turn to create; a sandbox once made is not held back by the cap.
No timing: creations finish only when the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from tests.support import wait_until
from tests.test_modal_backend import FakeModalClient, FakeModalHandle, modal_config
from tests.test_nomad_backend import FakeNomad, nomad, nomad_config  # noqa: F401

from clotho.cli.main import app
from clotho.sandbox.remote.modal_backend import ModalBackend
from clotho.sandbox.remote.nomad_backend import NomadBackend
from clotho.sandbox.remote_config import ModalSandboxConfig, NomadSandboxConfig


class GatedModalClient(FakeModalClient):
    """The Modal double, each creation held until `finish` lets one through; counts the
    creations under way and the most there ever were."""

    def __init__(self) -> None:
        super().__init__()
        self.creating = 0
        self.peak = 0
        self._turns: asyncio.Queue[None] = asyncio.Queue()

    def finish(self, n: int = 1) -> None:
        for _ in range(n):
            self._turns.put_nowait(None)

    async def create(
        self, config: ModalSandboxConfig, *, name: str, tags: dict[str, str], image: Any
    ) -> FakeModalHandle:
        self.creating += 1
        self.peak = max(self.peak, self.creating)
        try:
            await self._turns.get()
            return await super().create(config, name=name, tags=tags, image=image)
        finally:
            self.creating -= 1


@contextlib.asynccontextmanager
async def opening(backend: Any, configs: list[Any]) -> AsyncIterator[list[asyncio.Future[Any]]]:
    """`backend.open` of each of `configs` at once, as tasks the test watches; afterwards
    the ones still waiting are cancelled and the backend is closed."""
    opens = [asyncio.ensure_future(backend.open(c, {"clotho.run": "cap"})) for c in configs]
    try:
        yield opens
    finally:
        for task in opens:
            task.cancel()
        await asyncio.gather(*opens, return_exceptions=True)
        await backend.aclose()


async def test_modal_creates_at_most_create_concurrency_sandboxes_at_once(
    tmp_path: Path,
) -> None:
    client = GatedModalClient()
    backend = ModalBackend(client)
    config = modal_config(tmp_path, slots_per_sandbox=1, max_sandboxes=8, create_concurrency=2)
    async with opening(backend, [config] * 6) as opens:
        assert await wait_until(lambda: client.creating == 2)
        # Four more rollouts want a sandbox; two creations hold the cap, so none of them
        # has started creating: let creations finish one at a time and watch the count.
        for done in range(1, 7):
            client.finish()
            assert await wait_until(lambda d=done: len(client.created) == d)
            assert client.creating <= 2, client.creating
        boxes = await asyncio.gather(*opens)
        assert client.peak == 2 and len(client.created) == 6
        # The cap is on creating only: the six sandboxes serve at once.
        results = await asyncio.gather(*(b.exec("echo up") for b in boxes))
        assert [r.stdout for r in results] == ["up\n"] * 6
        for box in boxes:
            await box.close()


async def test_modal_cap_is_run_wide_across_configurations(tmp_path: Path) -> None:
    """Two tasks' configurations (two slot pools) share the backend's one cap."""
    client = GatedModalClient()
    backend = ModalBackend(client)
    first = modal_config(tmp_path, slots_per_sandbox=1, create_concurrency=1)
    second = first.model_copy(update={"image": "other:1"})
    async with opening(backend, [first, second]) as opens:
        assert await wait_until(lambda: client.creating == 1)
        client.finish()
        assert await wait_until(lambda: len(client.created) == 1)
        client.finish()
        boxes = await asyncio.gather(*opens)
        assert client.peak == 1 and len(client.created) == 2
        for box in boxes:
            await box.close()


class PendingNomad(FakeNomad):
    """The Nomad double whose new allocations stay `pending` until `start` runs one: a
    creation is under way from its scale-up until its allocation runs and is claimed."""

    def __init__(self) -> None:
        super().__init__()
        self.started: set[str] = set()
        self.peak_pending = 0

    def pending(self) -> list[str]:
        return [
            a["ID"]
            for a in self.allocs.values()
            if a["DesiredStatus"] == "run" and a["ID"] not in self.started
        ]

    def start(self) -> None:
        self.started.add(sorted(self.pending(), key=lambda i: self.allocs[i]["Index"])[0])

    async def scale(self, request: Request) -> JSONResponse:
        answer = await super().scale(request)
        self.peak_pending = max(self.peak_pending, len(self.pending()))
        return answer

    async def list_allocs(self, request: Request) -> JSONResponse:
        return JSONResponse(
            [
                {
                    "ID": a["ID"],
                    "Name": a["Name"],
                    "ClientStatus": a["ClientStatus"] if a["ID"] in self.started else "pending",
                    "DesiredStatus": a["DesiredStatus"],
                }
                for a in self.allocs.values()
            ]
        )


async def test_nomad_scales_up_at_most_create_concurrency_allocations_at_once(
    tmp_path: Path,
) -> None:
    fake = PendingNomad()
    from tests.test_nomad_backend import _serve

    server, task = await _serve(fake.app, fake.port)
    config = nomad_config(fake, tmp_path, slots_per_allocation=1, create_concurrency=2)
    backend = NomadBackend(config)
    try:
        async with opening(backend, [config] * 4) as opens:
            assert await wait_until(lambda: len(fake.pending()) == 2)
            for started in range(1, 5):
                fake.start()
                # Each allocation that runs ends one creation and lets the next scale up.
                assert await wait_until(
                    lambda s=started: sum(t.done() for t in opens) == s, timeout=60
                )
                assert len(fake.pending()) <= 2
            boxes = [t.result() for t in opens]
            assert fake.peak_pending == 2 and fake.scales[:4] == [1, 2, 3, 4]
            for box in boxes:
                await box.close()
    finally:
        for alloc in list(fake.allocs.values()):
            if alloc["DesiredStatus"] == "run":
                await fake._stop(alloc)
        server.should_exit = True
        await task


def test_the_cap_is_a_config_field_and_an_eval_flag(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    assert ModalSandboxConfig().create_concurrency == NomadSandboxConfig().create_concurrency
    assert ModalSandboxConfig().create_concurrency >= 1
    task = tmp_path / "none"
    refused = CliRunner().invoke(
        app, ["eval", str(task), "--sandbox", "local", "--create-concurrency", "2"]
    )
    assert refused.exit_code != 0
    assert "--create-concurrency caps sandbox creation on ray, modal, nomad" in " ".join(
        refused.output.split()
    ), refused.output
