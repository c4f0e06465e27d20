"""Where a slot lives inside its container, and the shell text that sets it up and tears it down.

Slot `k` of a container owns `/slots/k`: `app` (its workspace), `tmp`, `home`, `xfer` (file
transfer), and, when isolated, `vartmp`, `logs`, `tests`, `solution`. Without isolation the
slot's workdir is `/slots/k/app` and its neighbours are plain directories next to it. With
bubblewrap the slot runs as its own uid (`SLOT_UID_BASE + k`, uid 0 inside a user namespace)
and those directories are bound over the paths it expects (`/app`, `/tmp`, `/root`, ...) on a
read-only view of the container; `/slots` itself is hidden. Nothing here does I/O.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass

from clotho.sandbox.transfer import XFER_MOUNT

SLOT_ROOT = "/slots"
SLOT_UID_BASE = 40000
SLOT_ENV = "CLOTHO_SLOT"
# Paths an isolated slot writes, besides its workdir: private, each bound from the slot's folder.
_PRIVATE = {
    "/tmp": "tmp",
    "/var/tmp": "vartmp",
    "/root": "home",
    XFER_MOUNT: "xfer",
    "/logs": "logs",
    "/tests": "tests",
    "/solution": "solution",
}


@dataclass(frozen=True)
class SlotLayout:
    name: str  # the folder under /slots (the slot index, or "probe")
    uid: int
    workdir: str  # the configured workdir (as an isolated slot sees it)
    isolated: bool
    token: str  # in every process's environment (SLOT_ENV), so close can find them all
    # RLIMIT_NPROC of an isolated slot's processes, where it has no cgroup of its own: the
    # kernel counts it per uid (hence a uid no other container on the host uses), and the
    # user namespace bubblewrap makes caps it at this for good (`prlimit` as root first).
    nproc: int | None = None

    @property
    def dir(self) -> str:
        return f"{SLOT_ROOT}/{self.name}"

    @property
    def sandbox_workdir(self) -> str:
        """The workdir the slot's `Sandbox` reports: its own folder unless isolated."""
        return self.workdir if self.isolated else f"{self.dir}/app"

    @property
    def home(self) -> str:
        return "/root" if self.isolated else f"{self.dir}/home"

    @property
    def xfer_dir(self) -> str:
        """The transfer folder as the container (and the Engine API) sees it."""
        return f"{self.dir}/xfer"

    def binds(self) -> list[tuple[str, str]]:
        """(slot folder, path inside) for an isolated slot, outer paths bound first."""
        inside = {self.workdir: "app", **{p: s for p, s in _PRIVATE.items() if p != self.workdir}}
        pairs = [(f"{self.dir}/{sub}", path) for path, sub in inside.items()]
        return sorted(pairs, key=lambda pair: pair[1].count("/"))

    def subdirs(self) -> list[str]:
        names = ["app", "tmp", "home", "xfer"]
        if self.isolated:
            names += [sub for sub in _PRIVATE.values() if sub not in names]
        return [f"{self.dir}/{name}" for name in names]

    def env(self, base: dict[str, str]) -> dict[str, str]:
        env = {**base, SLOT_ENV: self.token}
        if not self.isolated:
            env.setdefault("TMPDIR", f"{self.dir}/tmp")
        return env

    def prelude(self) -> str:
        """Run as root before the slot's shell starts: a fresh folder, the image's workspace
        copied in, and (isolated) the mount points and the slot's ownership."""
        d = shlex.quote(self.dir)
        wd = shlex.quote(self.workdir)
        lines = [
            "set -e",
            f"mkdir -p -m 711 {SLOT_ROOT}",
            f"rm -rf -- {d}",
            "mkdir -p -- " + " ".join(shlex.quote(p) for p in self.subdirs()),
            f"if [ -d {wd} ]; then cp -a -- {wd}/. {d}/app/; fi",
        ]
        if self.isolated:
            points = sorted({inside for _, inside in self.binds()})
            lines += [
                "mkdir -p -- " + " ".join(shlex.quote(p) for p in points),
                f"chown -R {self.uid}:{self.uid} -- {d}",
                f"chmod 700 -- {d}",
            ]
        else:
            lines.append(f"cd -- {d}/app")
        lines.append("set +e")
        return "; ".join(lines) + "; "

    def shell_argv(
        self, shell: str, *, network: bool, hide: list[str], chdir: str | None = None
    ) -> list[str]:
        """The command that becomes the slot's shell (`hide`: container paths to cover);
        a fresh process of the slot starts the same way, in `chdir`."""
        args = [shell, "--noprofile", "--norc"] if shell == "bash" else [shell]
        if not self.isolated:
            return args
        limit = ["prlimit", f"--nproc={self.nproc}:{self.nproc}", "--"] if self.nproc else []
        argv = [
            *limit,
            "setpriv", f"--reuid={self.uid}", f"--regid={self.uid}", "--clear-groups",
            "--no-new-privs", "--",
            "bwrap", "--unshare-user", "--uid", "0", "--gid", "0",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        ]  # fmt: skip
        if not network:
            argv.append("--unshare-net")
        # No pid namespace: a fresh /proc cannot be mounted under Docker's masked /proc, so
        # the slot sees the container's /proc (its uid keeps it from touching other slots).
        # No --die-with-parent: the parent of an exec is `runc exec`, which exits on its own
        # moments after starting it (and took the slot along); closing reaps by uid instead.
        argv += ["--new-session", "--ro-bind", "/", "/", "--dev", "/dev"]
        for path in [SLOT_ROOT, *hide]:
            argv += ["--tmpfs", path]
        for source, inside in self.binds():
            argv += ["--bind", source, inside]
        return [*argv, "--hostname", "clotho", "--chdir", chdir or self.workdir, *args]

    def shell_command(self, shell: str, *, network: bool, hide: list[str]) -> str:
        return shlex.join(self.shell_argv(shell, network=network, hide=hide))

    def resolve_xfer(self, name: str) -> tuple[str, str]:
        """A transfer file: (container path, path inside the slot)."""
        return posixpath.join(self.xfer_dir, name), posixpath.join(XFER_MOUNT, name)


