"""The ssh backend: sandboxes on a machine reached over SSH (asyncssh).

One SSH connection per sandbox carries its persistent shell (the shared `PersistentShell`
protocol over an SSH session channel), SFTP for files and the fresh processes of
verification. One control shell per host (a plain bash of the remote user on the backend's
own connection, outside every sandbox) probes the host, prepares folders, kills timed-out
commands and removes sandboxes: no SSH session, with its login shell and rc files, per step.
The sandbox lives in a folder of its own under a clotho-owned root on the remote host
(`remote.py` describes it) with a marker naming its owner, so `clotho sandbox ls/gc` and
the pool's reaper find what a dead owner left.

Isolation is bubblewrap on the remote host when it has a working one (probed once per
backend); otherwise the sandbox is plain processes of the remote user in its folder, which
the backend says once at run time (a warning) and every sandbox states (`facts`, and the
label `clotho.ssh-isolation`). `isolation: bwrap` refuses a host without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import getpass
import json
import logging
import os
import secrets
import shlex
import socket
import tarfile
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clotho.errors import ConfigError, SandboxError
from clotho.sandbox.backends import OpenRequest, SandboxBackend
from clotho.sandbox.base import ExecResult, FreshCall, Sandbox
from clotho.sandbox.config import base_env
from clotho.sandbox.host.leases import SandboxRecord, lease_labels
from clotho.sandbox.shell import PersistentShell, ShellChannel, ShellReader, _Command
from clotho.sandbox.shell_backed import FolderTransferSandbox
from clotho.sandbox.ssh import remote
from clotho.sandbox.ssh.config import SshSandboxConfig
from clotho.sandbox.transfer import (
    BIG_FILE,
    add_tree,
    too_big,
    unpack_tar,
)

if TYPE_CHECKING:
    import asyncssh

log = logging.getLogger(__name__)

OWNER_START = "clotho.owner-start"  # the owner's start time: a reused pid is not the owner
ISOLATION = "clotho.ssh-isolation"  # bwrap | none, as the sandbox started
HOST = "clotho.ssh-host"
_CONTROL_TIMEOUT_S = 60.0
_CHUNK = 4 << 20


def _own_start() -> str:
    """This process's start time in clock ticks since boot (field 22 of /proc/self/stat)."""
    try:
        text = Path("/proc/self/stat").read_text()
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :].split()[19]


