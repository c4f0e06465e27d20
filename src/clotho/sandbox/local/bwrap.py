"""The local backend: a persistent bash inside bubblewrap.

Namespaces: user, pid, ipc, uts, net and mount, with every capability dropped (`--cap-drop
ALL`): the sandbox's uid 0 cannot mount, ptrace its init or chown. As root on the host the
sandbox runs as its own unprivileged host uid (`state.SANDBOX_UID_BASE` + n, claimed with the
state folder; `setpriv` drops to it right before bwrap), so root-only host files (`/etc/shadow`,
a task's tests in a 0700 folder) are as closed to it as to any user.

What the sandbox sees of the host is an allow-list (`_host_view`), never the host's root minus
some folders: the system trees (/usr, and /bin, /sbin, /lib* as the host has them, links or
read-only binds), an /etc of its own (`_make_etc`), /dev, /proc, private tmpfs at /tmp, /run,
/root, /home and /var/tmp, an empty /opt, the workspace (a host folder bound at `workdir`) and
a transfer folder bound at `XFER_MOUNT` that carries files in and out, used on the host only
through a directory fd and never following a link (`transfer.XferDir`). Nothing else of the
host exists inside: not its task folders, run folders, checkouts, virtualenvs, /work, /srv,
/var, /mnt or /opt, whoever may read them on the host. As root (`root='overlay'`), `/` is a
folder of the state folder, root's and sticky (the sandbox adds entries, e.g. /logs, but
cannot remove or replace /lib64 or /bin), /usr/local is an overlay mounted in a private mount
namespace whose upper layer (in the state folder) is the sandbox uid's, and /opt is the
sandbox's: its root may install there; nothing is mounted on the host. In `root='ro'` the
root is bubblewrap's tmpfs, remounted read-only once the binds are in place.

Every sandbox process lives in the sandbox's freezer cgroup (`cgroups.py`, as root), so
`stop_agent` freezes them all at once; `exec_fresh` runs `nsenter` into namespaces whose fds
were taken from the sandbox's init before the agent ran; `digests` reads files through the
init's root directory fd, from the host. With `network`, the sandbox keeps its own network
namespace (its own loopback) and reaches out through slirp4netns running as the sandbox's uid,
which firewall rules keep off every address of the host itself, link-local and cloud metadata
addresses (`netguard.py`); without root there is no such uid, and `network` is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import shlex
import shutil
import signal
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

from clotho.errors import ConfigError, SandboxError
from clotho.sandbox.base import ExecOptions, ExecResult, FreshCall, PathChange, SocketPlace
from clotho.sandbox.config import base_env
from clotho.sandbox.host import proctree
from clotho.sandbox.host.cgroups import AGENT, SandboxCgroups
from clotho.sandbox.host.state import (
    SANDBOX_UID_BASE,
    SANDBOX_UID_COUNT,
    remove_state_dir,
    state_dir_until_started,
    state_uid,
)
from clotho.sandbox.local.config import LocalSandboxConfig
from clotho.sandbox.local.fresh import digests_at, run_fresh_call
from clotho.sandbox.local.limits import SandboxLimits
from clotho.sandbox.local.netguard import guard_host_addresses
from clotho.sandbox.shell import PersistentShell
from clotho.sandbox.shell_backed import FolderTransferSandbox
from clotho.sandbox.transfer import (
    XFER_MOUNT,
    XferDir,
)

# The host's system trees, as the host has them (a folder bound read-only, or a link such as
# /bin -> usr/bin on a merged-/usr host): the programs, libraries and their data. /usr/local
# included: on a host whose python is /usr/local/bin/python3 the tests run with it.
_SYSTEM_TREES = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Private, empty at start (tmpfs): nothing of the host's.
_PRIVATE_DIRS = ("tmp", "run", "root", "home", "var/tmp")
_RO_EXTRA_DIRS = ("/logs", "/tests", "/solution")
# As root, the overlay the sandbox's root may install into (its upper layer is the sandbox's).
_USR_LOCAL = "/usr/local"
_HOSTNAME = "clotho"
# /etc is the sandbox's own, not the host's: what programs under /usr read to start and behave
# as packaged, taken from the host where it has them (names or fnmatch patterns; files are
# copied, folders bound read-only: a bind costs a start 1-2 ms on a busy host). Never what an
# administrator wrote about this host or its users (hosts, passwd, environment, profile,
# pip.conf, npmrc, gitconfig, apt sources with their tokens, ssh, service configs), which the
# whole /etc would have shown. Tools that configure the system (ldconfig, update-ca-
# certificates, apt) find nothing to configure: the sandbox cannot change the system anyway.
_ETC_FROM_HOST = (
    "ld.so.cache",  # the dynamic linker's (never ld.so.preload)
    "ssl", "pki", "crypto-policies",  # TLS roots and OpenSSL's configuration
    "alternatives",  # Debian: /usr/bin/awk -> /etc/alternatives/awk -> /usr/bin/mawk
    "protocols", "services",  # getprotobyname("tcp"), getservbyname("http")
    "localtime", "timezone", "locale.alias", "locale.conf",
    "os-release", "debian_version", "lsb-release", "redhat-release", "system-release",
    "alpine-release",
    # configuration that packages ship for their programs
    "python3", "python3.*", "perl", "java-*", "fonts", "magic", "magic.mime", "mime.types",
    "inputrc", "shells", "mtab",
)  # fmt: skip
# Written for every sandbox: who its users are (root, and nobody for host-owned files, which
# its user namespace does not map), its own name, and how names are looked up.
_ETC_WRITTEN = {
    "passwd": "root:x:0:0:root:/root:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "group": "root:x:0:\nnogroup:x:65534:\n",
    "hostname": f"{_HOSTNAME}\n",
    "hosts": f"127.0.0.1\tlocalhost {_HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
    "networks: files\nprotocols: files\nservices: files\n",
}
_NAMESPACES = (("user", "user"), ("mount", "mnt"), ("pid", "pid"), ("net", "net"),
               ("ipc", "ipc"), ("uts", "uts"))  # fmt: skip

INSTALL_HINT = (
    "bubblewrap (bwrap) is not installed; the local sandbox refuses to run without it. "
    "Install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`, "
    "or pass --sandbox unsafe-local to run commands on the host without isolation."
)
NETWORK_ROOT_HINT = (
    "network=True on the local backend needs root: the guard that keeps a networked sandbox "
    "off the host's own addresses, the cluster and the cloud's metadata is a firewall rule on "
    "the sandbox's own uid, which only root can give it. Run as root, or without --network"
)
SLIRP_HINT = (
    "network=True on the local backend needs slirp4netns (the sandbox keeps its own network "
    "namespace and never sees the host's loopback): apt-get install slirp4netns"
)


# bwrap binds recursively: a host mount that comes or goes meanwhile (a container starting or
# stopping on this host) fails the copy of the mount tree with this; trying again succeeds.
_MOUNT_RACE = "Unable to apply mount flags"
_START_ATTEMPTS = 3


def ro_root_args(only: set[str]) -> list[str]:
    """bwrap arguments binding the host's top-level entries named in `only` read-only (the
    bubblewrap-per-command baseline of `bench`; the sandbox's own view is `_host_view`)."""
    args: list[str] = []
    for name in sorted(only):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _system_trees() -> list[tuple[str, str | None]]:
    """The host's `_SYSTEM_TREES` that exist: (name, the link's text, or None for a folder)."""
    found: list[tuple[str, str | None]] = []
    for name in _SYSTEM_TREES:
        path = f"/{name}"
        if os.path.islink(path):
            found.append((name, os.readlink(path)))
        elif os.path.isdir(path):
            found.append((name, None))
    return found


