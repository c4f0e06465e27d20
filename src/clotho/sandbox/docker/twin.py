"""Services kept serving, verdict out of their reach: the twin container of a Docker sandbox.

Terminal-Bench tasks may ask the agent to leave a server running (nginx on 8080, a gRPC
store in the background); their tests talk to it. Stopping the agent's processes before the
tests fails those tasks; testing beside live processes of the agent lets them rewrite the
runner, the tests or the reward while the tests run; and a container's pid 1 and main
process outlive any stop (traced, they run anything). So verification always runs in a
*twin* (`verify.integrity.verification_world`): the agent's container is frozen (the
daemon's pause, `freeze.py`, a remote daemon's too) and committed to an image
(a snapshot of exactly what was checked), and the tests run in a new container from that
image that shares only the agent's network namespace (and with it the files Docker keeps
for it: /etc/hosts, /etc/resolv.conf, /etc/hostname) and runs none of its entrypoint. The
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
import secrets
import stat
from typing import Any

from clotho.errors import SandboxError

SNAPSHOT_REPO = "clotho-snapshot"
_COMMIT_TIMEOUT_S = 600.0

# A process inside vfork() (state D in `kernel_clone`) whose child was stopped before it
# exec'd cannot take a signal, nor run, until that child goes on (seen under load: a forking
# loop's `sh`; Python's subprocess uses vfork, so honest agents too): the process lists
# count it as stopped.
VFORK_WAITS = ("kernel_clone", "wait_for_vfork_done", "_do_fork", "do_fork")

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