def _start_of(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()[19]


class SshRecord(SandboxRecord):
    """A remote leftover: orphaned also when its owner's pid lives on in another process."""

    def orphaned(self, now: float | None = None) -> bool:
        if super().orphaned(now):
            return True
        owner, started = self.owner or "", self.labels.get(OWNER_START)
        host, _, pid = owner.rpartition(":")
        if host != socket.gethostname() or not pid.isdigit() or not started:
            return False
        now_started = _start_of(int(pid))
        return now_started is not None and now_started != started


@dataclass(frozen=True)
class HostFacts:
    """What the remote host offers, probed once per backend."""

    home: str
    uid: int
    bwrap: str  # "ok", "missing" or "broken: <why>"
    lacks: tuple[str, ...]


def _user(config: SshSandboxConfig) -> str:
    return config.user or getpass.getuser()


def _where(config: SshSandboxConfig) -> str:
    return f"{_user(config)}@{config.host}:{config.port}"


async def connect(config: SshSandboxConfig) -> asyncssh.SSHClientConnection:
    """A connection to the configured host, its key checked against `known_hosts` unless the
    config opts out. A missing host or an unknown host key is the user's to fix (ConfigError);
    a host that does not answer is a SandboxError."""
    import asyncssh

    if not config.host:
        raise ConfigError(
            "the ssh sandbox backend needs a host: --set sandbox.host=HOST (or CLOTHO_SSH_HOST)"
        )
    known: str | None = None
    if config.check_host_key:
        known = os.path.expanduser(config.known_hosts or "~/.ssh/known_hosts")
        if not os.path.isfile(known):
            raise ConfigError(
                f"no known-hosts file at {known} to check {config.host}'s key against: add the "
                f"host's key to it (ssh-keyscan -p {config.port} {config.host}), name another "
                "with sandbox.known_hosts, or turn checking off with sandbox.check_host_key=false"
            )
    options: dict[str, Any] = {
        "port": config.port,
        "username": _user(config),
        "known_hosts": known,
        "connect_timeout": config.connect_timeout_s,
        "agent_forwarding": False,
    }
    if config.key_file:
        options["client_keys"] = [os.path.expanduser(config.key_file)]
    try:
        return await asyncssh.connect(config.host, **options)
    except asyncssh.HostKeyNotVerifiable as exc:
        raise ConfigError(
            f"{_where(config)}: the host's key is not in {known} ({exc}); refused. Add the key "
            "you expect to that file, or set sandbox.check_host_key=false to accept any"
        ) from exc
    except asyncssh.PermissionDenied as exc:
        raise ConfigError(f"{_where(config)}: authentication refused: {exc}") from exc
    except (OSError, asyncssh.Error) as exc:
        raise SandboxError(f"cannot connect to {_where(config)}: {exc}") from exc


class SshBackend(SandboxBackend[SshSandboxConfig]):
    """One SSH host (user, port and remote root): a control connection for probing, listing
    and removal; each sandbox opens a connection of its own."""

    kind = "ssh"
    config_type = SshSandboxConfig

    def __init__(self, config: SshSandboxConfig) -> None:
        self.config = config
        self._control: asyncssh.SSHClientConnection | None = None
        self._shell: PersistentShell | None = None
        self._lock = asyncio.Lock()
        self._facts: HostFacts | None = None
        self._warned = False
        self.connecting = asyncio.Semaphore(config.connect_concurrency)

    async def _control_shell(self) -> PersistentShell:
        """A plain bash of the remote user (outside every sandbox) on the backend's own
        connection: probing, preparing, killing and removing go through it, with no new SSH
        session (each of which starts the user's login shell, and its rc files) per step."""
        async with self._lock:
            if self._shell is not None and not self._shell._dead:
                return self._shell
            await self._drop_control()
            self._control = await connect(self.config)
            shell = PersistentShell(
                channel=SshChannel(self._control, "exec bash --noprofile --norc", b""),
                session=False,
                max_output_bytes=16 << 20,
            )
            await shell.start(timeout=_CONTROL_TIMEOUT_S)
            self._shell = shell
            return shell

    async def control(self, script: str, *, what: str, timeout: float = _CONTROL_TIMEOUT_S) -> str:
        """Run a bash script on the remote host, outside the sandboxes; its stdout, or
        SandboxError when it fails."""
        shell = await self._control_shell()
        result = await shell.run(script, timeout=timeout)
        if result.timed_out or result.exit_code != 0:
            why = "timed out" if result.timed_out else result.stderr.strip()[:500]
            raise SandboxError(f"{what} on {_where(self.config)} failed: {why}")
        return result.stdout

    async def facts(self) -> HostFacts:
        if self._facts is None:
            text = await self.control(remote.probe_script(), what="probing the host")
            fields = remote.parse_fields(text)
            lacks = tuple(
                line.partition("\t")[2] for line in text.splitlines() if line.startswith("lacks\t")
            )
            self._facts = HostFacts(
                home=fields.get("home", ""),
                uid=int(fields.get("uid") or -1),
                bwrap=fields.get("bwrap", "missing"),
                lacks=lacks,
            )
        return self._facts

    def root(self, facts: HostFacts) -> str:
        root = self.config.remote_root or ".clotho-ssh"
        return root if root.startswith("/") else f"{facts.home.rstrip('/')}/{root}"

    def isolation(self, config: SshSandboxConfig, facts: HostFacts) -> tuple[str, str]:
        """("bwrap" | "none", why), said once at run time when the host gives no isolation."""
        if facts.lacks:
            raise ConfigError(
                f"{_where(self.config)} lacks what the ssh backend runs there: "
                f"{', '.join(facts.lacks)} (bash and coreutils, awk, find, tar)"
            )
        if config.isolation == "none":
            return "none", "isolation: none was asked for"
        if facts.bwrap == "ok":
            return "bwrap", "bubblewrap on the remote host"
        why = f"bubblewrap is {facts.bwrap} on {_where(self.config)}"
        if config.isolation == "bwrap":
            raise ConfigError(f"{why}, and sandbox.isolation is bwrap")
        if not self._warned:
            self._warned = True
            log.warning(
                "%s: ssh sandboxes there run WITHOUT isolation, as plain processes of %s in "
                "their own folder (they see the whole host as that user; a process that calls "
                "setsid can outlive its sandbox); install bubblewrap there to isolate them",
                why,
                _user(self.config),
            )
        return "none", why

    async def _open(self, request: OpenRequest[SshSandboxConfig]) -> Sandbox:
        return await SshSandbox.create(self, request.config, request.labels, request.lease_s)

    async def records(self) -> list[SandboxRecord]:
        root = self.root(await self.facts())
        text = await self.control(remote.list_script(root), what="listing sandboxes")
        found: list[SandboxRecord] = []
        for line in text.splitlines():
            name, _, marker = line.partition("\t")
            if not remote.SANDBOX_NAME.match(name):
                continue
            labels: dict[str, str] = {}
            created = None
            with contextlib.suppress(ValueError, AttributeError):
                lease = json.loads(marker)
                labels = {k: str(v) for k, v in lease.get("labels", {}).items()}
                created = lease.get("created")
            found.append(SshRecord("ssh", name, labels, created, None))
        return found

    async def remove(self, record: SandboxRecord) -> None:
        if not remote.SANDBOX_NAME.match(record.id):
            raise ValueError(f"not an ssh sandbox's name: {record.id!r}")
        folder = f"{self.root(await self.facts())}/{record.id}"
        await self.control(remote.end_script(folder, remove=True), what=f"removing {record.id}")

    async def healthy(self, sandbox: Sandbox | None = None) -> bool:
        try:
            async with asyncio.timeout(15):
                await self.control("true", what="a health check")
        except (SandboxError, ConfigError, TimeoutError):
            return False
        return True

    async def _drop_control(self) -> None:
        shell, self._shell = self._shell, None
        control, self._control = self._control, None
        if shell is not None:
            with contextlib.suppress(Exception):
                await shell.close()
        if control is not None:
            control.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await control.wait_closed()

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop_control()


# -- the shell over SSH -------------------------------------------------------------------------


class _Session:
    """The SSH session's callbacks (an asyncssh `SSHClientSession`): bytes go straight to
    the shell's readers, stdout and stderr apart."""

    def __init__(self, channel: SshChannel) -> None:
        self._channel = channel

    def connection_made(self, chan: Any) -> None:
        pass

    def session_started(self) -> None:
        pass

    def data_received(self, data: bytes, datatype: int | None) -> None:
        reader = self._channel.stderr if datatype == 1 else self._channel.stdout
        reader.feed_data(data)

    def eof_received(self) -> bool:
        self._channel.stdout.feed_eof()
        self._channel.stderr.feed_eof()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._channel.stdout.feed_eof()
        self._channel.stderr.feed_eof()

    def exit_status_received(self, status: int) -> None:
        pass

    def exit_signal_received(self, *args: Any) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass

    def xon_xoff_requested(self, client_can_do: bool) -> None:
        pass


class _Flow:
    """What a stream's `ShellReader` pauses when it floods between commands: the SSH channel.
    Its window then fills, and the remote writer blocks until the next command resumes it.

    One channel carries both streams, so pausing it stops both: a stream may pause it only
    while the other awaits no marker either. Otherwise the request is declined (raised) and
    made again with the next bytes dropped; pausing anyway left the other stream's end
    marker unread, and the command waiting forever (seen under load)."""

    def __init__(self, channel: SshChannel, other: ShellReader) -> None:
        self._channel = channel
        self._other = other

    def is_closing(self) -> bool:
        chan = self._channel._chan
        return chan is None or bool(chan.is_closing())

    def pause_reading(self) -> None:
        if not self._other.idle:
            raise RuntimeError("the other stream still awaits a marker")
        self._channel._chan.pause_reading()

    def resume_reading(self) -> None:
        self._channel._chan.resume_reading()


class SshChannel(ShellChannel):
    """A bash started by an SSH session channel; every write is preceded by the command
    mark (`remote.mark_prefix`) that lets a timeout find the command's processes."""

    def __init__(self, conn: asyncssh.SSHClientConnection, command: str, prefix: bytes) -> None:
        self._conn = conn
        self._command = command
        self._prefix = prefix
        self._chan: Any = None
        self._own_readers()

    async def open(self) -> None:
        import asyncssh

        try:
            self._chan, _ = await self._conn.create_session(
                lambda: _Session(self),  # type: ignore[arg-type,return-value]
                self._command,
                encoding=None,
            )
        except (OSError, asyncssh.Error) as exc:
            raise SandboxError(f"cannot start the sandbox shell over ssh: {exc}") from exc
        self.stdout.set_transport(_Flow(self, self.stderr))  # type: ignore[arg-type]
        self.stderr.set_transport(_Flow(self, self.stdout))  # type: ignore[arg-type]

    async def write(self, data: bytes) -> None:
        chan = self._chan
        if chan is None or chan.is_closing():
            raise SandboxError("the sandbox shell over ssh is gone")
        chan.write(self._prefix + data)

    def kill_running(self) -> None:
        """Done from the remote side (`_RemoteShell`), never with host pids."""

    async def close(self) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            chan.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await chan.wait_closed()


class _RemoteShell(PersistentShell):
    """`PersistentShell` whose timed-out commands are killed on the remote host: the host's
    pids mean nothing there."""

    killer: Callable[[str], Awaitable[None]] | None = None
    command_script: str | None = None
    session_script: str | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def start(self, timeout: float = 15.0) -> None:
        self._loop = asyncio.get_running_loop()
        await super().start(timeout)

    async def _stop_command(self, command: _Command) -> None:
        if self.killer is not None and self.command_script is not None:
            with contextlib.suppress(SandboxError, TimeoutError):
                await self.killer(self.command_script)

    def _kill_session_shell(self) -> None:  # called in a thread by `_recover`
        if self.killer is None or self.session_script is None or self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self.killer(self.session_script), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=_CONTROL_TIMEOUT_S)


