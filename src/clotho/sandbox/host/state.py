"""Host-side state of a sandbox: a labelled folder a reaper can recognise, made with its lease
and the exit cleanup that removes it, removed with its cgroups (`cgroups.py`) and whatever
it holds (`trees.py`). The top of `host/`: it imports the modules beside it, none imports it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from clotho.sandbox.host import exit_cleanup
from clotho.sandbox.host.cgroups import destroy_named
from clotho.sandbox.host.leases import LEASE_FILE, STATE_PREFIX, lease_labels
from clotho.sandbox.host.trees import remove_tree

log = logging.getLogger(__name__)


# Host uids for local sandboxes run as root: far above any real account. A sandbox claims one
# by creating its state folder under a name made from it (mkdir is atomic), so two live
# sandboxes under one state folder never share a uid; the reaper frees it with the folder.
SANDBOX_UID_BASE = 1_000_000_000
SANDBOX_UID_COUNT = 1 << 24
_UID_MARK = "u"


def make_state_dir(
    state_dir: str | None,
    labels: dict[str, str],
    lease_s: float = 6 * 3600,
    *,
    claim_uid: bool = False,
) -> Path:
    """Create the sandbox folder and write who owns it, so leftovers can be collected.

    With `claim_uid`, the folder's name carries a host uid no other live sandbox in the same
    parent folder has (`state_uid`); the folder is then traversable (0711) for that uid."""
    parent = Path(state_dir or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    if claim_uid:
        path = _claim_uid_dir(parent)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{secrets.token_hex(3)}-", dir=parent))
    exit_cleanup.register("local", state_dir)

    lease = {
        "owner_pid": os.getpid(),
        "created": time.time(),
        "labels": {**lease_labels(lease_s), **labels},
    }
    (path / LEASE_FILE).write_text(json.dumps(lease))
    return path


def _claim_uid_dir(parent: Path) -> Path:
    for _ in range(100):
        uid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_COUNT)
        path = parent / f"{STATE_PREFIX}{_UID_MARK}{uid}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        path.chmod(0o711)
        return path
    raise OSError(f"no free sandbox uid under {parent}")


def state_uid(path: Path) -> int | None:
    """The host uid a state folder made with `claim_uid` belongs to."""
    rest = path.name.removeprefix(STATE_PREFIX)
    if rest.startswith(_UID_MARK) and rest[1:].isdigit():
        return int(rest[1:])
    return None


def remove_state_dir(path: Path) -> None:
    """Remove the folder, and the sandbox's cgroups (killing what is left in them)."""
    destroy_named(path.name)
    try:
        remove_tree(path)
    except OSError as exc:  # close goes on; `clotho sandbox gc` reports what stays
        log.warning("%s", exc)


@contextlib.contextmanager
def state_dir_until_started(
    state_dir: str | None, labels: dict[str, str], *, claim_uid: bool = False
) -> Iterator[Path]:
    """A new sandbox folder that is removed again if starting its sandbox fails."""
    path = make_state_dir(state_dir, labels, claim_uid=claim_uid)
    try:
        yield path
    except BaseException:
        remove_state_dir(path)
        raise
