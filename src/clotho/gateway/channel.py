"""How an agent in a sandbox without network reaches the gateway.

The gateway listens on a unix socket in a folder the sandbox already sees: the local
backend's transfer folder (`<state>/xfer`, at `XFER_MOUNT` inside; the socket is given to the
sandbox's uid, which must be able to write it to connect) or a Docker sandbox's FIFO folder
(`io_dir`, bind-mounted read-only at `/.clotho-io`: a socket on a read-only mount still
accepts connections, and the sandbox cannot remove or replace it). A relay started inside
(`relay.py`, inline with the image's `python3`, else `node`) offers it as
http://127.0.0.1:PORT, the address the agent is given. The sandbox keeps no network: the
socket leads to the gateway and nowhere else, and the gateway answers the trial's token only.

Other backends (Docker slots, remote ones, a daemon without FIFOs) have no such folder yet: a
`ConfigError` says so.
"""

from __future__ import annotations

import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from clotho.errors import ConfigError, SandboxError, TaskError
from clotho.gateway import relay
from clotho.gateway.server import Gateway, GatewayTrial, Listener
from clotho.sandbox.base import Sandbox, SocketPlace

# The exit code of the launch script when the image has no runtime for the relay.
NO_RUNTIME_EXIT = 97
NO_RUNTIME = (
    "the task's image has neither python3 nor node on its PATH, which the model gateway's "
    "relay needs inside the sandbox to reach the model; use an image with one of them"
)


def socket_place(sandbox: Sandbox) -> SocketPlace:
    """Where the gateway's socket goes: the sandbox's own answer (`Sandbox.socket_place`)."""
    place = sandbox.socket_place()
    if place is None:
        raise ConfigError(
            f"the model gateway cannot reach a {type(sandbox).__name__} yet: installed agents "
            "run on the local backend or on Docker with a local daemon (stdio fifo)"
        )
    return place


def relay_command(socket_path: str, port: int) -> str:
    """Shell: start the relay with the image's python3 (else node), print its port."""
    source = Path(relay.__file__).read_text().split('"""', 2)[2]  # without its docstring
    sock, port_arg = shlex.quote(socket_path), str(int(port))
    python = f"python3 -c {shlex.quote(source)} {sock} {port_arg}"
    node = f"node -e {shlex.quote(relay.NODE_RELAY)} {sock} {port_arg}"
    # POSIX sh: the relay starts in the background (in its own session where the image has
    # setsid) and its first line goes down the pipe this command reads: the command returns
    # once the port listens, and the relay outlives it (it sends nothing more down the pipe).
    start = (
        "( S=$(command -v setsid || true); $S {} </dev/null 2>&1 & ) | "
        '( IFS= read -r line; printf "%s\\n" "$line" )'
    )
    return (
        f"if command -v python3 >/dev/null 2>&1; then {start.format(python)}; "
        f"elif command -v node >/dev/null 2>&1; then {start.format(node)}; "
        f"else exit {NO_RUNTIME_EXIT}; fi"
    )


@dataclass
class SandboxLink:
    """A trial's gateway as its sandbox reaches it."""

    listener: Listener
    port: int
    socket_path: str  # inside the sandbox

    @property
    def base_url(self) -> str:
        """The gateway's root inside the sandbox (an agent adds /v1 where its API wants it)."""
        return f"http://127.0.0.1:{self.port}"


async def link_sandbox(
    gateway: Gateway,
    trial: GatewayTrial,
    sandbox: Sandbox,
    *,
    port: int = 0,
    timeout_s: float = 60.0,
) -> SandboxLink:
    """Listen for `trial` where `sandbox` can reach it and start the relay inside; the relay
    is an ordinary process of the sandbox (the agent's stop ends it). `port` 0 takes a free
    one inside. Close with `gateway.close_listener(link.listener)`."""
    place = socket_place(sandbox)
    name = f"gw-{secrets.token_hex(6)}.sock"
    listener = await gateway.listen_unix(
        place.host_dir, name, trial=trial, owner_uid=place.owner_uid, mode=place.mode
    )
    inner = f"{place.inner_dir}/{name}"
    try:
        result = await sandbox.exec(relay_command(inner, port), timeout=timeout_s)
        if result.exit_code == NO_RUNTIME_EXIT:
            raise TaskError(NO_RUNTIME)
        line = result.stdout.strip()
        if not result.ok or not line.isdigit():
            said = (line or result.stderr.strip())[-500:]
            raise SandboxError(f"the gateway's relay did not start in the sandbox: {said!r}")
    except BaseException:
        await gateway.close_listener(listener)
        raise
    return SandboxLink(listener=listener, port=int(line), socket_path=inner)