# -- the sandbox ------------------------------------------------------------------------------


class _SftpFolder:
    """The sandbox's transfer folder on the remote host, over SFTP (a `TransferFolder`): a
    file is put in `xfer/`, which the sandbox sees, and taken out of its reach (renamed into
    `priv/`) before it is read."""

    def __init__(self, conn: asyncssh.SSHClientConnection, folder: str) -> None:
        self._conn = conn
        self._folder = folder
        self._sftp: Any = None

    async def _client(self) -> Any:
        import asyncssh

        if self._sftp is None:
            try:
                self._sftp = await self._conn.start_sftp_client()
            except (OSError, asyncssh.Error) as exc:
                raise SandboxError(f"cannot start SFTP to the sandbox's host: {exc}") from exc
        return self._sftp

    def drop(self) -> None:
        """Forget the SFTP client (its connection is closing)."""
        self._sftp = None

    async def _take(self, name: str, max_bytes: int, what: str) -> Any:
        """Move the sandbox's transfer file out of its reach (a rename: the entry itself, a
        link stays a link), then open it if it is a regular file within `max_bytes`."""
        import asyncssh

        sftp = await self._client()
        taken = f"{self._folder}/priv/{name}"
        try:
            await sftp.posix_rename(f"{self._folder}/xfer/{name}", taken)
            attrs = await sftp.lstat(taken)
        except asyncssh.SFTPNoSuchFile as exc:
            raise FileNotFoundError(f"the sandbox's transfer file is gone: {what}") from exc
        if attrs.type != asyncssh.FILEXFER_TYPE_REGULAR:
            raise OSError(errno.EPERM, "the sandbox replaced a transfer file", what)
        if (attrs.size or 0) > max_bytes:
            raise too_big(what, max_bytes)
        return await sftp.open(taken, "rb")

    async def write(self, name: str, data: bytes) -> None:
        sftp = await self._client()
        async with sftp.open(f"{self._folder}/xfer/{name}", "xb") as file:
            await file.write(data)

    async def read(self, name: str, max_bytes: int, what: str) -> bytes:
        async with await self._take(name, max_bytes, what) as file:
            data: bytes = await file.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise too_big(what, max_bytes)
        return data

    async def copy_in(self, source: Path, name: str) -> None:
        sftp = await self._client()
        await sftp.put(str(source), f"{self._folder}/xfer/{name}")

    async def tar_in(self, source: Path, name: str) -> None:
        sftp = await self._client()
        with tempfile.TemporaryDirectory(prefix="clotho-ssh-") as tmp:
            tar_path = Path(tmp) / "tree.tar"
            await asyncio.to_thread(_pack, source, tar_path)
            await sftp.put(str(tar_path), f"{self._folder}/xfer/{name}")

    async def copy_out(self, name: str, target: Path, max_bytes: int, what: str) -> None:
        async with await self._take(name, max_bytes, what) as file:
            await _fetch(file, target, max_bytes, what)

    async def untar_out(self, name: str, target: Path, max_bytes: int, what: str) -> None:
        async with await self._take(name, max_bytes, what) as file:
            with tempfile.TemporaryDirectory(prefix="clotho-ssh-") as tmp:
                tar_path = Path(tmp) / "tree.tar"
                await _fetch(file, tar_path, max_bytes, what)
                await asyncio.to_thread(_unpack, tar_path, target, max_bytes, what)

    async def remove(self, name: str) -> None:
        """Remove a transfer file (unlinked, never followed) from xfer/ and priv/."""
        sftp = await self._client()
        for place in ("xfer", "priv"):
            with contextlib.suppress(Exception):
                await sftp.remove(f"{self._folder}/{place}/{name}")


