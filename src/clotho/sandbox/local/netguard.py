"""Keep networked local sandboxes off the host's own services, the cluster and the cloud.

A networked sandbox reaches out through slirp4netns, which runs with the sandbox's host gid
(its uid as a group id); firewall rules reject every packet from that gid range to:

- an address of the host itself (`addrtype LOCAL`: loopback and every interface address,
  even ones added later), so the trajectory API, a model server or anything else listening
  on the host stays out of reach;
- link-local addresses (169.254.0.0/16, fe80::/10: the cloud's metadata service at
  169.254.169.254 and its credentials) and the metadata addresses outside that range;
- every address passed as `extra`: the Ray backend's host actor passes every node of its
  cluster (their command channels and Ray's own ports, which run code for whoever reaches
  them).

The sandbox's own loopback (its own network namespace) works as usual. Without root there
is no sandbox gid and no rule: a networked sandbox is refused (`bwrap.py`), never run
unguarded.

The rules are host state (the `OUTPUT` chains of iptables and ip6tables), added once if
missing and left in place: they match only the sandbox gid range, which no other process
uses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import shutil
from collections.abc import Iterable

from clotho.errors import SandboxError

LINK_LOCAL = ("169.254.0.0/16", "fe80::/10")
# Metadata services outside the link-local ranges (Alibaba Cloud's; AWS's over IPv6).
METADATA = ("100.100.100.200", "fd00:ec2::254")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _owner(uid_base: int, uid_count: int) -> list[str]:
    return ["-m", "owner", "--gid-owner", f"{uid_base}-{uid_base + uid_count - 1}"]


def guard_rule(uid_base: int, uid_count: int) -> list[str]:
    """The rule that keeps the sandbox gid range off the host's own addresses."""
    return [
        "OUTPUT", *_owner(uid_base, uid_count),
        "-m", "addrtype", "--dst-type", "LOCAL", "-j", "REJECT",
    ]  # fmt: skip


def address_rule(uid_base: int, uid_count: int, network: Network) -> list[str]:
    """The rule that keeps the sandbox gid range off `network`."""
    return ["OUTPUT", *_owner(uid_base, uid_count), "-d", str(network), "-j", "REJECT"]


def blocked_networks(extra: Iterable[str] = ()) -> list[Network]:
    """Link-local ranges, metadata addresses and `extra` (addresses or networks); an entry
    that is neither is a SandboxError (refused rather than skipped)."""
    found: list[Network] = []
    for entry in (*LINK_LOCAL, *METADATA, *extra):
        try:
            network = ipaddress.ip_network(entry.strip().strip("[]"), strict=False)
        except ValueError as exc:
            raise SandboxError(f"cannot guard {entry!r}: not an IP address") from exc
        if network not in found:
            found.append(network)
    return found


def guard_rules(
    uid_base: int, uid_count: int, extra: Iterable[str] = ()
) -> dict[str, list[list[str]]]:
    """Every rule, by the tool that installs it."""
    rules: dict[str, list[list[str]]] = {
        tool: [guard_rule(uid_base, uid_count)] for tool in ("iptables", "ip6tables")
    }
    for network in blocked_networks(extra):
        tool = "iptables" if network.version == 4 else "ip6tables"
        rules[tool].append(address_rule(uid_base, uid_count, network))
    return rules


async def _run(*argv: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode not in (0, 1):
        raise SandboxError(f"{argv[0]} failed: {err.decode(errors='replace').strip()}")
    return proc.returncode or 0


async def guard_host_addresses(uid_base: int, uid_count: int, extra: Iterable[str] = ()) -> None:
    """Make sure every rule is in place, for IPv4 and IPv6; SandboxError if one cannot be (a
    networked sandbox is then refused rather than let onto the host's services)."""
    for tool, rules in guard_rules(uid_base, uid_count, extra).items():
        if shutil.which(tool) is None:
            raise SandboxError(
                f"network=True needs {tool} to keep sandboxes off the host's own and the "
                "cluster's addresses: apt-get install iptables"
            )
        for rule in rules:
            if await _run(tool, "-w", "-C", *rule) != 0 and await _run(tool, "-w", "-I", *rule):
                raise SandboxError(f"{tool} could not add a rule that guards the host")


async def remove_guard(uid_base: int, uid_count: int, extra: Iterable[str]) -> None:
    """Remove the rules for `extra` alone (a test's addresses); the others stay."""
    always = blocked_networks()
    for network in blocked_networks(extra):
        if network in always:
            continue
        tool = "iptables" if network.version == 4 else "ip6tables"
        rule = address_rule(uid_base, uid_count, network)
        while await _run(tool, "-w", "-C", *rule) == 0:
            await _run(tool, "-w", "-D", *rule)
