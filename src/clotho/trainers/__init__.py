"""Trainer sinks: the Atropos trajectory API (client and `clotho api` server) and JSONL.

Both take `clotho.env.scored.ScoredGroup` (or a dict in its shape). The server
(`clotho.trainers.server`) needs the `api` extra and is imported only where used.
"""

from __future__ import annotations

from typing import Protocol

from clotho.trainers.client import ApiClientConfig, AtroposClient
from clotho.trainers.jsonl import JsonlSink, load_groups
from clotho.trainers.protocol import GroupLike


class TrajectorySink(Protocol):
    """Where scored groups go: `AtroposClient` or `JsonlSink`."""

    async def wait_for_room(self) -> object: ...

    async def send(self, group: GroupLike) -> None: ...

    async def send_groups(self, groups: list[GroupLike]) -> object: ...

    async def aclose(self) -> None: ...


__all__ = [
    "ApiClientConfig",
    "AtroposClient",
    "GroupLike",
    "JsonlSink",
    "TrajectorySink",
    "load_groups",
]
