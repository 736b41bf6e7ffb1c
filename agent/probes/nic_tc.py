"""Attach the NIC programs at clsact ingress and egress of interfaces (pyroute2).

Works in the calling thread's network namespace. Shares clsact with other
probes (tcp_retransmit hangs its egress program there too): our programs return
TC_ACT_UNSPEC so later filters still run, take their own priority (lower than
tcp_retransmit's range 0x4000.., so they count first), and detach removes only
our filters, and clsact only when we created it and nothing else hangs there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from agent.probes.base import ProbeUnavailable

log = logging.getLogger("fabricscope.agent.nic")

PARENTS = {"rx": "ffff:fff2", "tx": "ffff:fff3"}    # clsact ingress, egress
_EEXIST = 17


@dataclass(frozen=True)
class Hook:
    ifindex: int
    ifname: str
    direction: str
    created_clsact: bool


class TcHooks:
    """Our two programs on a set of interfaces. `fns`: {"rx": fn, "tx": fn} (BCC functions)."""

    def __init__(self, fns: dict, prio: int | None = None):
        self.fns = fns
        # Two agents may share a namespace (tests): distinct priorities keep their
        # filters apart; below 0x4000 (tcp_retransmit) so that the NIC counts first.
        self.prio = prio or 0x1000 + os.getpid() % 0x2000
        self.hooks: list[Hook] = []

    def attach(self, ifaces) -> None:
        """ifaces: objects with .index and .name. On failure, what was attached stays in
        self.hooks for detach()."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            for iface in ifaces:
                try:
                    ipr.tc("add", "clsact", iface.index)
                    created = True
                except NetlinkError as exc:
                    if exc.code != _EEXIST:   # someone else's clsact: share it
                        raise ProbeUnavailable(f"cannot add clsact on {iface.name}: "
                                               f"{os.strerror(exc.code)}") from None
                    created = False
                for direction, parent in PARENTS.items():
                    fn = self.fns[direction]
                    try:
                        ipr.tc("add-filter", "bpf", iface.index, ":1", fd=fn.fd, name=fn.name,
                               parent=parent, classid=1, direct_action=True, prio=self.prio)
                    except NetlinkError as exc:
                        raise ProbeUnavailable(
                            f"cannot attach TC {direction} on {iface.name}: "
                            f"{os.strerror(exc.code)}") from None
                    self.hooks.append(Hook(iface.index, iface.name, direction, created))

    def detach(self) -> None:
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        hooks, self.hooks = self.hooks, []
        if not hooks:
            return
        with IPRoute() as ipr:
            for h in hooks:
                try:
                    ipr.tc("del-filter", "bpf", h.ifindex, ":1", parent=PARENTS[h.direction],
                           prio=self.prio)
                except NetlinkError as exc:   # interface gone (with its namespace)
                    log.debug("nic: TC detach on %s: %s", h.ifname, os.strerror(exc.code))
            for ifindex, name in {(h.ifindex, h.ifname) for h in hooks if h.created_clsact}:
                try:
                    if not _has_filters(ipr, ifindex):
                        ipr.tc("del", "clsact", ifindex)
                except NetlinkError as exc:
                    log.debug("nic: clsact removal on %s: %s", name, os.strerror(exc.code))


def _has_filters(ipr, ifindex: int) -> bool:
    return any(list(ipr.get_filters(index=ifindex, parent=p)) for p in PARENTS.values())
