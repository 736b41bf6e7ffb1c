"""Closes of sockets whose every teardown hook the kernel skipped, found by asking
sock_diag which sockets still live.

The kernel sometimes runs no BPF program for any tracepoint of a socket's teardown
(inet_sock_set_state to CLOSE, tcp_destroy_sock; raw tracepoints included, seen on
6.18 in softirq, mostly without counting a miss; docs/architecture.md). tcp_flows
then still holds the socket's entry (`socks`), with the cookie TC egress read from
its packets. Every `every_s` (at a window cut) this sweep lists the cookies of the
namespace's live TCP sockets (NETLINK_SOCK_DIAG, what `ss -e` shows as sk:) and, for
an entry whose socket is gone, runs the probe's own raw tcp_destroy_sock program on it
(BPF_PROG_TEST_RUN, args[0] = the socket's address): the close is reported by the
same kernel code as at a real teardown, marked swept (probe_events_total
{event="closed_at_sweep"}) and stamped with the socket's last packet out.

Only entries older than `quiet_s` are asked about (a socket made after the dump
began is not in it), and a socket found alive is asked about again only after
`recheck_s`: a dead socket is found within `every_s` + `quiet_s` when it died unseen
before its first check, within `recheck_s` + `every_s` otherwise. Sweeping every
10 s, not every window: reading the socket table (~120 us for 16,384 slots) is a
map syscall, and the kernel skips tracepoint programs on its CPU while it runs.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
from dataclasses import dataclass, field

import numpy as np

from fabricscope.agent.probes.nic import bpfmap as nic_bpfmap

log = logging.getLogger("fabricscope.agent.tcp_sweep")


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NLMSG = struct.Struct("=IHHII")                 # len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states, then the 48-byte id
_REQ = struct.Struct("=BBBxI48x")
_COOKIE_AT = 16 + 44     # nlmsghdr, then inet_diag_msg: 4 bytes, sport, dport, src,
                         # dst, if (4+2+2+16+16+4), then the cookie (u64)
TCP_TIME_WAIT, TCP_NEW_SYN_RECV = 6, 12
#: every state of a full socket: TIME_WAIT and request sockets are other objects
#: (a TIME_WAIT socket even inherits its socket's cookie), not the socket alive
FULL_SOCKET_STATES = 0xFFFFFFFF & ~(1 << TCP_TIME_WAIT) & ~(1 << TCP_NEW_SYN_RECV)


def parse_cookies(buf: bytes, out: set[int]) -> bool:
    """Add the cookies of one recv()'s inet_diag messages to out; True at NLMSG_DONE.
    Raises OSError on an NLMSG_ERROR message."""
    at = 0
    while at + _NLMSG.size <= len(buf):
        length, kind = _NLMSG.unpack_from(buf, at)[:2]
        if length < _NLMSG.size:
            raise OSError(errno.EPROTO, "sock_diag: malformed netlink message")
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            err = -struct.unpack_from("=i", buf, at + _NLMSG.size)[0]
            raise OSError(err, "sock_diag: " + os.strerror(err))
        if kind == SOCK_DIAG_BY_FAMILY and length >= _COOKIE_AT + 8:
            out.add(struct.unpack_from("=Q", buf, at + _COOKIE_AT)[0])
        at += (length + 3) & ~3
    return False


def live_cookies() -> set[int]:
    """Cookies of every full TCP socket (IPv4 and IPv6) of this namespace, from one
    sock_diag dump per family (parsed here: ~1 us per socket, where pyroute2 took
    ~60 us)."""
    cookies: set[int] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = _REQ.pack(family, socket.IPPROTO_TCP, 0, FULL_SOCKET_STATES)
            nl.send(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY,
                                NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req)
            try:
                while not parse_cookies(nl.recv(1 << 16), cookies):
                    pass
            except OSError:
                if family == socket.AF_INET:
                    raise
                # no IPv6 in this kernel or namespace: no IPv6 sockets either
    return cookies


@dataclass
class Sweeper:
    """State of the sweep of one probe: when each socket was last found alive."""

    quiet_s: float = 1.0
    recheck_s: float = 10.0
    every_s: float = 10.0
    alive_at: dict[tuple[int, int], float] = field(default_factory=dict)   # (sk, cookie) -> s
    next_ns: int = 0

    def due(self, now_ns: int) -> bool:
        """Whether to sweep now (every every_s): reading the socket table is a map
        syscall, and tracepoint programs skip hits on its CPU while it runs."""
        if now_ns < self.next_ns:
            return False
        self.next_ns = now_ns + int(self.every_s * 1e9)
        return True

    def candidates(self, keys: np.ndarray, socks: np.ndarray, now_ns: int) -> list[int]:
        """Indices of the entries to ask about: cookie known, made before the quiet
        period, not found alive within recheck_s."""
        out = []
        for i in np.nonzero((socks["cookie"] != 0) &
                            (socks["made_ns"] < now_ns - int(self.quiet_s * 1e9)))[0]:
            seen = self.alive_at.get((int(keys[i]), int(socks["cookie"][i])))
            if seen is None or now_ns / 1e9 - seen >= self.recheck_s:
                out.append(int(i))
        return out

    def gone(self, keys: np.ndarray, socks: np.ndarray, picks: list[int], now_ns: int,
             live: set[int]) -> list[tuple[int, int]]:
        """(socket address, cookie) of the candidates (picks, from candidates()) not
        alive; remembers the living."""
        out = []
        for i in picks:
            key = (int(keys[i]), int(socks["cookie"][i]))
            if key[1] in live:
                self.alive_at[key] = now_ns / 1e9
            else:
                out.append(key)
        # forget sockets no longer in the table (closed, or swept now)
        present = {(int(k), int(c)) for k, c in zip(keys, socks["cookie"])}
        for key in [k for k in self.alive_at if k not in present]:
            del self.alive_at[key]
        return out


class Sweep(ctypes.Structure):
    """struct fs_sweep (bpf/tcp_flows.h)."""

    _fields_ = [("sk", ctypes.c_uint64), ("cookie", ctypes.c_uint64)]


def replay_destroy(prog_fd: int, sweeping_map, sk: int, cookie: int) -> None:
    """Run the raw tcp_destroy_sock program for socket address sk, marked as the sweep's
    (the program closes the entry only while it still holds this cookie)."""
    zero = ctypes.c_int(0)
    sweeping_map[zero] = Sweep(sk, cookie)
    try:
        nic_bpfmap.raw_tp_test_run(prog_fd, [sk])
    finally:
        sweeping_map[zero] = Sweep(0, 0)