class SshSandbox(FolderTransferSandbox):
    """A sandbox on the remote host: its folder, its connection, its shell."""

    _xfer: _SftpFolder

    def __init__(
        self,
        shell: PersistentShell,
        workdir: str,
        labels: dict[str, str],
        *,
        conn: asyncssh.SSHClientConnection,
        folder: str,
        xfer: str,
        facts: dict[str, Any],
        backend: SshBackend,
        fresh: dict[str, Any],
    ) -> None:
        super().__init__(shell, workdir, labels)
        self._conn = conn
        self._backend = backend
        self._fresh = fresh  # how `exec_fresh` starts: `remote.fresh`'s keyword arguments
        self.folder = folder
        self._xfer = _SftpFolder(conn, folder)
        self._xfer_inner = xfer  # the transfer folder as the sandbox sees it
        self.facts = facts

    @classmethod
    async def create(
        cls,
        backend: SshBackend,
        config: SshSandboxConfig,
        labels: dict[str, str],
        lease_s: float,
    ) -> SshSandbox:
        facts = await backend.facts()
        isolation, why = backend.isolation(config, facts)
        bwrap = isolation == "bwrap"
        folder = f"{backend.root(facts)}/sbx-{secrets.token_hex(8)}"
        labels = {
            **labels,
            **lease_labels(lease_s),
            OWNER_START: _own_start(),
            ISOLATION: isolation,
            HOST: _where(config),
        }
        marker = json.dumps({"labels": labels, "created": time.time(), "why": why})
        conn: asyncssh.SSHClientConnection | None = None
        try:
            # The marker first: whatever happens next, gc can find the folder.
            await backend.control(
                remote.prepare_script(folder, backend.root(facts), marker),
                what="making the sandbox's folder",
            )
            async with backend.connecting:
                conn = await connect(config)
            workdir = config.workdir if bwrap else f"{folder}/app"
            xfer = remote.XFER_MOUNT if bwrap else f"{folder}/xfer"
            home = "/root" if bwrap else f"{folder}/home"
            limits = {
                key: value
                for key, value in {
                    "memory_kb": (config.memory_mb or 0) * 1024,
                    "processes": config.pids_limit or 0,
                    "file_kb": (config.file_size_mb or 0) * 1024,
                }.items()
                if value
            }
            command = remote.bash(
                remote.launcher(
                    folder,
                    bwrap=bwrap,
                    workdir=workdir,
                    env=base_env(home, config.env),
                    network=config.network,
                    limits=limits,
                )
            )
            shell = _RemoteShell(
                channel=SshChannel(conn, command, remote.mark_prefix(xfer)),
                session=config.shell == "session",
                max_output_bytes=config.max_output_bytes,
            )
            await shell.start()
            ids = remote.parse_fields(
                await backend.control(
                    remote.ids_script(folder, bwrap=bwrap), what="finding the sandbox's shell"
                )
            )
            top, ns = int(ids["top"]), ids.get("ns") or None

            async def killer(script: str) -> None:
                await backend.control(script, what="killing a command")

            shell.killer = killer
            shell.command_script = remote.kill_command_script(
                folder, top=top, session=config.shell == "session", ns=ns
            )
            shell.session_script = remote.kill_session_shell_script(top=top, ns=ns)
            stated = {
                "backend": "ssh",
                "host": _where(config),
                "folder": folder,
                "isolation": isolation,
                "why": why,
                "network": (
                    "the remote host's, unguarded" if config.network or not bwrap else "none"
                ),
                "limits": {
                    "memory": f"{config.memory_mb} MB address space per process (ulimit -v)"
                    if config.memory_mb
                    else "none",
                    "processes": f"{config.pids_limit} for the remote user (ulimit -u)"
                    if config.pids_limit
                    else "none",
                    "file size": f"{config.file_size_mb} MB (ulimit -f)"
                    if config.file_size_mb
                    else "none",
                    "cpu": "none",
                    "disk": "none",
                },
            }
            return cls(
                shell,
                workdir,
                labels,
                conn=conn,
                folder=folder,
                xfer=xfer,
                facts=stated,
                backend=backend,
                fresh={
                    "bwrap": bwrap,
                    "workdir": workdir,
                    "env": base_env(home, config.env),
                    "network": config.network,
                    "limits": limits,
                },
            )
        except BaseException:
            await asyncio.shield(_discard(backend, conn, folder))
            raise

    # -- files: through the transfer folder (`FolderTransferSandbox`, `_SftpFolder`) ---------

    # -- verification -----------------------------------------------------------------------

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """A new process over the sandbox's files and nothing else of the agent's: under
        bubblewrap a fresh one (its own pid namespace, the same folders: workspace, /tmp,
        /root, /home, /opt, /var/tmp, /tests, /logs; /usr the host's, read-only), else a new
        bash in the folder; killed with what it started at its timeout."""
        import asyncssh

        if self._closed:
            raise SandboxError("the sandbox is closed")
        options = self._fresh
        script = remote.fresh(
            self.folder,
            call.cmd,
            cwd=self.resolve(call.cwd or self.workdir),
            timeout=call.timeout,
            **{**options, "env": {**options["env"], **(call.env or {})}},
        )
        started = time.perf_counter()
        try:
            async with asyncio.timeout(call.timeout + _CONTROL_TIMEOUT_S):
                proc = await self._conn.create_process(remote.bash(script), encoding=None)
                async with proc:
                    if call.stdin:
                        proc.stdin.write(call.stdin)
                    proc.stdin.write_eof()
                    out, err = await asyncio.gather(
                        _capped(proc.stdout, call.max_output_bytes),
                        _capped(proc.stderr, call.max_output_bytes),
                    )
                    await proc.wait()
        except (OSError, asyncssh.Error, TimeoutError) as exc:
            raise SandboxError(f"a fresh process on the ssh host failed: {exc}") from exc
        duration = time.perf_counter() - started
        # `timeout -s KILL` kills its process group, itself included: a signal, not a status.
        killed = proc.exit_signal is not None and proc.exit_signal[0] == "KILL"
        status = proc.exit_status
        code = 137 if killed else (status if status is not None and status >= 0 else -1)
        timed_out = code == 137 and duration >= call.timeout
        return ExecResult(
            exit_code=-9 if timed_out else code,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            timed_out=timed_out,
            duration_s=duration,
        )

    async def stop_agent(self) -> None:
        """Kill every process of the agent (its pid namespace under bubblewrap; without it,
        its session and tree) and close its shell; the folder stays for verification."""
        self._stopped = True
        await self._backend.control(
            remote.end_script(self.folder, remove=False), what="stopping the agent"
        )
        with contextlib.suppress(Exception):
            await self._shell.close()

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        """sha256 of each path as the sandbox sees it, by the host's own tools (its /usr,
        read-only in the sandbox) in a fresh process: nothing of the agent's runs."""
        lines = []
        for path in paths:
            q = shlex.quote(self.resolve(path))
            lines.append(
                f"if [ -L {q} ]; then printf 'link:'; readlink -- {q} | tr -d '\\n' | "
                f"/usr/bin/sha256sum; elif [ -e {q} ]; then /usr/bin/sha256sum < {q} "
                "2>/dev/null || echo -; else echo -; fi"
            )
        if not lines:
            return {}
        result = await self.exec_fresh("\n".join(lines), timeout=_CONTROL_TIMEOUT_S)
        answers = result.stdout.splitlines()
        if result.exit_code != 0 or len(answers) != len(paths):
            raise SandboxError(f"digests on the ssh host failed: {result.stderr.strip()[:300]}")
        out: dict[str, str | None] = {}
        for path, answer in zip(paths, answers, strict=True):
            text = answer.strip()
            if text == "-":
                out[path] = None
            elif text.startswith("link:"):
                out[path] = "link:" + text[5:].split()[0]
            else:
                out[path] = text.split()[0]
        return out

    # -- teardown ---------------------------------------------------------------------------

    async def _end_processes(self) -> None:
        """Kill every process of the sandbox on the remote host (its pid namespace under
        bubblewrap) before its channel closes, and remove its folder."""
        await _discard(self._backend, None, self.folder)

    async def _release(self) -> None:
        self._xfer.drop()
        await _discard(self._backend, self._conn, None)


