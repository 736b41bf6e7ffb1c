"""Attach TC programs (__sk_buff, direct action) at interfaces' ingress and egress.

One place for both probes that hook TC (nic: ingress and egress; tcp_retransmit:
egress). Two mechanisms run the same programs at the same point (before the root
qdisc on egress, before the IP layer on ingress):

- tcx (Linux 6.6+): one BPF link per hook (bpf(BPF_LINK_CREATE) with
  BPF_TCX_INGRESS/EGRESS). No qdisc and no classifier sit between the stack and
  the program, which on a veth pair costs measurably less per skb than clsact
  (docs/PERFORMANCE.md). A link belongs to its file descriptor: it goes away when
  the agent exits, also when it is killed, so nothing is left hanging.
- clsact + cls_bpf through pyroute2 (any kernel with clsact): shares a clsact it
  finds, takes its own priority, and on detach removes only its filters, and
  clsact only when it made it and nothing else hangs there.

`tc_attach` "auto" (the default) takes tcx and falls back to clsact when the
kernel refuses the link (EINVAL: no tcx attach type before 6.6); the log says
which. Our programs return TC_ACT_UNSPEC (tcx: TCX_NEXT, the same -1) so the
programs after them, and legacy clsact filters, still run.

Works in the calling thread's network namespace.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
from dataclasses import dataclass

from fabricscope.agent.config import TC_ATTACH_MODES as MODES
from fabricscope.agent.probes.base import ProbeUnavailable
from fabricscope.agent.probes.nic.bpfmap import _SYS_BPF, _libc   # the bpf() number and libc, loaded once

log = logging.getLogger("fabricscope.agent.tc")

PARENTS = {"ingress": "ffff:fff2", "egress": "ffff:fff3"}    # clsact's two hooks
_BPF_PROG_QUERY = 16
_BPF_LINK_CREATE = 28
_TCX_ATTACH_TYPE = {"ingress": 46, "egress": 47}    # BPF_TCX_INGRESS, BPF_TCX_EGRESS (uapi)
_EEXIST = 17
#: what a kernel without tcx answers (524: ENOTSUPP, kernel-internal)
_NO_TCX = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, 524)


class _LinkCreateAttr(ctypes.Structure):
    """union bpf_attr, the BPF_LINK_CREATE member for tcx (uapi linux/bpf.h): prog_fd,
    target_ifindex, attach_type, flags, then tcx's relative_fd/id and expected_revision
    (0: append, any revision); padded to the size the kernel zero-checks."""
    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_ifindex", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("relative_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("expected_revision", ctypes.c_uint64), ("tail", ctypes.c_uint64 * 4)]


class _QueryAttr(ctypes.Structure):
    """union bpf_attr, the BPF_PROG_QUERY member (uapi linux/bpf.h, tcx fields 6.6+)."""
    _fields_ = [("target_ifindex", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("query_flags", ctypes.c_uint32), ("attach_flags", ctypes.c_uint32),
                ("prog_ids", ctypes.c_uint64), ("prog_cnt", ctypes.c_uint32),
                ("pad", ctypes.c_uint32), ("prog_attach_flags", ctypes.c_uint64),
                ("link_ids", ctypes.c_uint64), ("link_attach_flags", ctypes.c_uint64),
                ("revision", ctypes.c_uint64)]


def _bpf(cmd: int, attr) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf() syscall number unknown on {platform.machine()}")
    rc = _libc().syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


def tcx_programs(ifindex: int, direction: str, most: int = 64) -> list[int]:
    """Ids of the programs tcx runs at an interface's ingress or egress, in order (for
    checks and debugging: `tc filter show` does not list tcx)."""
    ids = (ctypes.c_uint32 * most)()
    attr = _QueryAttr(target_ifindex=ifindex, attach_type=_TCX_ATTACH_TYPE[direction],
                      prog_ids=ctypes.addressof(ids), prog_cnt=most)
    _bpf(_BPF_PROG_QUERY, attr)
    return list(ids[:attr.prog_cnt])


def tcx_link(prog_fd: int, ifindex: int, direction: str) -> int:
    """A tcx link of the program at the interface's ingress or egress; its fd. OSError
    with the kernel's errno when refused."""
    return _bpf(_BPF_LINK_CREATE, _LinkCreateAttr(prog_fd=prog_fd, target_ifindex=ifindex,
                                                  attach_type=_TCX_ATTACH_TYPE[direction]))


