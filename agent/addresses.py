"""The node's own IP addresses: the attribution key of every kernel event.

One kernel serves every lab node, and tracepoints carry no network namespace, so
probes keep only events whose local address belongs to the agent's node. The
addresses come from config `addresses`, else from every interface of the agent's
network namespace except loopback. Read through netlink, so the answer is that of
the calling thread's namespace.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from fabricscope.errors import UserError

ARPHRD_ETHER = 1


@dataclass(frozen=True)
class Interface:
    index: int
    name: str
    ethernet: bool
    addresses: frozenset[str]


def parse_addresses(values: list[str]) -> frozenset[str]:
    """Validate and normalise configured addresses (UserError on a bad one)."""
    out = set()
    for text in values:
        try:
            out.add(str(ipaddress.ip_address(text.strip())))
        except ValueError:
            raise UserError(f"addresses: {text!r} is not an IP address",
                            "list IPv4/IPv6 addresses, e.g. --addresses 198.18.0.1,fd00::1") \
                from None
    return frozenset(out)


def is_loopback(addr: str) -> bool:
    return ipaddress.ip_address(addr).is_loopback


def interfaces() -> list[Interface]:
    """Interfaces of the current network namespace with their addresses."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        addrs: dict[int, set[str]] = {}
        for msg in ipr.get_addr():
            text = msg.get_attr("IFA_ADDRESS")
            if text:
                addrs.setdefault(msg["index"], set()).add(text.split("%")[0])
        return [Interface(link["index"], link.get_attr("IFLA_IFNAME"),
                          link["ifi_type"] == ARPHRD_ETHER,
                          frozenset(addrs.get(link["index"], ())))
                for link in ipr.get_links()]


def local_addresses() -> frozenset[str]:
    """Every non-loopback address of the current network namespace."""
    return frozenset(str(ipaddress.ip_address(a)) for i in interfaces() for a in i.addresses
                     if not is_loopback(a))


def node_addresses(configured: list[str]) -> frozenset[str]:
    addrs = parse_addresses(configured) if configured else local_addresses()
    if not addrs:
        raise UserError("this network namespace has no address besides loopback, so no "
                        "kernel event can be attributed to this node",
                        "give the node's addresses with --addresses")
    return addrs


def interfaces_owning(addresses: frozenset[str]) -> list[Interface]:
    """Ethernet interfaces that hold one of `addresses` (where own packets leave)."""
    return [i for i in interfaces()
            if i.ethernet and any(str(ipaddress.ip_address(a)) in addresses for a in i.addresses)]
