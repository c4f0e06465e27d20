"""Host-side state of a local sandbox: a labelled folder that a reaper can recognise."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

STATE_PREFIX = "clotho-sbx-"
LEASE_FILE = "lease.json"


def make_state_dir(
    state_dir: str | None, labels: dict[str, str], lease_s: float = 6 * 3600
) -> Path:
    """Create the sandbox folder and write who owns it, so leftovers can be collected."""
    parent = Path(state_dir or tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f"{STATE_PREFIX}{secrets.token_hex(3)}-", dir=parent))
    from clotho.sandbox import exit_cleanup
    from clotho.sandbox.leases import lease_labels

    exit_cleanup.register("local", state_dir)

    lease = {
        "owner_pid": os.getpid(),
        "created": time.time(),
        "labels": {**lease_labels(lease_s), **labels},
    }
    (path / LEASE_FILE).write_text(json.dumps(lease))
    return path


def remove_state_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def state_dir_until_started(state_dir: str | None, labels: dict[str, str]) -> Iterator[Path]:
    """A new sandbox folder that is removed again if starting its sandbox fails."""
    path = make_state_dir(state_dir, labels)
    try:
        yield path
    except BaseException:
        remove_state_dir(path)
        raise
