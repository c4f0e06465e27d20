"""A slot on a remote host as a `Sandbox`, over any way of running one script there.

The host runs `bash -c SCRIPT` with optional stdin and returns the exit code and both
outputs (`Runner`): Modal's `Sandbox.exec`, a Nomad allocation's sandbox server. Files go
through stdin and stdout as raw bytes (a tar for a tree), never base64 in a command. Each
slot has its own folder (`<slot_root>/<k>`, its workdir inside).

Stopping the agent and closing the slot must reach every process the slot started, whatever
that process changed about itself (its environment, session, process group, parent), so the
slot's processes are kept together by something they cannot change (`jail`):

- `pidns`, on a host of its own (a workdir outside the slot folder: a one-slot Modal
  sandbox): every command runs in the slot's pid namespace (`nsenter` into one that
  `unshare` made at setup, with its own /proc); the agent stays root there. No process
  can leave a pid namespace, nor signal its init; killing that init from outside makes
  the kernel kill everything in it.
- `uid`, on a host shared by slots (or where a pid namespace cannot be made): every command
  runs as the slot's own uid (`setpriv --reuid ... --no-new-privs`), which it cannot
  change: of root's capabilities it keeps only file access (`_SLOT_CAPS`: files read and
  written as root would, low ports), not CAP_SETUID nor CAP_KILL. The stop runs `kill -9
  -1` as that uid until /proc shows none of its processes; a neighbour's processes, of
  another uid, are out of its reach too. Programs that check for uid 0 (`apt-get`) refuse.

Both need the host to run scripts as root (the sandbox server's user) and util-linux. The
token in every process's environment (`CLOTHO_SLOT`) stays, as a second sweep for the
harness's own fresh processes (they run outside the jail, as root). What stays shared: the
file system (slots of one host are as isolated as Docker slots with `slot_isolation:
none` there, and a slot could change the host's programs the harness runs), so tasks that
need more get one slot per host.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import io
import logging
import posixpath
import shlex
import tarfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal, Unpack

from clotho.errors import ConfigError, SandboxError, TamperError
from clotho.sandbox.base import ExecOptions, ExecResult, FreshCall, Sandbox
from clotho.sandbox.config import DEFAULT_PATH

# (script, stdin, timeout) -> (exit code, stdout, stderr)
Runner = Callable[[str, bytes | None, float | None], Awaitable[tuple[int, bytes, bytes]]]
TIMEOUT_EXIT = 124
NOT_FOUND_EXIT, IS_DIR_EXIT, TOO_BIG_EXIT, NOT_REGULAR_EXIT = 80, 81, 82, 83
GRACE_S = 30.0  # the host's own limit on a call, beyond the command's
# Slot uids: one per live slot on a host, never one a process there already runs as.
UID_BASE, UID_SPAN = 200_000, 1 << 20
_UID_TAKEN_EXIT = 75
# What a slot with a uid of its own keeps of root (ambient, so every program it runs has
# them): files as root sees them, low ports. Not CAP_SETUID/SETGID (its uid is what the
# stop goes by), not CAP_KILL (neighbours), nothing else.
_SLOT_CAPS = "dac_override,dac_read_search,fowner,net_bind_service"


def _setpriv(uid: int) -> str:
    """The command prefix that runs a program as the slot's uid with `_SLOT_CAPS` only
    (no_new_privs: no setuid program gives anything back)."""
    caps = ",".join(f"+{c}" for c in _SLOT_CAPS.split(","))
    return (
        f"setpriv --reuid={uid} --regid={uid} --clear-groups --inh-caps=-all,{caps} "
        f"--ambient-caps=-all,{caps} --bounding-set=-all,{caps} --no-new-privs --"
    )


log = logging.getLogger(__name__)

Jail = Literal["pidns", "uid"]

# Processes with real uid $UID_ that are not dead already (a zombie waits for its parent):
# one grep over every status file, a second only for its hits.
_LIST_UID = r"""
left=
for f in $(grep -l "^Uid:[[:space:]]*$UID_[[:space:]]" /proc/[0-9]*/status 2>/dev/null); do
  grep -q "^State:[[:space:]]*[ZX]" "$f" 2>/dev/null && continue
  f=${f#/proc/}; left="$left ${f%/status}"
done
"""

# Kill every process of uid $UID_ (as that uid: `kill -1` reaches exactly those), in rounds
# until none is left; exit 1 naming the survivors.
_STOP_UID = (
    "for _ in $(seq 50); do "
    'setpriv --reuid="$UID_" --regid="$UID_" --clear-groups -- '
    "bash --noprofile --norc -c 'kill -9 -1' 2>/dev/null; "
    + _LIST_UID
    + '[ -z "$left" ] && exit 0; sleep 0.1; done; echo "left:$left"; exit 1'
)

# Start the slot's pid namespace: `unshare` (the holder) forks its init, a shell that reaps
# what is reparented to it; prints "init namespace" (the init's host pid and the id of its
# pid namespace). `--kill-child`: the init dies with the holder. The harness keeps these:
# nothing the slot writes is read back.
_START_PIDNS = r"""
command -v unshare >/dev/null && command -v nsenter >/dev/null || {
  echo "the host has no unshare/nsenter (util-linux)" >&2; exit 3; }
setsid unshare --pid --fork --mount-proc --kill-child -- \
  bash --noprofile --norc -c 'while :; do sleep 3600; done' </dev/null >/dev/null 2>&1 &
h=$!
ours=$(readlink /proc/$$/ns/pid)
for _ in $(seq 200); do
  c=$(cat /proc/$h/task/$h/children 2>/dev/null); c=${c%% *}
  ns=$(readlink "/proc/$c/ns/pid" 2>/dev/null)
  [ -n "$c" ] && [ -n "$ns" ] && [ "$ns" != "$ours" ] && { echo "$c $ns"; exit 0; }
  kill -0 $h 2>/dev/null || break
  sleep 0.05
done
echo "unshare --pid failed (no CAP_SYS_ADMIN here?)" >&2; kill -9 $h 2>/dev/null; exit 4
"""

# Kill the namespace's init: the kernel kills everything in it. Only while $INIT_ is still
# that init (its namespace is $NS_; the file stays open on fd 9, so a recycled pid is never
# signalled); then wait until no live process is left in that namespace.
_STOP_PIDNS = r"""
[ "$(readlink "/proc/$INIT_/ns/pid" 2>/dev/null)" = "$NS_" ] || exit 0  # gone already
exec 9< "/proc/$INIT_/ns/pid" || exit 0
[ "$(readlink /proc/self/fd/9)" = "$NS_" ] || exit 0
[ "/proc/$INIT_/ns/pid" -ef /proc/self/fd/9 ] && kill -9 "$INIT_" 2>/dev/null
for _ in $(seq 100); do
  left=
  for d in /proc/[0-9]*; do
    [ "$d/ns/pid" -ef /proc/self/fd/9 ] 2>/dev/null || continue
    read -r stat < "$d/stat" 2>/dev/null || continue
    case ${stat##*) } in Z*|X*) continue ;; esac  # dead, waiting to be reaped
    left="$left ${d#/proc/}"
  done
  [ -z "$left" ] && exit 0
  sleep 0.1
done
echo "left:$left"; exit 1
"""


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
        self.jail: Jail | None = None  # set by setup()
        self.uid: int | None = None  # the slot's own uid (jail "uid")
        self._ns: tuple[int, str] | None = None  # (init's host pid, namespace id): "pidns"

    @property
    def own_host(self) -> bool:
        """The host is this slot's alone (its workdir is not inside the slot folder)."""
        return not (self.workdir == self.root or self.workdir.startswith(self.root + "/"))

    async def setup(self) -> None:
        """Make the slot's folders (its workdir starts empty or as the image left it) and
        its jail: a pid namespace on a host of its own, else its own uid."""
        q = shlex.quote
        script = f"mkdir -p {q(self.workdir)} {q(self.root)}/home {q(self.root)}/tmp"
        code, _, err = await self._run(script, None, 60)
        if code != 0:
            raise SandboxError(
                f"could not prepare slot {self.root}: {err.decode(errors='replace')}"
            )
        if self.own_host:
            code, out, err = await self._run(_START_PIDNS, None, 60)
            fields = out.decode(errors="replace").split()
            if code == 0 and len(fields) == 2 and fields[0].isdigit():
                self._ns = (int(fields[0]), fields[1])
                self.jail = "pidns"
                return
            log.warning(
                "no pid namespace for slot %s (%s): it runs as its own uid, not as root",
                self.root, err.decode(errors="replace").strip() or f"exit {code}",
            )  # fmt: skip
        await self._setup_uid()

    async def _setup_uid(self) -> None:
        """Pick a uid no process of the host runs as, and check the host can run as it."""
        start = int(hashlib.sha256(self.token.encode()).hexdigest()[:8], 16)
        for attempt in range(8):
            uid = UID_BASE + (start + attempt * 7919) % UID_SPAN
            script = (
                '[ "$(id -u)" = 0 ] || { echo "the host runs scripts as $(id -un), not '
                'root" >&2; exit 3; }; '
                f"UID_={uid}; {_LIST_UID}"
                f'[ -n "$left" ] && exit {_UID_TAKEN_EXIT}; '
                f"{_setpriv(uid)} true"
            )
            code, _, err = await self._run(script, None, 120)
            if code == _UID_TAKEN_EXIT:
                continue
            if code != 0:
                raise ConfigError(
                    f"slot {self.root} cannot run as a uid of its own: "
                    f"{err.decode(errors='replace').strip() or f'exit {code}'}. Slots on "
                    "Modal or Nomad need the host to run scripts as root, with util-linux "
                    "(setpriv, unshare, nsenter) in its image"
                )
            self.uid = uid
            self.jail = "uid"
            return
        raise SandboxError(f"no free uid for slot {self.root} after 8 tries")

    def _as_slot(self, run: str) -> str:
        """`run` (a command line) in the slot's jail."""
        if self.jail == "uid" and self.uid is not None:
            return f"{_setpriv(self.uid)} {run}"
        return run

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
            if self.jail == "uid" and not fresh:
                raise SandboxError(
                    f"a slot on a shared host runs as its own uid: exec(user={user!r}) is "
                    "not available (use one slot per host)"
                )
            run = f"runuser -u {shlex.quote(user)} -- {run}"
        if not fresh:  # the agent's: in the slot's jail (fresh ones are the harness's)
            run = self._as_slot(run)
        # Output goes to files first: a background process the command leaves must not hold
        # the call's pipes open (the call would wait for it). Their folder is root's (mode
        # 700, made by mktemp -d), out of reach of a slot that runs as its own uid.
        stdin_from = "" if stdin is not None else " </dev/null"
        script = (
            f"cd -- {directory} || exit 126; t=$(mktemp -d) || exit 125; o=$t/o; e=$t/e; "
            f"env -i {self._envs(env)} timeout -k 2 {limit:g} {run} "
            f'>"$o" 2>"$e"{stdin_from}; r=$?; cat "$o"; cat "$e" >&2; rm -rf "$t"; exit $r'
        )
        if self._ns is not None and not fresh:  # into the slot's pid namespace
            script = (
                f"exec nsenter --target {self._ns[0]} --pid --mount -- "
                f"bash --noprofile --norc -c {shlex.quote(script)}"
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
        """Kill every process of the slot: its jail's (nothing a process changes about
        itself takes it out), then by token (the harness's fresh processes)."""
        self.stopped = True
        await self._stop_jail()
        await self._run(_kill_token(self.token), None, 60)

    async def _stop_jail(self) -> None:
        """Kill the slot's jail: its pid namespace (once: then it is gone) or its uid's
        processes; `TamperError` when some survive."""
        if self.jail == "pidns" and self._ns is not None:
            init, ns = self._ns
            script = f"INIT_={init}; NS_={shlex.quote(ns)}; {_STOP_PIDNS}"
        elif self.jail == "uid":
            script = f"UID_={self.uid}; {_STOP_UID}"
        else:
            return
        code, out, err = await self._run(script, None, 120)
        if code != 0:
            text = (out + err).decode(errors="replace").strip()
            raise TamperError(f"processes of slot {self.root} survived stopping: {text[-300:]}")
        self._ns = None  # its pid may be another process's now

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
        where = self.resolve(path)
        full = shlex.quote(where)
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
        where = self.resolve(path)
        q = shlex.quote
        script = f"mkdir -p -- {q(posixpath.dirname(where))} && cat > {q(where)}"
        code, _, err = await self._run(script, data, 600)
        if code != 0:
            raise SandboxError(f"writing {path} failed: {err.decode(errors='replace')}")

    async def upload(self, local: Path, remote: str) -> None:
        if not local.is_dir():
            await self.write_file(remote, await asyncio.to_thread(local.read_bytes))
            return
        data = await asyncio.to_thread(_tar, local)
        where = self.resolve(remote)
        full = shlex.quote(where)
        script = f"mkdir -p -- {full} && tar -x -C {full}"
        code, _, err = await self._run(script, data, 600)
        if code != 0:
            raise SandboxError(f"upload to {remote} failed: {err.decode(errors='replace')}")

    async def download(self, remote: str, local: Path) -> None:
        if local.exists() or local.is_symlink():
            raise FileExistsError(f"already exists: {local}")
        where = self.resolve(remote)
        full = shlex.quote(where)
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
            await self._stop_jail()
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
