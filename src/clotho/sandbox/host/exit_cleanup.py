"""Last-resort cleanup when the process exits without closing its sandboxes.

A normal run closes every sandbox in `finally` blocks; this `atexit` hook catches what an
unexpected exit left: this process's local sandbox folders (their bubblewrap processes die
with their parent already) and its Docker containers, removed through the Engine API with
a plain synchronous HTTP call (the event loop is gone by then). Containers are removed on
every daemon address this process started one on (the backend registers the address its
client actually uses, a configured `docker_url` included). SIGKILL skips atexit: that is
what `clotho sandbox gc` and the pool's start-up reaping are for.
"""

from __future__ import annotations

import atexit
import http.client
import json
import logging
import os
import socket
import urllib.parse

from clotho.sandbox.host.leases import OWNER, local_records, owner_label, remove_local

log = logging.getLogger(__name__)

DEFAULT_DOCKER_URL = "unix:///var/run/docker.sock"

_registered: set[str] = set()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def _connection(url: str) -> http.client.HTTPConnection | None:
    """A plain HTTP connection to the Engine API at `url` (unix:// or tcp:// / http://)."""
    if url.startswith("unix://"):
        path = url[len("unix://") :]
        return _UnixHTTPConnection(path) if os.path.exists(path) else None
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("tcp", "http") and parsed.hostname:
        return http.client.HTTPConnection(parsed.hostname, parsed.port or 2375, timeout=10)
    return None  # https needs client certificates: left to `clotho sandbox gc`


def remove_owned_containers(owner: str, url: str = DEFAULT_DOCKER_URL) -> int:
    """Force-remove the containers labelled with `owner` on the daemon at `url`."""
    conn = _connection(url)
    if conn is None:
        return 0
    filters = urllib.parse.quote(json.dumps({"label": [f"{OWNER}={owner}"]}))
    try:
        conn.request("GET", f"/containers/json?all=1&filters={filters}")
        containers = json.loads(conn.getresponse().read() or b"[]")
        for container in containers:
            conn.request("DELETE", f"/containers/{container['Id']}?force=1")
            conn.getresponse().read()
        return len(containers)
    finally:
        conn.close()


def _cleanup_local(owner: str, state_dir: str | None) -> None:
    try:
        for record in local_records(state_dir):
            if record.owner == owner:
                remove_local(record)
    except Exception as exc:
        log.warning("exit cleanup of sandbox folders in %s failed: %s", state_dir, exc)


def _cleanup_docker(owner: str, url: str) -> None:
    try:
        remove_owned_containers(owner, url)
    except Exception as exc:
        log.warning("exit cleanup of containers on %s failed: %s", url, exc)


def register(kind: str, state_dir: str | None = None, *, docker_url: str | None = None) -> None:
    """Arrange the exit cleanup once per process and place: "local" sandbox folders in
    `state_dir`, or "docker" containers on the daemon at `docker_url` (the address the
    client uses; None: the default unix socket)."""
    owner = owner_label()
    if kind == "docker":
        url = docker_url or DEFAULT_DOCKER_URL
        key = f"{owner}:docker:{url}"
        if key not in _registered:
            _registered.add(key)
            atexit.register(_cleanup_docker, owner, url)
        return
    key = f"{owner}:{kind}:{state_dir}"
    if key not in _registered:
        _registered.add(key)
        atexit.register(_cleanup_local, owner, state_dir)