def mode_of(config) -> str:
    """tc_attach of an AgentConfig; "auto" without one (tests, benches)."""
    return getattr(config, "tc_attach", "auto") if config is not None else "auto"


@dataclass(frozen=True)
class Hook:
    ifindex: int
    ifname: str
    direction: str         # "ingress" or "egress"
    link_fd: int = -1      # tcx: the link; -1: a clsact filter (self.prio)
    created_clsact: bool = False


class TcPrograms:
    """Our programs on a set of interfaces. fns: {"ingress": fn, "egress": fn}, either
    one optional (BCC functions: .fd, .name). prio: the clsact filters' priority
    (two agents may share a namespace in tests: distinct priorities keep their filters
    apart)."""

    def __init__(self, fns: dict, mode: str = "auto", prio: int = 0x1000):
        if mode not in MODES:
            raise ValueError(f"tc_attach {mode!r}: give one of {', '.join(MODES)}")
        self.fns, self.mode, self.prio = fns, mode, prio
        self.hooks: list[Hook] = []
        self.mechanism = ""    # what attach() used: "tcx" or "clsact"

    def attach(self, ifaces) -> None:
        """ifaces: objects with .index and .name. On failure, what was attached stays in
        self.hooks for detach()."""
        if self.mode != "clsact":
            try:
                self._attach_tcx(ifaces)
                self.mechanism = "tcx"
                return
            except OSError as exc:
                self.detach()
                if self.mode == "tcx" or exc.errno not in _NO_TCX:
                    raise ProbeUnavailable(f"cannot attach tcx on {exc.filename}: "
                                           f"{exc.strerror}") from None
                log.info("tc: this kernel has no tcx links (%s): using clsact", exc.strerror)
        self._attach_clsact(ifaces)
        self.mechanism = "clsact"

    def _attach_tcx(self, ifaces) -> None:
        for iface in ifaces:
            for direction, fn in self.fns.items():
                try:
                    fd = tcx_link(fn.fd, iface.index, direction)
                except OSError as exc:
                    exc.filename = f"{iface.name} {direction}"
                    raise
                self.hooks.append(Hook(iface.index, iface.name, direction, link_fd=fd))

    def _attach_clsact(self, ifaces) -> None:
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
                for direction, fn in self.fns.items():
                    try:
                        ipr.tc("add-filter", "bpf", iface.index, ":1", fd=fn.fd, name=fn.name,
                               parent=PARENTS[direction], classid=1, direct_action=True,
                               prio=self.prio)
                    except NetlinkError as exc:
                        raise ProbeUnavailable(f"cannot attach TC {direction} on {iface.name}:"
                                               f" {os.strerror(exc.code)}") from None
                    self.hooks.append(Hook(iface.index, iface.name, direction,
                                           created_clsact=created))

    def detach(self) -> None:
        hooks, self.hooks = self.hooks, []
        for h in hooks:
            if h.link_fd >= 0:
                os.close(h.link_fd)       # the link goes with its last fd
        filters = [h for h in hooks if h.link_fd < 0]
        if not filters:
            return
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        with IPRoute() as ipr:
            for h in filters:
                try:
                    ipr.tc("del-filter", "bpf", h.ifindex, ":1", parent=PARENTS[h.direction],
                           prio=self.prio)
                except NetlinkError as exc:   # interface gone (with its namespace)
                    log.debug("tc: detach on %s: %s", h.ifname, os.strerror(exc.code))
            for ifindex, name in {(h.ifindex, h.ifname) for h in filters if h.created_clsact}:
                try:
                    if not _has_filters(ipr, ifindex):
                        ipr.tc("del", "clsact", ifindex)
                except NetlinkError as exc:
                    log.debug("tc: clsact removal on %s: %s", name, os.strerror(exc.code))


def _has_filters(ipr, ifindex: int) -> bool:
    return any(list(ipr.get_filters(index=ifindex, parent=p)) for p in PARENTS.values())