def _mkdir(path: Path, mode: int = 0o755) -> None:
    path.mkdir()
    os.chmod(path, mode)  # whatever the harness's umask


def _make_etc(etc: Path, *, network: bool) -> list[str]:
    """The sandbox's /etc, made in the state folder: `_ETC_WRITTEN` written, the host's files
    and links of `_ETC_FROM_HOST` copied, and an empty mount point for each of its folders;
    returns the names to bind read-only from the host's /etc. As root the folder is root's,
    so the sandbox's uid cannot add to it (an /etc/ld.so.preload of its own would load into
    every program the tests run)."""
    _mkdir(etc)
    binds: list[str] = []
    for name in sorted(os.listdir("/etc")):
        if name in _ETC_WRITTEN or not any(fnmatch.fnmatchcase(name, p) for p in _ETC_FROM_HOST):
            continue
        host = Path("/etc", name)
        if host.is_symlink():  # resolved inside the sandbox, like every link there
            os.symlink(os.readlink(host), etc / name)
        elif host.is_dir():
            _mkdir(etc / name)
            binds.append(name)
        elif host.is_file():
            with contextlib.suppress(OSError):  # one the harness cannot read is left out
                shutil.copyfile(host, etc / name)
                os.chmod(etc / name, 0o644)
    for name, text in _ETC_WRITTEN.items():
        (etc / name).write_text(text)
        os.chmod(etc / name, 0o644)
    if network:  # the mount point of the sandbox's resolv.conf
        (etc / "resolv.conf").touch(0o644)
    return binds


