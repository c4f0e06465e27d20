"""A slot on a remote host as a `Sandbox`, over any way of running one script there.

The host runs `bash -c SCRIPT` with optional stdin and returns the exit code and both
outputs (`Runner`): Modal's `Sandbox.exec`, a Nomad allocation's sandbox server. Files go
through stdin and stdout as raw bytes (a tar for a tree), never base64 in a command. Each
slot has its own folder (`<slot_root>/<k>`, its workdir inside) and a token in the
environment of everything it starts, so closing the slot (or `stop_agent`) kills exactly
its processes. Slots of one host share its kernel and file system: they are as isolated as
Docker slots with `slot_isolation: none`; use one slot per host for tasks that need more.
"""

from __future__ import annotations

import asyncio
import errno
import io
import shlex
import tarfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Unpack

from clotho.errors import SandboxError
from clotho.sandbox.base import ExecOptions, ExecResult, FreshCall, Sandbox
from clotho.sandbox.config import DEFAULT_PATH

# (script, stdin, timeout) -> (exit code, stdout, stderr)
Runner = Callable[[str, bytes | None, float | None], Awaitable[tuple[int, bytes, bytes]]]
TIMEOUT_EXIT = 124
NOT_FOUND_EXIT, IS_DIR_EXIT, TOO_BIG_EXIT, NOT_REGULAR_EXIT = 80, 81, 82, 83
GRACE_S = 30.0  # the host's own limit on a call, beyond the command's


def _kill_token(token: str) -> str:
    """Kill every process whose environment holds `token`, in rounds until none is left
    (one grep over every /proc/PID/environ a round, not a process per pid)."""
    return (
        "for _ in 1 2 3 4 5; do "
        f"p=$(grep -lzx 'CLOTHO_SLOT={token}' /proc/[0-9]*/environ 2>/dev/null | "
        "sed -n 's#^/proc/\\([0-9]*\\)/environ$#\\1#p'); "
        '[ -z "$p" ] && break; kill -9 $p 2>/dev/null; sleep 0.1; done; true'
    )


