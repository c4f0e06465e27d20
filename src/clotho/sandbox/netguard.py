"""Keep networked local sandboxes off the host's own services.

A networked sandbox reaches out through slirp4netns, which runs with the sandbox's host gid
(its uid as a group id); a firewall rule rejects every packet from that gid range to an address of the host itself
(`addrtype LOCAL`: loopback and every interface address, even ones added later), so the
trajectory API, a model server or anything else listening on the host stays out of reach,
while the sandbox's own loopback (its own network namespace) works as usual.

The rule is host state (the `OUTPUT` chain of iptables and ip6tables), added once if missing
and left in place: it matches only the sandbox gid range, which no other process uses.
"""

from __future__ import annotations

import asyncio
import shutil

from clotho.errors import SandboxError


def guard_rule(uid_base: int, uid_count: int) -> list[str]:
    return [
        "OUTPUT", "-m", "owner", "--gid-owner", f"{uid_base}-{uid_base + uid_count - 1}",
        "-m", "addrtype", "--dst-type", "LOCAL", "-j", "REJECT",
    ]  # fmt: skip


async def _run(*argv: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode not in (0, 1):
        raise SandboxError(f"{argv[0]} failed: {err.decode(errors='replace').strip()}")
    return proc.returncode or 0


async def guard_host_addresses(uid_base: int, uid_count: int) -> None:
    """Make sure the rule is in place for IPv4 and IPv6; SandboxError if it cannot be (a
    networked sandbox is then refused rather than let onto the host's services)."""
    rule = guard_rule(uid_base, uid_count)
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            raise SandboxError(
                f"network=True as root needs {tool} to keep sandboxes off the host's own "
                "addresses: apt-get install iptables"
            )
        if await _run(tool, "-w", "-C", *rule) != 0 and await _run(tool, "-w", "-I", *rule):
            raise SandboxError(f"{tool} could not add the rule that guards the host")