def _make_root(root: Path, trees: list[tuple[str, str | None]], uid: int | None) -> None:
    """`/` of an overlay-mode sandbox: a folder in the state folder holding the links of the
    system trees and the mount points, all root's; the folder itself is sticky and open to
    all, so the sandbox may add entries (/logs, /tests, a folder of its own) but not remove
    or rename the harness's: a /lib64 it replaced would give every program the verifier runs
    its dynamic loader. /opt is a mount point too: `opt` of the state folder, the sandbox
    uid's own (empty) folder, is bound there."""
    _mkdir(root)
    for name, link in trees:
        if link is not None:
            os.symlink(link, root / name)
        else:
            _mkdir(root / name)
    for name in ("etc", "dev", "proc", "var", *_PRIVATE_DIRS, "opt"):
        _mkdir(root / name)
    _mkdir(root.parent / "opt")
    if uid is not None:
        os.chown(root.parent / "opt", uid, uid)
    os.chmod(root, 0o1777)


def _usr_local_is_folder() -> bool:
    return os.path.isdir(_USR_LOCAL) and not os.path.islink(_USR_LOCAL)


def _prepare_upper(upper: Path, uid: int) -> None:
    """Make the /usr/local overlay's upper root, and a folder for each folder of the host's
    /usr/local (bin, lib, ...), the sandbox uid's: its root may install there (pip's scripts
    in /usr/local/bin); deeper folders keep the host's owner. Only folders anyone may list
    and enter: a folder the host closed (a task's tests in a 0700 folder) stays root's, as
    its owner in the merged tree would be the sandbox's."""
    if _open_to_all(Path(_USR_LOCAL)):
        os.chown(upper, uid, uid)
    for child in sorted(Path(_USR_LOCAL).iterdir()):
        if child.is_dir() and not child.is_symlink() and _open_to_all(child):
            made = upper / child.name
            _mkdir(made, child.stat().st_mode & 0o7777)
            os.chown(made, uid, uid)


def _open_to_all(folder: Path) -> bool:
    return folder.stat().st_mode & 0o005 == 0o005


def _host_view(
    root_mode: str,
    seen: Path,
    trees: list[tuple[str, str | None]],
    etc_binds: list[str],
    usr_local: bool,
) -> list[str]:
    """bwrap arguments for everything the sandbox sees of the host (an allow-list), before
    its private folders, workspace and transfer folder."""
    args: list[str] = []
    if root_mode == "overlay":
        args += ["--bind", str(seen / "root"), "/"]  # `_make_root`: the links are in it
        for name, link in trees:
            if link is None:
                args += ["--ro-bind", f"/{name}", f"/{name}"]
        if usr_local:
            args += ["--bind", str(seen / "ovl" / "m"), _USR_LOCAL]
        # root's: writable to nobody in the sandbox, like the host's own /etc was
        args += ["--bind", str(seen / "etc"), "/etc", "--bind", str(seen / "opt"), "/opt"]
    else:
        for name, link in trees:
            if link is not None:
                args += ["--symlink", link, f"/{name}"]
            else:
                args += ["--ro-bind", f"/{name}", f"/{name}"]
        args += ["--ro-bind", str(seen / "etc"), "/etc", "--dir", "/opt"]
        for path in _RO_EXTRA_DIRS:
            args += ["--tmpfs", path]
    for name in etc_binds:
        args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


