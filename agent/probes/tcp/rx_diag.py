"""One sock_diag dump of the namespace's connected TCP sockets with their tcp_info
(INET_DIAG_INFO, what `ss -ti` prints), kept for the sockets on the node's own
addresses.

Spoken as agent/probes/tcp/sweep.py speaks NETLINK_SOCK_DIAG (one dump request per
family), with idiag_ext asking for INET_DIAG_INFO. Each answer is

    nlmsghdr (16) | inet_diag_msg (72) | rtattr ... (INET_DIAG_INFO = 2: struct tcp_info)

    struct inet_diag_msg {                          offset in the message
        __u8  idiag_family, state, timer, retrans;  16
        struct inet_diag_sockid {
            __be16 sport, dport;                    20
            __be32 src[4], dst[4];                  24, 40  (IPv4: first 4 bytes)
            __u32  if; __u32 cookie[2];             56, 60
        } id;
        __u32 expires, rqueue, wqueue, uid, inode;  68
    };

Only the states that carry data are asked for (ESTABLISHED and the closing ones):
listeners, TIME_WAIT and request sockets have no receive counters.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import NamedTuple

from fabricscope.agent.probes.tcp.common import addr_text
from fabricscope.agent.probes.tcp.sweep import (_NLMSG, NETLINK_SOCK_DIAG, NLM_F_DUMP, NLM_F_REQUEST,
                                    NLMSG_DONE, NLMSG_ERROR, SOCK_DIAG_BY_FAMILY)
from fabricscope.agent.probes.tcp.tcp_info import decode_rx

INET_DIAG_INFO = 2
_REQ = struct.Struct("=BBBxI48x")    # inet_diag_req_v2 without a socket id
#: nlmsghdr len and type, then inet_diag_msg's family, ports (big-endian, swapped
#: below), src, dst and cookie: one unpack per answer
_HEAD = struct.Struct("=IH10xB3xHH16s16s4xQ")
_RTA = struct.Struct("=HH")          # rta_len, rta_type
_ATTRS_AT = 16 + 72                  # nlmsghdr, inet_diag_msg
#: ESTABLISHED, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK, CLOSING
DATA_STATES = sum(1 << s for s in (1, 4, 5, 8, 9, 11))
_V4_MAPPED = bytes(10) + b"\xff\xff"
_RECV_BYTES = 1 << 17


def _swap16(port: int) -> int:
    return ((port & 0xFF) << 8) | (port >> 8)


class SockRx(NamedTuple):
    """One socket's receive-side counters at the dump (tcp_info.decode_rx)."""

    cookie: int
    flow: tuple[str, int, str, int]    # (local address, local port, peer, peer port)
    rcv_rtt: int                       # us, 0: no estimate
    data_segs_in: int
    rcv_ooopack: int | None            # None before Linux 5.4


def _info_attr(buf: bytes, start: int, end: int) -> tuple[int, int]:
    """(offset, size) of the INET_DIAG_INFO payload among the rtattrs in
    buf[start:end]; size 0 when there is none (SHUTDOWN, MARK, CGROUP_ID, SOCKOPT
    come first)."""
    unpack = _RTA.unpack_from
    while start + 4 <= end:
        length, kind = unpack(buf, start)
        if kind == INET_DIAG_INFO:
            return start + 4, min(length, end - start) - 4
        if length < 4:
            break
        start += (length + 3) & ~3
    return start, 0


def parse_rx_messages(buf: bytes, own: frozenset[bytes] | None, out: list[SockRx],
                      counts: dict[str, int]) -> bool:
    """Append a SockRx per answer of one recv() whose local address is in own (16-byte
    keys; None: every socket) to out; True at NLMSG_DONE. An answer whose tcp_info is
    cut short is counted in counts["rx_info_undecodable"]; one without any (a
    time-wait socket) is skipped. Raises OSError on an
    NLMSG_ERROR message or a malformed header."""
    at, size = 0, len(buf)
    while at + 16 <= size:
        length, kind = _NLMSG.unpack_from(buf, at)[:2]
        if length < 16:
            raise OSError(errno.EPROTO, "sock_diag: malformed netlink message")
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            err = -struct.unpack_from("=i", buf, at + 16)[0]
            raise OSError(err, "sock_diag: " + os.strerror(err))
        end = min(at + length, size)
        if kind == SOCK_DIAG_BY_FAMILY and end >= at + _ATTRS_AT:
            _, _, family, sport, dport, src, dst, cookie = _HEAD.unpack_from(buf, at)
            if family == socket.AF_INET:
                src, dst = _V4_MAPPED + src[:4], _V4_MAPPED + dst[:4]
            info_at, info_size = _info_attr(buf, at + _ATTRS_AT, end) \
                if own is None or src in own else (0, 0)
            # a time-wait socket (FIN_WAIT2 handed to a minisock) carries no tcp_info
            # at all: it receives nothing more, so it is skipped, not undecodable
            if info_size:
                rx = decode_rx(buf, info_at, info_size)
                if rx is None:
                    counts["rx_info_undecodable"] = counts.get("rx_info_undecodable", 0) + 1
                else:
                    out.append(SockRx(cookie, (addr_text(src), _swap16(sport),
                                               addr_text(dst), _swap16(dport)), *rx))
        at += (length + 3) & ~3
    return False


def dump_rx(own: frozenset[bytes] | None, counts: dict[str, int]) -> list[SockRx]:
    """SockRx of every connected TCP socket (IPv4, then IPv6) of this namespace whose
    local address is in own. Raises OSError when the IPv4 table cannot be read; a
    kernel or namespace without IPv6 has no IPv6 sockets to read."""
    out: list[SockRx] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1),
                            DATA_STATES)
            nl.send(_NLMSG.pack(_NLMSG.size + len(req), SOCK_DIAG_BY_FAMILY,
                                NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req)
            try:
                while not parse_rx_messages(nl.recv(_RECV_BYTES), own, out, counts):
                    pass
            except OSError:
                if family == socket.AF_INET:
                    raise
    return out
