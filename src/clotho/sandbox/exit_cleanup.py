"""Last-resort cleanup when the process exits without closing its sandboxes.

A normal run closes every sandbox in `finally` blocks; this `atexit` hook catches what an
unexpected exit left: this process's local sandbox folders (their bubblewrap processes die
with their parent already) and its Docker containers, removed through the Engine API with
a plain synchronous HTTP call (the event loop is gone by then). SIGKILL skips atexit: that
is what `clotho sandbox gc` and the pool's start-up reaping are for.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import socket
import urllib.parse

from clotho.sandbox.leases import OWNER, local_records, owner_label, remove_local

_registered: set[str] = set()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def _docker_socket() -> str | None:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://"):
        path = host[len("unix://") :]
        return path if os.path.exists(path) else None
    return None


def remove_owned_containers(owner: str) -> int:
    path = _docker_socket()
    if path is None:
        return 0
    filters = urllib.parse.quote(json.dumps({"label": [f"{OWNER}={owner}"]}))
    conn = _UnixHTTPConnection(path)
    try:
        conn.request("GET", f"/containers/json?all=1&filters={filters}")
        containers = json.loads(conn.getresponse().read() or b"[]")
        for container in containers:
            conn.request("DELETE", f"/containers/{container['Id']}?force=1")
            conn.getresponse().read()
        return len(containers)
    finally:
        conn.close()


def _cleanup(owner: str, state_dir: str | None, docker: bool) -> None:
    with contextlib.suppress(Exception):
        for record in local_records(state_dir):
            if record.owner == owner:
                remove_local(record)
    if docker:
        with contextlib.suppress(Exception):
            remove_owned_containers(owner)


def register(kind: str, state_dir: str | None = None) -> None:
    """Arrange the exit cleanup once per process and kind ("local" or "docker")."""
    owner = owner_label()
    key = f"{owner}:{kind}:{state_dir}"
    if key in _registered:
        return
    _registered.add(key)
    atexit.register(_cleanup, owner, state_dir, kind == "docker")