# As root, the state folder is seen at this path (a bind in the private mount namespace the
# root-side prefix makes) by bwrap, which runs as the sandbox's uid and could not pass the
# folder's parents when they are closed to it (a pytest tmp folder is 0700).
_STATE_VIEW = "/run/clotho-state"
# Likewise each read-only mount's source (`config.ro_mounts`), at this path and its index.
_RO_VIEW = "/run/clotho-ro-"


def bwrap_argv(
    config: LocalSandboxConfig,
    root_mode: str,
    state: Path,
    uid: int | None = None,
    cgroups: SandboxCgroups | None = None,
) -> list[str]:
    seen = Path(_STATE_VIEW) if uid is not None else state
    trees = _system_trees()
    usr_local = root_mode == "overlay" and ("usr", None) in trees and _usr_local_is_folder()
    etc_binds = _make_etc(state / "etc", network=config.network)
    if root_mode == "overlay":
        _make_root(state / "root", trees, uid)
    argv = ["bwrap", *_host_view(root_mode, seen, trees, etc_binds, usr_local)]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    for name in _PRIVATE_DIRS:
        argv += ["--tmpfs", f"/{name}"]
    argv += ["--bind", str(seen / "app"), config.workdir]
    argv += ["--bind", str(seen / "xfer"), XFER_MOUNT]
    for index, mount in enumerate(config.ro_mounts):  # as root: seen through the prefix's bind
        source = f"{_RO_VIEW}{index}" if uid is not None else mount.source
        argv += ["--ro-bind", source, mount.target]
    if config.network and os.path.isfile("/etc/resolv.conf"):
        argv += ["--ro-bind", str(seen / "resolv.conf"), "/etc/resolv.conf"]
    if root_mode == "ro":  # last: every mount point is made; then nothing new at `/`
        argv += ["--remount-ro", "/"]
    # The network namespace is always the sandbox's own: with `network`, slirp4netns connects it.
    argv += ["--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0", "--cap-drop", "ALL"]
    argv += ["--hostname", "clotho", "--die-with-parent", "--new-session"]
    if uid is not None:  # named in bwrap's argv (set, then unset) so `remove_local` finds it
        argv += ["--setenv", "CLOTHO_STATE", str(state), "--unsetenv", "CLOTHO_STATE"]
    argv += ["--chdir", config.workdir, "bash", "--noprofile", "--norc"]
    steps: list[str] = []
    if usr_local:
        # A private mount namespace holds the overlay, so nothing is mounted on the host; its
        # upper layer lives in the sandbox's state folder and goes away with it. (A Python
        # preexec_fn would do the mounts without the extra processes, but it forces fork()
        # instead of vfork(), which costs 15 ms from a 300 MB parent.) The mount is root's;
        # bwrap then runs as the sandbox's uid.
        ovl = state / "ovl"
        for sub in ("u", "w", "m"):
            (ovl / sub).mkdir(parents=True)
        if uid is not None:
            _prepare_upper(ovl / "u", uid)
        steps.append(
            f'mount -t overlay clotho -o "lowerdir={_USR_LOCAL},upperdir=$0/ovl/u,'
            'workdir=$0/ovl/w" "$0/ovl/m"'
        )
    if uid is not None:
        steps += [
            f"mount -t tmpfs -o mode=0755 clotho {_STATE_VIEW.rsplit('/', 1)[0]}",
            f"mkdir {_STATE_VIEW}",
            f'mount --rbind "$0" {_STATE_VIEW}',
        ]
        for index, mount in enumerate(config.ro_mounts):
            # bwrap, as the sandbox's uid, may not pass the source's parents (~root is 0700)
            steps.append(f"mkdir {_RO_VIEW}{index} && mount --rbind {shlex.quote(mount.source)} "
                         f"{_RO_VIEW}{index}")  # fmt: skip
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    if steps:
        script = " && ".join([*steps, 'exec "$@"'])
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                "/bin/sh", "-c", script, str(state), *argv]  # fmt: skip
    if cgroups is not None:
        argv = [*cgroups.enter_argv(), *argv]
    return argv


def resolve_root_mode(config: LocalSandboxConfig) -> str:
    if config.root != "auto":
        if config.root == "overlay" and os.geteuid() != 0:
            raise SandboxError("root='overlay' needs root privileges; use root='ro'")
        return config.root
    return "overlay" if os.geteuid() == 0 and shutil.which("unshare") else "ro"


