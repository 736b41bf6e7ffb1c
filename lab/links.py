"""The lab's links over netlink (pyroute2): bridges and veth pairs, made the same
way for switch ports and uplinks, and removed by name.

Every bridge is a switch with STP off and no forwarding delay (its ports forward
as soon as they are up, like edge ports; the leaf-spine lab is a tree, so STP has
nothing to block) and no multicast snooping. Every veth end gets RPS and, with
wire_frames, gso_max_segs 1; IPv6 is off on every interface of the root
namespace that the lab adds (no DAD/MLD chatter in the agents' counters).
"""

from __future__ import annotations

import errno
import os

from fabricscope.lab import naming, nsops


def disable_ipv6(ifname: str) -> None:
    nsops.set_sysctl(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6", "1")


def add_bridge(ipr, ifname: str, mac: str) -> int:
    """Create bridge `ifname`, up, IPv6 off; returns its index."""
    ipr.link("add", ifname=ifname, kind="bridge", address=mac,
             br_stp_state=0, br_forward_delay=0, br_mcast_snooping=0)
    index = ipr.link_lookup(ifname=ifname)[0]
    disable_ipv6(ifname)
    ipr.link("set", index=index, state="up")
    return index


def add_veth(ipr, ifname: str, mac: str, peer: str, peer_mac: str,
             wire_frames: bool) -> tuple[int, int]:
    """Create the veth pair ifname == peer (both down, in the root namespace) with RPS
    on both ends and IPv6 off on `ifname`; returns their indices.

    wire_frames: gso_max_segs 1 hands the veths one wire-sized frame per skb, so nft
    loss and TBF act per frame instead of per GSO burst of up to 64 KB."""
    gso = {"gso_max_segs": 1} if wire_frames else {}
    ipr.link("add", ifname=ifname, kind="veth", address=mac,
             peer={"ifname": peer, "address": peer_mac, **gso}, **gso)
    # RPS keeps each flow on one CPU's backlog: veth hands frames to the backlog of
    # whichever CPU the sender runs on, and a sender migrating between CPUs would
    # reorder its own flow (hundreds of spurious fast retransmits per DDP step).
    # Set while both ends are in the root namespace's sysfs; it survives a move.
    mask = naming.cpu_mask(os.cpu_count() or 1)
    for dev in (ifname, peer):
        nsops.set_sysctl(f"/sys/class/net/{dev}/queues/rx-0/rps_cpus", mask)
    disable_ipv6(ifname)
    return ipr.link_lookup(ifname=ifname)[0], ipr.link_lookup(ifname=peer)[0]


def plug(ipr, index: int, bridge_index: int) -> None:
    """Make link `index` a port of the bridge, and up."""
    ipr.link("set", index=index, master=bridge_index, state="up")


def delete(ipr, ifname: str) -> bool:
    """Delete link `ifname` (a veth takes its peer along); False when it was not there."""
    from pyroute2 import NetlinkError
    idx = ipr.link_lookup(ifname=ifname)
    if not idx:
        return False
    try:
        ipr.link("del", index=idx[0])
    except NetlinkError as exc:
        if exc.code not in (errno.ENODEV, errno.ENOENT):
            raise
        return False
    return True


def delete_in_order(ipr, ifnames) -> bool:
    """Delete veths first (each takes its peer along), then bridges (a bridge goes
    last so no port is ever left without its switch). True when any was there."""
    found = False
    for ifname in sorted(ifnames, key=lambda n: bool(naming.BRIDGE_RE.match(n))):
        found |= delete(ipr, ifname)
    return found
