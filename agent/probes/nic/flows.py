"""Per-flow deltas from the NIC flow map (decoding is pure: unit-tested without root).

The BPF side only adds to per-CPU counters (struct fs_nic_flow_val in bpf/nic.h);
at each window end the probe reads the whole map in one batch, sums the CPUs,
and reports the growth since the previous read. Deleting on read would race with
a CPU adding to the entry it just looked up (the add lands in freed memory), so
entries stay until idle for `idle_ns` and are then deleted; a flow that resumes
after that starts a new entry. The LRU map evicts the least recently used entry
when full: an entry that vanished without our delete was evicted, and its growth
since our last read is lost; we count evictions (`flows_evicted`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Callable

import numpy as np

KEY_DTYPE = np.dtype([("saddr", "u1", 16), ("daddr", "u1", 16), ("ifindex", "<u4"),
                      ("sport", "<u2"), ("dport", "<u2"), ("proto", "u1"), ("family", "u1"),
                      ("dir", "u1"), ("pad", "u1")])
VAL_DTYPE = np.dtype([("bytes", "<u8"), ("last_ns", "<u8"), ("packets", "<u4"), ("ce", "<u4"),
                      ("dscp", "u1"), ("pad", "u1", 7)])
PROTO_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6", 132: "sctp"}
DIRECTIONS = ("rx", "tx")
_U32 = 1 << 32


@dataclass(frozen=True)
class FlowDelta:
    ifindex: int
    direction: str
    proto: str
    saddr: str
    daddr: str
    sport: int
    dport: int
    bytes: int
    packets: int
    ce_marks: int
    dscp: int


def _addr(raw: np.ndarray, family: int) -> str:
    data = bytes(raw)
    return str(ipaddress.IPv4Address(data[:4]) if family == 4 else ipaddress.IPv6Address(data))


def decode(keys: bytes, values: bytes, count: int, cpus: int):
    """Raw batch buffers -> (key records, per-flow sums: bytes, packets, ce, last_ns, dscp)."""
    k = np.frombuffer(keys, KEY_DTYPE, count)
    v = np.frombuffer(values, VAL_DTYPE, count * cpus).reshape(count, cpus)
    newest = v["last_ns"].argmax(axis=1) if count else np.zeros(0, np.int64)
    sums = {"bytes": v["bytes"].sum(axis=1, dtype=np.uint64),
            "packets": v["packets"].astype(np.int64).sum(axis=1),
            "ce": v["ce"].astype(np.int64).sum(axis=1),
            "last_ns": v["last_ns"].max(axis=1) if count else np.zeros(0, np.uint64),
            "dscp": v["dscp"][np.arange(count), newest]}
    return k, sums


class FlowTable:
    """Growth of every flow between reads. `delete(raw_key)` removes one map entry."""

    def __init__(self, cpus: int, idle_ns: int, delete: Callable[[bytes], None]):
        self.cpus, self.idle_ns, self._delete = cpus, idle_ns, delete
        self._prev: dict[bytes, tuple[int, int, int]] = {}
        self.evicted = 0
        self.deleted = 0

    def update(self, keys: bytes, values: bytes, count: int, now_ns: int) -> list[FlowDelta]:
        k, sums = decode(keys, values, count, self.cpus)
        raw = [bytes(keys[i * KEY_DTYPE.itemsize:(i + 1) * KEY_DTYPE.itemsize])
               for i in range(count)]
        seen: dict[bytes, tuple[int, int, int]] = {}
        out: list[FlowDelta] = []
        by, pk, ce = sums["bytes"].tolist(), sums["packets"].tolist(), sums["ce"].tolist()
        for i, key in enumerate(raw):
            cur = (by[i], pk[i], ce[i])
            seen[key] = cur
            old = self._prev.get(key)
            if old is None or cur[0] < old[0]:
                delta = cur                       # new entry (or one re-created)
            else:
                delta = (cur[0] - old[0], (cur[1] - old[1]) % _U32, (cur[2] - old[2]) % _U32)
            if delta[0] or delta[1]:
                out.append(self._delta(k[i], delta, int(sums["dscp"][i])))
        self.evicted += sum(1 for key in self._prev if key not in seen)
        idle = [key for i, key in enumerate(raw) if now_ns - int(sums["last_ns"][i]) > self.idle_ns]
        for key in idle:
            self._delete(key)
            seen.pop(key, None)
        self.deleted += len(idle)
        self._prev = seen
        return out

    @staticmethod
    def _delta(key, delta: tuple[int, int, int], dscp: int) -> FlowDelta:
        family = int(key["family"])
        proto = int(key["proto"])
        return FlowDelta(int(key["ifindex"]), DIRECTIONS[int(key["dir"]) & 1],
                         PROTO_NAMES.get(proto, str(proto)), _addr(key["saddr"], family),
                         _addr(key["daddr"], family), int(key["sport"]), int(key["dport"]),
                         int(delta[0]), int(delta[1]), int(delta[2]), dscp)