def _init_pid(outer: int) -> int:
    """The sandbox's pid 1 (bubblewrap's init), a child of the outer bwrap process."""
    for pid in proctree.children(outer):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == "1":
                    return pid
    raise SandboxError("the sandbox's init process was not found")


class BwrapSandbox(FolderTransferSandbox):
    limits: SandboxLimits  # memory, processes, CPU, storage (limits.py)
    _xfer: XferDir  # files cross `<state>/xfer`, bound at `XFER_MOUNT` (`FolderTransferSandbox`)
    _xfer_inner = XFER_MOUNT

    def __init__(self, config: LocalSandboxConfig, state: Path, shell: PersistentShell,
                 labels: dict[str, str], *, uid: int | None = None,
                 cgroups: SandboxCgroups | None = None) -> None:  # fmt: skip
        super().__init__(shell, config.workdir, labels)
        self.config = config
        self.state = state
        self.uid = uid
        self._cgroups = cgroups
        self._xfer = XferDir(state / "xfer")
        self._ns_fds: dict[str, int] = {}
        self._root_fd = -1
        self._keep: set[int] = set()
        self._init = 0
        self._slirp: asyncio.subprocess.Process | None = None
        self._slirp_exit_fd = -1

    @classmethod
    async def create(
        cls, config: LocalSandboxConfig, labels: dict[str, str] | None = None
    ) -> BwrapSandbox:
        if shutil.which("bwrap") is None:
            raise SandboxError(INSTALL_HINT)
        if config.network and os.geteuid() != 0:
            raise ConfigError(NETWORK_ROOT_HINT)  # fail closed: never a network unguarded
        if config.network and shutil.which("slirp4netns") is None:
            raise SandboxError(SLIRP_HINT)
        labels = dict(labels or {})
        root_mode = resolve_root_mode(config)
        for _ in range(_START_ATTEMPTS - 1):
            try:
                return await cls._start(config, root_mode, labels)
            except SandboxError as exc:
                if _MOUNT_RACE not in str(exc):
                    raise
        return await cls._start(config, root_mode, labels)

    @classmethod
    async def _start(
        cls, config: LocalSandboxConfig, root_mode: str, labels: dict[str, str]
    ) -> BwrapSandbox:
        as_root = os.geteuid() == 0
        with state_dir_until_started(config.state_dir, labels, claim_uid=as_root) as state:
            uid = state_uid(state)
            for name in ("app", "xfer"):
                (state / name).mkdir(mode=0o700)
                if uid is not None:
                    os.chown(state / name, uid, uid)
            if config.network:
                (state / "resolv.conf").write_text("nameserver 10.0.2.3\n")
                if uid is None:  # fail closed: no network without the host guard
                    raise ConfigError(NETWORK_ROOT_HINT)
                await guard_host_addresses(SANDBOX_UID_BASE, SANDBOX_UID_COUNT)
            # Resource limits (limits.py): the freezer's cgroups get the memory, pids (and cpu)
            # controllers and their limits before the shell starts; RLIMIT_FSIZE in the argv.
            # In a thread: the state folder's own file system is mounted there (quota.py).
            limits = await SandboxLimits.make(config, state, ("freezer",) if as_root else ())
            cgroups = limits.cgroups
            shell = PersistentShell(
                limits.wrap(bwrap_argv(config, root_mode, state, uid, cgroups)),
                env=base_env("/root", config.env),
                max_output_bytes=config.max_output_bytes,
                session=config.shell == "session",
            )
            await shell.start()
            sandbox = cls(config, state, shell, labels, uid=uid, cgroups=cgroups)
            sandbox.limits = limits
            limits.watch(shell.pid)  # the storage quota, until close
            try:
                await sandbox._attach()
            except BaseException:
                await sandbox.close()
                raise
        return sandbox

    async def exec(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        """A limit the command hit is a note on its stderr, or LimitExceeded when it ended
        the sandbox (`SandboxLimits.guard`)."""
        self._check_live()  # a stopped or closed sandbox says so, whatever limit it hit
        return await self.limits.guard(self._exec_while_running(cmd, **options))

    async def _exec_while_running(self, cmd: str, **options: Unpack[ExecOptions]) -> ExecResult:
        """Only while bubblewrap itself runs. Killed from outside (the OOM killer), its
        sandbox dies with it, but the shell inside may answer once more before the kernel
        gets to it: a health check must not hand out a sandbox that is ending."""
        if (outer := self._shell.pid) is not None and not proctree.running(outer):
            raise SandboxError("the sandbox's bubblewrap has ended (killed from outside?)")
        return await super().exec(cmd, **options)

    async def _transfer(self, script: str, what: str, limit: int = 0) -> ExecResult:
        self._check_live()
        return await self.limits.guard(super()._transfer(script, what, limit))

    async def _attach(self) -> None:
        """Take the init's namespaces and root before the agent runs: `exec_fresh` and
        `digests` use these fds, never a pid the agent could make someone else's."""
        outer = self._shell.pid
        assert outer is not None
        self._init = _init_pid(outer)
        self._keep = {outer, self._init}
        for _, ns in _NAMESPACES:
            self._ns_fds[ns] = os.open(f"/proc/{self._init}/ns/{ns}", os.O_RDONLY | os.O_CLOEXEC)
        self._root_fd = os.open(
            f"/proc/{self._init}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
        )
        if self.config.network:
            await self._start_network()

    async def _start_network(self) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, self._slirp_exit_fd = os.pipe()
        os.set_inheritable(self._slirp_exit_fd, False)
        user, net = self._ns_fds["user"], self._ns_fds["net"]
        argv = [
            "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
            f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", f"--userns-path=/proc/self/fd/{user}",
            "--netns-type=path", f"/proc/self/fd/{net}", "tap0",
        ]  # fmt: skip
        if self.uid is not None:
            # Root, to open /dev/net/tun (0600 on some hosts), but with the sandbox's gid: its
            # sockets match the host guard's gid rule. --enable-sandbox drops its capabilities.
            # It also pivots into a tmpfs and detaches the old root, having made only `/`
            # private: mounts below that are shared with the host (dockerd makes its root a
            # shared mount) would be unmounted on the host too, every container's root with
            # them. In a mount namespace of its own made private throughout, they are not.
            argv = ["unshare", "--mount", "--propagation", "private", "--",
                    "setpriv", f"--regid={self.uid}", "--clear-groups", "--", argv[0],
                    "--enable-sandbox", "--enable-seccomp", *argv[1:]]  # fmt: skip
        try:
            self._slirp = await asyncio.create_subprocess_exec(
                *argv,
                pass_fds=(ready_w, exit_r, user, net),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(ready_w)
            os.close(exit_r)
        try:
            loop = asyncio.get_running_loop()
            ready = await asyncio.wait_for(loop.run_in_executor(None, os.read, ready_r, 1), 10)
        except TimeoutError:
            ready = b""
        finally:
            os.close(ready_r)
        if ready != b"1":
            raise SandboxError("slirp4netns did not bring the sandbox's network up")

    # -- verification -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or self._root_fd < 0:
            raise SandboxError("the sandbox is closed")

    async def _exec_fresh(self, call: FreshCall) -> ExecResult:
        """`nsenter` into the sandbox's namespaces (fds taken before the agent ran) and run a
        fresh `bash` as the sandbox's root, in its own cgroup: whatever it starts ends when it
        returns or times out."""
        self._check_open()
        ns_args = [f"--{flag}=/proc/self/fd/{self._ns_fds[ns]}" for flag, ns in _NAMESPACES]
        root = f"/proc/self/fd/{self._root_fd}"
        cwd = shlex.quote(self.resolve(call.cwd or self.workdir))
        script = f"cd -- {cwd} || exit 126\n{call.cmd}"
        argv = ["nsenter", *ns_args, f"--root={root}", f"--wd={root}", "--",
                "bash", "--noprofile", "--norc", "-c", script]  # fmt: skip
        return await run_fresh_call(
            argv,
            call,
            cgroups=self._cgroups,
            env=base_env("/root", {**self.config.env, **(call.env or {})}),
            pass_fds=[*self._ns_fds.values(), self._root_fd],
        )

    async def stop_agent(self) -> None:
        """Freeze the sandbox's cgroup (atomic: nothing forks past it), SIGKILL all but the
        outer bwrap and the sandbox's init, and leave it frozen: what the agent left never runs
        again, and the namespaces stay enterable for `exec_fresh`. Processes `exec_fresh`
        started are killed too. Without cgroups (not root): SIGSTOP every process of the
        sandbox's pid namespace but its init, until none is left running."""
        self._check_open()
        self._stopped = True
        if self._cgroups is not None:
            await asyncio.to_thread(self._freeze_all, self._cgroups)
        else:
            await asyncio.to_thread(self._stop_by_signals)

    def _freeze_all(self, cgroups: SandboxCgroups) -> None:
        if not cgroups.freeze_and_kill(AGENT, keep=self._keep):
            raise SandboxError("the sandbox's processes could not be frozen")
        for sub in cgroups.subgroups():
            if sub != AGENT:
                cgroups.freeze_and_kill(sub)
                cgroups.thaw(sub)

    def _stop_by_signals(self) -> None:
        target = os.readlink(f"/proc/{self._init}/ns/pid")
        for _ in range(1000):
            running = 0
            for entry in os.listdir("/proc"):
                if not entry.isdigit() or int(entry) in self._keep:
                    continue
                try:
                    if os.readlink(f"/proc/{entry}/ns/pid") != target:
                        continue
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        state = f.read().rsplit(b")", 1)[1].split()[0]
                except OSError:
                    continue
                if state not in (b"T", b"t", b"Z", b"X"):
                    running += 1
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(entry), signal.SIGSTOP)
            if not running:
                return
        raise SandboxError("the sandbox's processes could not be stopped")

    async def digests(self, paths: Sequence[str]) -> dict[str, str | None]:
        """Hashed from the host through the init's root directory fd: exactly the file system
        the sandbox sees (overlay, tmpfs, binds), each path resolved as inside the sandbox,
        never leaving it, nothing run inside."""
        self._check_open()
        return await asyncio.to_thread(digests_at, self._root_fd, list(paths))

    def socket_place(self) -> SocketPlace:
        """The transfer folder (`XFER_MOUNT`): the socket is given to the sandbox's uid."""
        return SocketPlace(self.state / "xfer", XFER_MOUNT, owner_uid=self.uid)

    async def changed_paths(self) -> list[PathChange] | None:
        """Walked from the host with `scandir`/`lstat`, never following a link: everything in
        the places the sandbox can write (its workdir, transfer folder, private tmpfs folders;
        in `ro` mode also /logs, /tests and /solution, which are tmpfs; as root also the new
        entries of `/`, /opt and /dev) is `added` (they all start empty: the workspace files
        the harness uploaded are listed too), and /usr/local's overlay upper layer gives its
        additions, changes and removals (whiteouts). Nothing else is writable. None when the
        walk cannot finish (deeper than `_WALK_DEPTH` or more than `_WALK_MAX` entries):
        verification then searches the sandbox itself."""
        self._check_open()
        return await asyncio.to_thread(self._walk_changes)

    def _walk_changes(self) -> list[PathChange] | None:
        overlay = (self.state / "root").is_dir()  # `_make_root` made `/` (root='overlay')
        roots = [f"/{d}" for d in _PRIVATE_DIRS] + [self.workdir, XFER_MOUNT]
        roots += ["/opt", "/dev"] if overlay else list(_RO_EXTRA_DIRS)
        found: list[PathChange] = []
        try:
            if overlay:  # entries the sandbox added to `/` (sticky: it cannot remove ours)
                ours = {n for n, _ in _system_trees()} | {"etc", "dev", "proc", "var", "opt"}
                ours |= {r.strip("/").split("/")[0] for r in roots}
                top = _open_dir_at(self._root_fd, "/")
                assert top is not None
                try:
                    with os.scandir(top) as entries:
                        for entry in entries:
                            if entry.name not in ours:
                                _walk_entry(top, entry, "", found)
                finally:
                    os.close(top)
                upper = self.state / "ovl" / "u"
                if upper.is_dir() and not upper.is_symlink():
                    _walk_upper(upper, _USR_LOCAL, found)
            kept = sorted(set(roots))
            for root in kept:
                if any(root.startswith(other + "/") for other in kept):
                    continue  # walked with the folder it is in
                fd = _open_dir_at(self._root_fd, root)
                if fd is None:
                    continue
                try:
                    _walk_fd(
                        fd, root.rstrip("/"), found, 0, skip=_DEV_MADE if root == "/dev" else ()
                    )
                finally:
                    os.close(fd)
        except _WalkTooBig:
            return None
        return found

    # -- teardown ------------------------------------------------------------------------------

    async def _end_processes(self) -> None:
        if self._cgroups is not None:
            await asyncio.to_thread(self._cgroups.destroy)
        elif self._init:
            await asyncio.to_thread(self._kill_namespace)
        if self._slirp is not None:
            with contextlib.suppress(ProcessLookupError):
                self._slirp.kill()
            await self._slirp.wait()

    def _kill_namespace(self) -> None:
        """Without cgroups: SIGKILL every process of the sandbox's pid namespace (stopped ones
        too, which the shell's own close would not find once reparented)."""
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{self._init}/ns/pid")
            for entry in os.listdir("/proc"):
                with contextlib.suppress(OSError):
                    if entry.isdigit() and os.readlink(f"/proc/{entry}/ns/pid") == target:
                        os.kill(int(entry), signal.SIGKILL)

    async def _release(self) -> None:
        for fd in [*self._ns_fds.values(), self._root_fd, self._slirp_exit_fd]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._ns_fds, self._root_fd, self._slirp_exit_fd = {}, -1, -1
        self._xfer.close()
        await self.limits.close()  # the storage watch, and cgroups the freezer's close left
        await asyncio.to_thread(remove_state_dir, self.state)


# -- what changed: walked from the host, no link followed ------------------------------------

_WALK_DEPTH = 256
_WALK_MAX = 1_000_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What bubblewrap's --dev puts in /dev (the sandbox's root may add to it).
_DEV_MADE = ("null", "zero", "full", "random", "urandom", "tty", "pts", "ptmx", "shm", "fd",
             "stdin", "stdout", "stderr", "core", "console", "mqueue")  # fmt: skip


