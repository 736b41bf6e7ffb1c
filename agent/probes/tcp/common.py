"""Python side of bpf/fs_common.h: the flow key mirror, addresses, TCP names, tracefs.

Shared by the TCP probes (tcp_retransmit, tcp_flows) so that both decode flows
and name states the same way.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import re
from pathlib import Path

from fabricscope.agent import bpf

# 0: not a state; a close seen only at socket teardown does not know the one before
TCP_STATES = {0: "UNKNOWN", 1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
              5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK",
              10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}


# Mirrors of bpf/fs_common.h (checked against the compiled layout at load).
class FsAddr(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint8 * 16)]


class FsFlow(ctypes.Structure):
    _fields_ = [("saddr", FsAddr), ("daddr", FsAddr), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16)]


def addr_key(text: str) -> bytes:
    """16-byte map key: IPv6 as is, IPv4 as v4-mapped (what the BPF side compares)."""
    ip = ipaddress.ip_address(text)
    if ip.version == 4:
        ip = ipaddress.IPv6Address("::ffff:" + str(ip))
    return ip.packed


def addr_text(raw) -> str:
    """Text of a 16-byte address (IPv4 from its v4-mapped form). Cached: a node talks to
    few peers, and ipaddress's formatting is most of what decoding an event costs."""
    return _addr_text(bytes(raw))


@functools.lru_cache(maxsize=4096)
def _addr_text(raw: bytes) -> str:
    ip = ipaddress.IPv6Address(raw)
    return str(ip.ipv4_mapped or ip)


def state_name(state: int) -> str:
    return TCP_STATES.get(state, str(state))


def flow_key(flow: FsFlow) -> tuple[str, int, str, int]:
    """(local address, local port, remote address, remote port): fabricscope.agent.probes.tcp.owners.FlowKey."""
    return (addr_text(flow.saddr.a), int(flow.sport), addr_text(flow.daddr.a), int(flow.dport))


def flow_tags(key: tuple[str, int, str, int]) -> dict[str, str]:
    return {"saddr": key[0], "sport": str(key[1]), "daddr": key[2], "dport": str(key[3])}


def fill_own_addrs(table, addresses) -> None:
    """Write the node's addresses into a program's `own_addrs` map."""
    for text in sorted(addresses):
        key = table.Key()
        ctypes.memmove(ctypes.addressof(key), addr_key(text), 16)
        table[key] = ctypes.c_uint8(1)


_FIELD = re.compile(r"field:(?P<type>[^;]*?)\s*(?P<name>\w+)(?:\[\d*\])?;")


def tracepoint_field_types(category: str, event: str,
                           tracefs: Path = bpf.TRACEFS) -> dict[str, str] | None:
    """{field name: C type} of a tracepoint (None when it does not exist)."""
    try:
        text = (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None
    return {m.group("name"): m.group("type").strip() for m in _FIELD.finditer(text)}