class RemoteSlotSandbox(Sandbox):
    """Slot `slot` of a host, reached through `run`; `release` gives the slot back."""

    def __init__(
        self,
        run: Runner,
        *,
        root: str,
        workdir: str,
        token: str,
        env: dict[str, str],
        labels: dict[str, str],
        release: Callable[[], Awaitable[None]],
        exec_timeout_s: float,
    ) -> None:
        self._run = run
        self.root = root
        self.workdir = workdir
        self.token = token
        self.labels = labels
        self._env = {
            "PATH": DEFAULT_PATH,
            "HOME": f"{root}/home",
            "TMPDIR": f"{root}/tmp",
            "LANG": "C.UTF-8",
            "CLOTHO_SLOT": token,
            **env,
        }
        self._release = release
        self._default_timeout = exec_timeout_s
        self.stopped = False
        self._closed = False

    async def setup(self) -> None:
        """Make the slot's folders (its workdir starts empty or as the image left it)."""
        q = shlex.quote
        script = f"mkdir -p {q(self.workdir)} {q(self.root)}/home {q(self.root)}/tmp"
        code, _, err = await self._run(script, None, 60)
        if code != 0:
            raise SandboxError(
                f"could not prepare slot {self.root}: {err.decode(errors='replace')}"
            )

    def _envs(self, extra: dict[str, str] | None) -> str:
        env = {**self._env, **(extra or {})}
        return " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        if self.stopped:
            raise SandboxError("the agent was stopped: only exec_fresh and digests remain")
        return await self._command(
            cmd,
            timeout=options.get("timeout"),
            cwd=options.get("cwd"),
            env=options.get("env"),
            user=options.get("user"),
        )

    async def _command(
        self,
        cmd: str,
        *,
        timeout: float | None,
        cwd: str | None,
        env: dict[str, str] | None,
        user: str | None = None,
        stdin: bytes | None = None,
        fresh: bool = False,
    ) -> ExecResult:
        limit = timeout or self._default_timeout
        directory = shlex.quote(self.resolve(cwd) if cwd else self.workdir)
        inner = shlex.quote(cmd)
        shell = "bash --noprofile --norc -c" if fresh else "bash -c"
        run = f"{shell} {inner}"
        if user:
            run = f"runuser -u {shlex.quote(user)} -- {run}"
        # Output goes to files first: a background process the command leaves must not hold
        # the call's pipes open (the call would wait for it).
        tmp = shlex.quote(f"{self.root}/tmp")
        stdin_from = "" if stdin is not None else " </dev/null"
        script = (
            f"cd -- {directory} || exit 126; o=$(mktemp -p {tmp}) && e=$(mktemp -p {tmp}) || "
            f"exit 125; env -i {self._envs(env)} timeout -k 2 {limit:g} {run} "
            f'>"$o" 2>"$e"{stdin_from}; r=$?; cat "$o"; cat "$e" >&2; rm -f "$o" "$e"; exit $r'
        )
        started = time.perf_counter()
        code, out, err = await self._run(script, stdin, limit + GRACE_S)
        duration = time.perf_counter() - started
        timed_out = code in (TIMEOUT_EXIT, 137) and duration >= limit
        return ExecResult(
            exit_code=code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=duration,
        )

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """A new process with a clean environment (every call on the host is one)."""
        result = await self._command(
            call.cmd, timeout=call.timeout, cwd=call.cwd, env=call.env, stdin=call.stdin, fresh=True
        )
        result.stdout = result.stdout[: call.max_output_bytes]
        result.stderr = result.stderr[: call.max_output_bytes]
        return result

    async def stop_agent(self) -> None:
        self.stopped = True
        await self._run(_kill_token(self.token), None, 60)

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        """sha256 of each path, by the host's own `sha256sum` run outside the slot's
        processes (the host image's copy; a slot cannot replace it when it runs as a user
        without write access to /usr, which the image decides)."""
        out: dict[str, str | None] = {}
        for path in paths:
            full = shlex.quote(self.resolve(path))
            script = (
                f"if [ -L {full} ]; then printf 'link:'; readlink {full} | tr -d '\\n' | "
                f"/usr/bin/sha256sum; elif [ -e {full} ]; then /usr/bin/sha256sum < {full}; "
                "else exit 1; fi"
            )
            code, stdout, _ = await self._run(script, None, 60)
            text = stdout.decode().strip()
            if code != 0:
                out[path] = None
            elif text.startswith("link:"):
                out[path] = "link:" + text[5:].split()[0]
            else:
                out[path] = text.split()[0]
        return out

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        full = shlex.quote(self.resolve(path))
        script = (
            f"[ -e {full} ] || exit {NOT_FOUND_EXIT}; [ -d {full} ] && exit {IS_DIR_EXIT}; "
            f"[ -f {full} ] || exit {NOT_REGULAR_EXIT}; "
            f"[ $(stat -c %s {full}) -le {max_bytes} ] || exit {TOO_BIG_EXIT}; "
            f"exec head -c {max_bytes + 1} {full}"
        )
        code, out, err = await self._run(script, None, 600)
        if code == NOT_FOUND_EXIT:
            raise FileNotFoundError(errno.ENOENT, "no such file", path)
        if code == IS_DIR_EXIT:
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if code == NOT_REGULAR_EXIT:
            raise OSError(errno.EINVAL, "not a regular file (a device, FIFO or socket)", path)
        if code == TOO_BIG_EXIT or len(out) > max_bytes:
            raise OSError(errno.EFBIG, f"file above {max_bytes} bytes", path)
        if code != 0:
            raise SandboxError(f"reading {path} failed: {err.decode(errors='replace')}")
        return out

    async def write_file(self, path: str, data: bytes) -> None:
        full = self.resolve(path)
        q = shlex.quote
        script = f"mkdir -p -- {q(str(Path(full).parent))} && cat > {q(full)}"
        code, _, err = await self._run(script, data, 600)
        if code != 0:
            raise SandboxError(f"writing {path} failed: {err.decode(errors='replace')}")

    async def upload(self, local: Path, remote: str) -> None:
        if not local.is_dir():
            await self.write_file(remote, await asyncio.to_thread(local.read_bytes))
            return
        data = await asyncio.to_thread(_tar, local)
        full = shlex.quote(self.resolve(remote))
        code, _, err = await self._run(f"mkdir -p -- {full} && tar -x -C {full}", data, 600)
        if code != 0:
            raise SandboxError(f"upload to {remote} failed: {err.decode(errors='replace')}")

    async def download(self, remote: str, local: Path) -> None:
        if local.exists() or local.is_symlink():
            raise FileExistsError(f"already exists: {local}")
        full = shlex.quote(self.resolve(remote))
        script = (
            f"[ -e {full} ] || exit {NOT_FOUND_EXIT}; "
            f"if [ -d {full} ]; then exec tar -c -C {full} .; else exec cat {full}; fi"
        )
        code, out, err = await self._run(script, None, 600)
        if code == NOT_FOUND_EXIT:
            raise FileNotFoundError(errno.ENOENT, "no such file", remote)
        if code != 0:
            raise SandboxError(f"download of {remote} failed: {err.decode(errors='replace')}")
        kind = await self._run(f"[ -d {full} ]", None, 60)
        if kind[0] == 0:
            await asyncio.to_thread(_untar, out, local)
        else:
            await asyncio.to_thread(local.write_bytes, out)

    async def close(self) -> None:
        """Kill the slot's processes, remove its folder, give the slot back. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            q = shlex.quote
            await self._run(f"{_kill_token(self.token)}; rm -rf -- {q(self.root)}", None, 120)
        finally:
            await self._release()


def _tar(path: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(path), arcname=".")
    return buffer.getvalue()


def _untar(data: bytes, target: Path) -> None:
    target.mkdir()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(str(target), filter="data")
