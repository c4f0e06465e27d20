"""Who `clotho view` answers: requests that name its own address (or localhost) in their
Host header, that no other web page sent, and, when it has a token, that carry it.

A page on any site can point its own name at 127.0.0.1 (DNS rebinding) and then read the
viewer as same-origin: its requests still say `Host: that-name`, so a Host the viewer does
not answer to is refused (421). A page's cross-site requests (an `<img>`, a `<script>` on
the API) are refused too (403); following a link to the viewer is a navigation and works.
Bound to anything but loopback, the viewer needs a token (`--token-file`, `--token-env` or
`CLOTHO_VIEW_TOKEN`, as `clotho api` and `clotho serve-model` read theirs): a browser asks
for it once (HTTP Basic: any user name, the token as password) and sends it with every
request of the page after that.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from clotho.chat import access
from clotho.chat.access import token_of
from clotho.hosts import host_name, is_loopback

TOKEN_ENV = "CLOTHO_VIEW_TOKEN"
"""Where `clotho view` reads its token when no flag names one."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
"""The served page runs only its own script (app.js): markup that got past escaping would
still not run. Inline `style` attributes draw the bars."""

SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


class HostCheck:
    """The Host header values the viewer answers to: loopback names and addresses, the
    address it is bound to (any address of the machine when bound to all of them, and then
    the machine's own names), the name it was given with `--host`, and `--allow-host` names.
    An IP address cannot be rebound, so only names need listing."""

    def __init__(self, given: str, bound: str, extra: Iterable[str] = ()) -> None:
        self.address = ipaddress.ip_address(bound.split("%", 1)[0])
        self.wildcard = self.address.is_unspecified
        names = {_norm(given), *(_norm(name) for name in extra)}
        if self.wildcard:
            names |= {_norm(socket.gethostname()), _norm(socket.getfqdn())}
        self.names = frozenset(name for name in names if name)

    @classmethod
    def loopback(cls) -> HostCheck:
        return cls("127.0.0.1", "127.0.0.1")

    def allows(self, host_header: str) -> bool:
        name = _norm(host_name(host_header))
        if not name:
            return False
        if is_loopback(name) or name in self.names:
            return True
        try:
            address = ipaddress.ip_address(name.split("%", 1)[0])
        except ValueError:
            return False
        return self.wildcard or address == self.address


def _norm(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


class ViewGuard:
    """ASGI middleware: refuses what `HostCheck`, the page's origin or the token rule out,
    and adds the security headers to every answer."""

    def __init__(self, app: Any, hosts: HostCheck, token: str | None) -> None:
        self.app = app
        self.hosts = hosts
        self.token = token.encode() if token else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.refusal(headers)

        async def send_secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        if refusal is None:
            await self.app(scope, receive, send_secured)
            return
        status, text, extra = refusal
        await send_secured(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(text.encode())).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": text.encode()})

    def refusal(self, headers: dict[str, str]) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """(status, message, extra headers) for a request to refuse; None to serve it."""
        host = headers.get("host", "")
        if not self.hosts.allows(host):
            return (
                421,
                f"clotho view does not answer to the host {host!r}: only to its own address "
                "and localhost (a web page on another name is refused); --allow-host NAME "
                "adds a name\n",
                [],
            )
        origin = headers.get("origin")
        site = headers.get("sec-fetch-site")
        cross = site in ("cross-site", "same-site") and headers.get("sec-fetch-mode") != "navigate"
        # The page's own requests name its own host (behind a proxy: https, same host).
        if cross or (origin is not None and urlsplit(origin).netloc.lower() != host.lower()):
            return 403, "requests from other web pages are refused\n", []
        if self.token is None:
            return None
        given = token_of(headers.get("authorization", ""))
        if given is None or not hmac.compare_digest(given.encode(), self.token):
            return (
                401,
                "this viewer needs its token: a browser asks for it (any user name, the token "
                "as password); other clients send 'Authorization: Bearer <token>'\n",
                [(b"www-authenticate", b'Basic realm="clotho view", charset="UTF-8"')],
            )
        return None


# `listen_socket(host, port, token)`: the viewer's socket, loopback only without a token.
listen_socket = functools.partial(
    access.listen_socket,
    refusal="refusing to serve runs on {host} without a token: anyone who can reach it would "
    f"read every run; give one (--token-file, --token-env or ${TOKEN_ENV}) or listen on "
    "127.0.0.1",
)
