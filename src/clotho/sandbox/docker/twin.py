"""Services kept serving, verdict out of their reach: the twin container of a Docker sandbox.

Terminal-Bench tasks may ask the agent to leave a server running (nginx on 8080, a gRPC
store in the background); their tests talk to it. Stopping the agent's processes before the
tests fails those tasks; testing beside live processes of the agent lets them rewrite the
runner, the tests or the reward while the tests run; and a container's pid 1 and main
process outlive any stop (traced, they run anything). So verification always runs in a
*twin* (`verify.integrity.verification_world`): the agent's container is frozen (the
daemon's pause, `freeze.py`; `HOLD_CONTAINER` on a remote daemon) and committed to an image
(a snapshot of exactly what was checked), and the tests run in a new container from that
image that shares only the agent's network namespace and runs none of its entrypoint. The
agent's services, if any, are then thawed and serve over the shared loopback, but they
cannot see, write or signal anything of the twin: its file system is the snapshot plus
the harness's /tests and reward folder, its processes live in another pid namespace, its
IPC is its own. One folder is the agent's, live (`LIVE_FOLDERS`): /var/log, where services
write what tests read about them (nginx's access log); nothing the runner executes lives
there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import stat
from typing import Any

from clotho.errors import SandboxError
from clotho.sandbox.docker.fresh import FIND_MAIN

SNAPSHOT_REPO = "clotho-snapshot"
_COMMIT_TIMEOUT_S = 600.0

# A remote daemon's hold (a local one pauses the container, `freeze.py`). Freeze every
# process of the container but pid 1 (docker-init), the container's main process
# (`FIND_MAIN`: the harness's shell) and the caller, with `kill -STOP -1` in rounds
# until none is left running (a fork racing the signal is caught by the next round); bash or
# sh builtins only. Prints how many of the agent's it holds (stopped, not killed: they may
# serve the tests): the main process's own children (the session shell) are not counted.
# A process inside vfork() (state D in `kernel_clone`) whose child was stopped before it
# exec'd cannot take the signal, nor run, until that child goes on: it is held too. (Seen
# under load: a forking loop's `sh`; Python's subprocess uses vfork, so honest agents too.)
VFORK_WAITS = ("kernel_clone", "wait_for_vfork_done", "_do_fork", "do_fork")
HOLD_CONTAINER = (
    FIND_MAIN
    + r"""
vfork_held() {
  w=; read -r w < "$1/wchan" 2>/dev/null
  case $w in """
    + "|".join(VFORK_WAITS)
    + r""") ;; *) return 1 ;; esac
  kids=; read -r kids < "$1/task/${1#/proc/}/children" 2>/dev/null
  for k in $kids; do
    read -r kl < "/proc/$k/stat" 2>/dev/null || continue
    set -- ${kl##*) }
    case $1 in T|t) return 0 ;; esac
  done
  return 1
}
round=0; held=0; running=1
while [ $round -lt 100 ] && [ $running -gt 0 ]; do
  kill -s STOP -- -1 2>/dev/null
  held=0; running=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case $p in 1|"$self"|"$main") continue ;; esac
    read -r line < "$d/stat" 2>/dev/null || continue
    set -- ${line##*) }
    state=$1
    if [ "$state" = D ] && vfork_held "$d"; then state=T; fi
    if [ -n "$main" ] && [ "$2" = "$main" ]; then  # the harness's session shell: stopped,
      case $state in T|t|Z|X) ;; *) running=$((running + 1)) ;; esac; continue  # not counted
    fi
    case $state in Z|X) ;; T|t) held=$((held + 1)) ;; *) running=$((running + 1)) ;; esac
  done
  round=$((round + 1))
done
echo "main=$main held=$held running=$running"
"""
)
# Continue what `HOLD_CONTAINER` stopped (everything but pid 1 and the caller).
RELEASE_CONTAINER = "kill -s CONT -- -1 2>/dev/null; true\n"

# The agent's folders the twin sees live, not as the snapshot: services' logs.
LIVE_FOLDERS = ("/var/log",)


def live_binds(info: dict[str, Any]) -> list[str]:
    """Binds of `LIVE_FOLDERS` from the held container's merged view on this host (a local
    daemon), each only when every step of its path there is a real folder, not a link the
    agent planted (it is held: nothing changes until the twin has started)."""
    merged = ((info.get("GraphDriver") or {}).get("Data") or {}).get("MergedDir")
    if not merged or not os.path.isdir(merged):
        return []
    binds = []
    for folder in LIVE_FOLDERS:
        path, real = merged, True
        for part in folder.strip("/").split("/"):
            path = f"{path}/{part}"
            try:
                real = stat.S_ISDIR(os.lstat(path).st_mode)
            except OSError:
                real = False
            if not real:
                break
        if real:
            binds.append(f"{path}:{folder}")
    return binds


_HELD = re.compile(r"main=(\d*) held=(\d+) running=(\d+)")


def parse_hold(output: str) -> tuple[int, int]:
    """(held, still running) from `HOLD_CONTAINER`'s last line."""
    found = _HELD.findall(output)
    if not found:
        raise SandboxError(f"cannot hold the agent's processes: {output.strip()[-300:]!r}")
    _, held, running = found[-1]
    return int(held), int(running)


async def snapshot(container: Any, labels: dict[str, str]) -> str:
    """Commit the (frozen) container to an image: the twin's file system. Returns its id."""
    from aiodocker.exceptions import DockerError

    tag = secrets.token_hex(6)
    changes = [f'LABEL "{k}"="{v}"' for k, v in sorted(labels.items())]
    try:
        async with asyncio.timeout(_COMMIT_TIMEOUT_S):
            info = await container.commit(
                repository=SNAPSHOT_REPO, tag=tag, changes=changes, pause=True
            )
    except (DockerError, TimeoutError) as exc:
        raise SandboxError(f"cannot snapshot the container for verification: {exc}") from exc
    return str(info["Id"])


async def remove_snapshot(docker: Any, image: str) -> None:
    """Remove a twin's image (its container is gone first); a failure is left to gc."""
    from aiodocker.exceptions import DockerError

    with contextlib.suppress(DockerError, OSError):
        await asyncio.shield(docker.images.delete(image, force=True))