# Kill every process of a slot, then remove its folder. Root in the container runs it; $1 is
# the slot's token (found in /proc/PID/environ), $2 its uid ("" without isolation), $3 the
# folder ("": kept, as `stop_agent` does). Rounds repeat while something was killed (a process may fork meanwhile). No forks
# per process except the environ match, so a container with many processes is quick.
REAP_SCRIPT = r"""
tok="$1"; uid="$2"; dir="$3"; round=0
while [ $round -lt 10 ]; do
  killed=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$$" ] && continue
    hit=; zombie=
    while IFS= read -r line; do
      case $line in
        State:*Z*) zombie=1 ;;
        Uid:*) set -- $line; [ -n "$uid" ] && [ "$2" = "$uid" ] && hit=1 ;;
      esac
    done 2>/dev/null < "$d/status"
    [ -n "$zombie" ] && continue
    if [ -z "$hit" ] && tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -qxF "CLOTHO_SLOT=$tok"
    then hit=1; fi
    if [ -n "$hit" ] && kill -9 "$p" 2>/dev/null; then killed=$((killed + 1)); fi
  done
  [ $killed -eq 0 ] && break
  round=$((round + 1))
done
if [ -n "$dir" ]; then rm -rf -- "$dir"; fi
"""


def probe_script(layout: SlotLayout | None, *, network: bool, hide: list[str]) -> str:
    """Print `bash` when the image has bash; with a layout, exit 0 only if an isolated slot
    (bubblewrap under its own uid) can start, saying why not on stderr otherwise."""
    lines = ["command -v bash >/dev/null 2>&1 && echo bash"]
    if layout is not None:
        run = shlex.join(layout.shell_argv("true", network=network, hide=hide))
        lines += [
            'command -v bwrap >/dev/null 2>&1 || { echo "the image has no bwrap (install '
            'bubblewrap)" >&2; exit 3; }',
            'command -v setpriv >/dev/null 2>&1 || { echo "the image has no setpriv (install '
            'util-linux)" >&2; exit 3; }',
            'command -v prlimit >/dev/null 2>&1 || { echo "the image has no prlimit (install '
            'util-linux)" >&2; exit 3; }',
            f"( {layout.prelude()}exec {run} ); rc=$?",
            f"rm -rf -- {shlex.quote(layout.dir)}",
            "exit $rc",
        ]
    return "\n".join(lines) + "\n"


def container_path(layout: SlotLayout, path: str, hide: list[str]) -> str | None:
    """Where a path an isolated slot sees lives in the container; None for what its
    bubblewrap covers (`/slots`, the FIFO folder): the slot sees an empty tmpfs there."""
    path = posixpath.normpath(path)
    if not layout.isolated:
        return path
    for source, inside in sorted(layout.binds(), key=lambda pair: -len(pair[1])):
        if path == inside or path.startswith(inside.rstrip("/") + "/"):
            return source + path[len(inside.rstrip("/")) :]
    for covered in [SLOT_ROOT, *hide]:
        if path == covered or path.startswith(covered + "/"):
            return None
    return path


# Print how many tasks (threads included, as RLIMIT_NPROC counts them) run as uid $1; no
# fork per task. Run as root in the container.
COUNT_UID_SCRIPT = r"""
n=0
for s in /proc/[0-9]*/task/[0-9]*/status; do
  while read -r key value _; do
    [ "$key" = Uid: ] || continue
    [ "$value" = "$1" ] && n=$((n + 1))
    break
  done 2>/dev/null < "$s"
done
echo "$n"
"""
