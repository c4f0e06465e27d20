"""`RaySandbox`: the driver's handle on a sandbox that lives on another node.

Every call is one call of the node's host actor (`host.py`): no process is spawned per
command, and files travel as Ray values (`payload.py`). A lost node raises `HostLost`, a
`SandboxError` that says the harness lost the sandbox, so the rollout is an infra error.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Unpack

from clotho.sandbox.base import ExecOptions, ExecResult, FreshCall, PathChange, Sandbox
from clotho.sandbox.ray.payload import pack, unpack

if TYPE_CHECKING:
    from clotho.sandbox.ray.backend import RayBackend, _Host


class RaySandbox(Sandbox):
    """A sandbox on `host`'s node, known there as `sid`."""

    def __init__(
        self,
        backend: RayBackend,
        host: _Host,
        sid: str,
        workdir: str,
        labels: dict[str, str],
    ) -> None:
        self._backend = backend
        self.host = host
        self.sid = sid
        self.workdir = workdir
        self.labels = labels
        self.stopped = False  # read by the pool: a stopped sandbox is never handed out again
        self._closed = False

    @property
    def node_id(self) -> str:
        return self.host.node_id

    @property
    def host_lost(self) -> bool:
        """Whether the node (its host actor) died: this sandbox is gone with it."""
        return self.host.dead

    async def _call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return await self._backend.call(self.host, method, self.sid, *args, timeout=timeout)

    def _limit(self, timeout: float | None) -> float | None:
        return None if timeout is None else timeout + self._backend.config.call_timeout_s

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        timeout = options.get("timeout")
        sent = {"timeout": timeout, **{k: v for k, v in options.items() if v is not None}}
        code, out, err, timed_out, duration = await self._call(
            "exec", cmd, sent, timeout=self._limit(timeout)
        )
        return ExecResult(
            exit_code=code, stdout=out, stderr=err, timed_out=timed_out, duration_s=duration
        )

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        code, out, err, timed_out, duration = await self._call(
            "exec_fresh", call.cmd, call.options(), timeout=self._limit(call.timeout)
        )
        return ExecResult(
            exit_code=code, stdout=out, stderr=err, timed_out=timed_out, duration_s=duration
        )

    async def stop_agent(self) -> None:
        self.stopped = True
        await self._call("stop_agent")

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        result: dict[str, str | None] = await self._call("digests", list(paths))
        return result

    async def changed_paths(self) -> list[PathChange] | None:
        """The node's list, so the runner's rules judge a sandbox on Ray as on its own
        backend (without it, only `.pth` files were searched for)."""
        found = await self._call("changed_paths")
        if found is None:
            return None
        return [PathChange(path, kind, link) for path, kind, link in found]

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        data: bytes = await self._call("read_file", path, max_bytes)
        if len(data) > max_bytes:  # the node's backend checked; a wrong one must not pass
            raise OSError(errno.EFBIG, f"file above {max_bytes} bytes", path)
        return data

    async def write_file(self, path: str, data: bytes) -> None:
        await self._call("write_file", path, await self._backend.as_value(data))

    async def upload(self, local: Path, remote: str) -> None:
        payload = await pack(local)
        await self._call("upload", await self._backend.as_value(payload), remote)

    async def download(self, remote: str, local: Path) -> None:
        if local.exists() or local.is_symlink():
            raise FileExistsError(f"already exists: {local}")
        await unpack(await self._call("download", remote), local)

    async def close(self) -> None:
        """Destroy the sandbox on its node; nothing to do when the node is gone (its
        sandboxes died with it; its folders are orphans for `clotho sandbox gc`)."""
        if self._closed:
            return
        self._closed = True
        if self.host.dead:
            self._backend.forget(self)
            return
        try:
            await self._call("close")
        finally:
            self._backend.forget(self)
