"""Dependencies installed once per (repository, commit, install_cmd, sandbox kind), then
copied into every later rollout's sandbox instead of installed again.

The first rollout of a key runs `install_cmd` in its own sandbox (before its agent starts)
and the result is captured there as one tar: the whole testbed as the install left it, and
everything under the install roots whose ctime is newer than a marker made just before the
install (ctime cannot be set by a program, unlike mtime). The tar is downloaded
as a single file into the host cache (`<cache>/installs/<key>/deps.tar`, written to a
temporary name and renamed into place) and never unpacked on the host. Every later rollout
of the key uploads that one file (instead of the snapshot) and unpacks it inside its own
sandbox: each rollout gets a
private copy, so nothing an agent writes (into site-packages, the testbed, anywhere) can
reach the cache or another rollout, and the cache folder is never visible in a sandbox.

One install per key: an asyncio lock per key inside a process and a file lock (polled, so
a cancelled waiter holds nothing) across processes; waiters find the tar when the lock
frees. `install_timeout_s` bounds the install. A failing or timed-out `install_cmd` is a
`TaskError` (the record's command, never a reward of 0) and is remembered on disk for
`failure_ttl_s`, so the other rollouts of a broken record fail at once instead of each
spending up to the install timeout; a sandbox or daemon failure (`SandboxError`, infra) is
not remembered and the next rollout tries again.

Install roots: on the local backend the places a sandbox can write outside /tmp
(`/usr/local`, `/opt`, `/root`, `/home`, new top-level folders) and the testbed; scanning
the host's `/usr` or `/var/lib` from an overlay sandbox would walk the host's trees. On
Docker the container's own `/usr`, `/etc` and `/var/lib` too (an `apt-get install`).
What is not captured: deleted files and `/tmp`.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import json
import logging
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from clotho.errors import SandboxError, TaskError
from clotho.sandbox import Sandbox
from clotho.sandbox.config import SandboxConfigBase

log = logging.getLogger(__name__)

MARKER = "/tmp/.clotho-install-marker"
SANDBOX_TAR = "/tmp/.clotho-deps.tar"
# Writable outside /tmp in a local sandbox (overlay root: /usr/local/* and /opt are the
# sandbox's; /root and /home are private tmpfs).
LOCAL_ROOTS = ("/usr/local", "/opt", "/root", "/home")
# A container's own file system: small, and an image's package manager writes there.
CONTAINER_ROOTS = ("/usr", "/etc", "/var/lib", "/srv", "/opt", "/root", "/home")
# Mounts and what the container runtime rewrites (Docker binds /etc/hosts and updates it).
PRUNED = (
    "/proc", "/sys", "/dev", "/tmp", "/run", "/var/run", "/root/.cache", "/.clotho",
    "/.clotho-io", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/etc/mtab",
)  # fmt: skip
_LOCK_POLL_S = 0.05


class InstallCacheOptions(BaseModel):
    """How installs are cached (the SWE options' `install_cache`)."""

    enabled: bool = Field(True, description="off: every rollout runs install_cmd itself")
    max_bytes: int = Field(
        1 << 30, gt=0, description="a captured install larger than this is a task error"
    )
    failure_ttl_s: float = Field(
        3600.0, ge=0, description="how long a failed install_cmd is remembered (0: never)"
    )


def sandbox_kind(sandbox: Sandbox) -> str:
    """What the install's result depends on besides the record: the backend and its image
    (and, on Docker, whether slots share a container: an isolated slot's root is read-only,
    so its installs land elsewhere), as its config states them (`install_facts`)."""
    config = _config(sandbox)
    if config is None:
        return f"unknown:{type(sandbox).__name__}"
    return json.dumps(config.install_facts(), sort_keys=True)


def install_roots(sandbox: Sandbox) -> tuple[str, ...]:
    """A container's own folders may be scanned whole; a local sandbox's `/usr` is the
    host's, which it cannot write anyway."""
    config = _config(sandbox)
    return CONTAINER_ROOTS if config is not None and config.own_root else LOCAL_ROOTS


def _config(sandbox: Sandbox) -> SandboxConfigBase | None:
    """The sandbox's config, when it keeps one (not every `Sandbox` does)."""
    config = getattr(sandbox, "config", None)
    return config if isinstance(config, SandboxConfigBase) else None


def install_key(*, source: str, commit: str, install_cmd: str, testbed: str, kind: str) -> str:
    material = json.dumps([source, commit, install_cmd, testbed, kind])
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def capture_script(roots: tuple[str, ...], testbed: str, tar: str) -> str:
    """Tar (no recursion: each entry once) the whole testbed, and everything newer than the
    marker under the roots and any top-level folder the install created (one the marker
    does not list); prints the tar's size. The testbed goes whole, so a later rollout needs
    this one file and not the snapshot too (and files the install deleted stay deleted)."""
    pruned = " -o ".join(f"-path {shlex.quote(p)}" for p in PRUNED)
    starts = " ".join(shlex.quote(r) for r in roots)
    bed = shlex.quote(testbed)
    return f"""set -eu
M={MARKER}
[ -f "$M" ] || {{ echo "the install marker is gone" >&2; exit 3; }}
set -f
starts=""
for s in {starts} $(ls -1A / | grep -vxF -f "$M" | sed 's|^|/|'); do
  case "$s" in /proc|/sys|/dev|/tmp|/run|{bed}) continue ;; esac
  [ -e "$s" ] && starts="$starts $s"
done
rc=0
{{ find {bed} -xdev -print0
   if [ -n "$starts" ]; then
     find $starts -xdev \\( {pruned} \\) -prune -o -cnewer "$M" -print0
   fi
}} | tar -c --null --no-recursion -f {tar} -T - 2>/tmp/.clotho-tar.err || rc=$?
if [ "$rc" -gt 1 ]; then cat /tmp/.clotho-tar.err >&2; exit "$rc"; fi
stat -c %s {tar}
"""


def restore_command(tar: str) -> str:
    return f"tar -x -p --no-same-owner --no-overwrite-dir -f {tar} -C / && rm -f -- {tar}"


class InstallCache:
    """Captured installs under `root/installs/<key>/`: `deps.tar` and `meta.json`, or
    `failed.json` for a failed install_cmd."""

    def __init__(self, root: Path, options: InstallCacheOptions | None = None) -> None:
        self.root = root
        self.options = options or InstallCacheOptions()
        self._locks: dict[str, asyncio.Lock] = {}
        self.installs = 0  # install_cmd runs this cache made (tests and the benchmark read it)
        self.restores = 0

    def folder(self, key: str) -> Path:
        return self.root / "installs" / key

    # -- on disk --------------------------------------------------------------------------

    def _cached(self, key: str) -> Path | None:
        tar = self.folder(key) / "deps.tar"
        return tar if tar.is_file() else None

    def _failure(self, key: str) -> str | None:
        path = self.folder(key) / "failed.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if time.time() - float(data.get("at", 0)) > self.options.failure_ttl_s:
            return None
        return str(data.get("message", "install_cmd failed"))

    def _remember_failure(self, key: str, message: str) -> None:
        if self.options.failure_ttl_s <= 0:
            return
        folder = self.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".failed-{uuid.uuid4().hex}"
        tmp.write_text(json.dumps({"at": time.time(), "message": message}))
        tmp.replace(folder / "failed.json")

    @asynccontextmanager
    async def _file_lock(self, key: str) -> AsyncIterator[None]:
        """flock, polled: waiting never blocks the loop or a thread, and cancelling a
        waiter leaves no lock behind."""
        path = self.root / "locks" / f"install-{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    await asyncio.sleep(_LOCK_POLL_S)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- in the sandbox -------------------------------------------------------------------

    async def ensure(
        self,
        sandbox: Sandbox,
        *,
        key: str,
        install_cmd: str,
        testbed: str,
        timeout_s: float,
        what: str,
        upload_workspace: Callable[[], Awaitable[None]],
    ) -> Literal["installed", "restored"]:
        """The workspace and the install's result in `sandbox`: restored from the cache (one
        file: the testbed as the install left it and the install's files), or, by the first
        rollout of the key, `upload_workspace` and the install run here and captured for
        the others."""
        if self._cached(key) is None:
            lock = self._locks.setdefault(key, asyncio.Lock())
            async with lock, self._file_lock(key):
                if self._cached(key) is None:
                    failed = self._failure(key)
                    if failed is not None:
                        raise TaskError(f"{what}: {failed} (remembered from an earlier try)")
                    await upload_workspace()
                    await self._install_and_capture(
                        sandbox, key, install_cmd, testbed, timeout_s, what
                    )
                    return "installed"
        await self.restore(sandbox, key, what)
        return "restored"

    async def restore(self, sandbox: Sandbox, key: str, what: str) -> None:
        tar = self._cached(key)
        if tar is None:
            raise SandboxError(f"{what}: the cached install {key} vanished")
        await sandbox.upload(tar, SANDBOX_TAR)
        result = await sandbox.exec(restore_command(SANDBOX_TAR), timeout=600.0)
        if not result.ok:
            raise SandboxError(
                f"{what}: cannot unpack the cached install {key} (exit code "
                f"{result.exit_code}): {(result.stderr or result.stdout).strip()[-500:]}"
            )
        self.restores += 1

    async def _install_and_capture(
        self,
        sandbox: Sandbox,
        key: str,
        install_cmd: str,
        testbed: str,
        timeout_s: float,
        what: str,
    ) -> None:
        self.installs += 1
        await run_install(sandbox, install_cmd, testbed, timeout_s, what, self._remember(key))
        roots = install_roots(sandbox)
        captured = await sandbox.exec(capture_script(roots, testbed, SANDBOX_TAR), timeout=600.0)
        if not captured.ok:
            raise SandboxError(
                f"{what}: cannot capture the install (exit code {captured.exit_code}): "
                f"{(captured.stderr or captured.stdout).strip()[-500:]}"
            )
        size = int(captured.stdout.strip().splitlines()[-1])
        if size > self.options.max_bytes:
            await sandbox.exec(f"rm -f -- {SANDBOX_TAR}", timeout=60.0)
            message = (
                f"install_cmd left {size} bytes, more than the install cache's max_bytes "
                f"({self.options.max_bytes})"
            )
            self._remember_failure(key, message)
            raise TaskError(f"{what}: {message}")
        folder = self.folder(key)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".deps-{uuid.uuid4().hex}.tar"
        try:
            await sandbox.download(SANDBOX_TAR, tmp)
            meta = {"install_cmd": install_cmd, "bytes": size, "at": time.time(), "what": what}
            (folder / "meta.json").write_text(json.dumps(meta))
            tmp.replace(folder / "deps.tar")
        finally:
            tmp.unlink(missing_ok=True)
        await sandbox.exec(f"rm -f -- {SANDBOX_TAR} {MARKER}", timeout=60.0)

    def _remember(self, key: str) -> Callable[[str], None]:
        return lambda message: self._remember_failure(key, message)


async def run_install(
    sandbox: Sandbox,
    install_cmd: str,
    testbed: str,
    timeout_s: float,
    what: str,
    on_failure: Callable[[str], None] | None = None,
) -> None:
    """`install_cmd` in the testbed after a fresh marker (slept past, since file times tick
    at the kernel's coarse clock); a failing command is a `TaskError`."""
    # The marker lists the top-level names, so folders the install adds there are found.
    marked = await sandbox.exec(
        f"rm -f -- {MARKER} && ls -1A / > {MARKER} && sleep 0.02", timeout=60.0
    )
    if not marked.ok:
        raise SandboxError(f"{what}: cannot mark the install's start: {marked.stderr.strip()}")
    result = await sandbox.exec(install_cmd, cwd=testbed, timeout=timeout_s)
    if not result.ok:
        message = (
            f"install_cmd failed (exit code {result.exit_code}"
            f"{f', timed out after {timeout_s:g} s' if result.timed_out else ''}): "
            f"{(result.stderr or result.stdout).strip()[-500:]}"
        )
        if on_failure is not None:
            on_failure(message)
        raise TaskError(f"{what}: {message}")


__all__ = [
    "InstallCache",
    "InstallCacheOptions",
    "install_key",
    "run_install",
    "sandbox_kind",
]