class _WalkTooBig(Exception):
    """The tree is deeper or larger than a walk should go: the backend cannot tell."""


def _open_dir_at(root_fd: int, path: str) -> int | None:
    """A directory fd for the sandbox path `path` under `root_fd`, no component a link."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=root_fd)  # readable (`root_fd` is O_PATH)
    try:
        for name in [p for p in path.split("/") if p]:
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                return None
            os.close(fd)
            fd = sub
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def _walk_entry(dir_fd: int, entry: os.DirEntry, prefix: str, found: list[PathChange]) -> None:
    path = f"{prefix}/{entry.name}"
    link = entry.is_symlink()
    found.append(PathChange(path, "added", link))
    if len(found) > _WALK_MAX:
        raise _WalkTooBig
    if link or not entry.is_dir(follow_symlinks=False):
        return
    try:
        sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return  # gone, or replaced by a non-folder meanwhile (nothing runs: it cannot be)
    try:
        _walk_fd(sub, path, found, path.count("/"))
    finally:
        os.close(sub)


def _walk_fd(
    fd: int, prefix: str, found: list[PathChange], depth: int, skip: Sequence[str] = ()
) -> None:
    """Every entry under the directory `fd` (its sandbox path `prefix`), as `added`."""
    if depth > _WALK_DEPTH:
        raise _WalkTooBig
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name not in skip:
                _walk_entry(fd, entry, prefix, found)


def _walk_upper(upper: Path, mount: str, found: list[PathChange]) -> None:
    """An overlay's upper layer: a whiteout (char device 0/0) is a removal; an entry the
    lower layer (the host's `mount`) has is a change; any other is an addition."""
    stack: list[tuple[Path, str]] = [(upper, mount)]
    while stack:
        folder, inside = stack.pop()
        if inside.count("/") > _WALK_DEPTH:
            raise _WalkTooBig
        with os.scandir(folder) as entries:
            for entry in entries:
                path = f"{inside}/{entry.name}"
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == 0:
                    found.append(PathChange(path, "removed", False))
                    continue
                lower = os.path.lexists(path)  # the host's own tree is the lower layer
                link = stat.S_ISLNK(info.st_mode)
                found.append(PathChange(path, "changed" if lower else "added", link))
                if len(found) > _WALK_MAX:
                    raise _WalkTooBig
                if stat.S_ISDIR(info.st_mode):
                    stack.append((Path(entry.path), path))