async def _discard(
    backend: SshBackend, conn: asyncssh.SSHClientConnection | None, folder: str | None
) -> None:
    """Kill what is left of the sandbox and remove its folder (through the backend's control
    shell), then close its connection. What fails is left for `clotho sandbox gc` (logged)."""
    try:
        if folder is not None:
            await backend.control(
                remote.end_script(folder, remove=True), what="removing the sandbox"
            )
    except (SandboxError, ConfigError) as exc:
        log.warning("ssh sandbox %s left behind (clotho sandbox gc removes it): %s", folder, exc)
    finally:
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await conn.wait_closed()


async def _fetch(file: Any, target: Path, max_bytes: int, what: str) -> None:
    """Copy an open SFTP file to a new host file, never more than `max_bytes` (a process of
    the agent may still append to it)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    with os.fdopen(os.open(target, flags, 0o644), "wb") as out:
        total = 0
        while True:
            chunk: bytes = await file.read(min(_CHUNK, max_bytes + 1 - total))
            if not chunk:
                return
            total += len(chunk)
            if total > max_bytes:
                raise too_big(what, max_bytes)
            if len(chunk) > BIG_FILE:
                await asyncio.to_thread(out.write, chunk)
            else:
                out.write(chunk)


async def _capped(stream: Any, limit: int) -> bytes:
    """A stream read to its end, keeping its first `limit` bytes (the rest is drained, so
    the writer never blocks and the host's memory stays bounded)."""
    kept = bytearray()
    while True:
        chunk: bytes = await stream.read(_CHUNK)
        if not chunk:
            return bytes(kept)
        if len(kept) < limit:
            kept += chunk[: limit - len(kept)]


def _pack(source: Path, tar_path: Path) -> None:
    with tarfile.open(tar_path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_tree(tar, str(source))


def _unpack(tar_path: Path, target: Path, max_bytes: int, what: str) -> None:
    with tarfile.open(tar_path, mode="r:") as tar:
        members = tar.getmembers()
        if sum(m.size for m in members if m.isfile()) > max_bytes:
            raise too_big(what, max_bytes)
        target.mkdir()
        unpack_tar(tar, members, target)


__all__ = ["SshBackend", "SshSandbox"]
