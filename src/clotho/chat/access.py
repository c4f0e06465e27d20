"""Access rules the HTTP servers clotho runs share (`clotho serve-model`, `clotho api`,
`clotho view`): a server without a token listens on a loopback address only, and a client's
token is read from its Authorization header the same way.

In `chat`, the lowest layer with a server of its own (`token_server.py`); the trajectory API
(`trainers`) and the viewer (`view`) are above it."""

from __future__ import annotations

import base64
import binascii
import socket

from clotho.errors import ConfigError
from clotho.hosts import is_loopback


def listen_socket(host: str, port: int, token: str | None, *, refusal: str) -> socket.socket:
    """A TCP socket bound to `host:port`; without a token, only on a loopback address (else
    a `ConfigError`, `refusal` with the `{host}` filled in; as is an address that cannot be
    bound). Each server gives its own `refusal`: what an open one would give away."""
    # proto must say TCP: asyncio sets TCP_NODELAY only on such sockets, and without it
    # every keep-alive response waits ~40 ms for a delayed ACK.
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    if token is None and not is_loopback(str(address[0])):
        raise ConfigError(refusal.format(host=host))
    try:
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from exc
    return sock


def token_of(authorization: str) -> str | None:
    """The token an Authorization header carries: Bearer, or HTTP Basic's password (what a
    browser sends after asking, and clients given `http://user:TOKEN@host`), or a lone user
    name."""
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return value
    if scheme.lower() == "basic":
        try:
            user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return password or user
    return None
