"""Qdisc queue and drop counters of the watched interfaces, over netlink.

pyroute2's get_qdiscs returns TCA_STATS2 with TCA_STATS_BASIC (bytes, packets)
and TCA_STATS_QUEUE (qlen, backlog, drops, requeues, overlimits). Counters are
reported as growth per window (from a baseline taken at attach), queue depths
as read. clsact and ingress carry no queue and are skipped. A qdisc replaced
meanwhile (counters going down) restarts from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

SKIP_KINDS = {"clsact", "ingress"}
TC_H_ROOT = 0xFFFFFFFF
COUNTERS = ("drops", "overlimits", "requeues", "bytes", "packets")


@dataclass(frozen=True)
class QdiscStat:
    ifindex: int
    kind: str
    handle: str
    parent: str
    backlog_bytes: int
    qlen: int
    drops: int
    overlimits: int
    requeues: int
    bytes: int
    packets: int

    @property
    def key(self) -> tuple:
        return (self.ifindex, self.kind, self.handle, self.parent)


def handle_text(value: int) -> str:
    if value == TC_H_ROOT:
        return "root"
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


def parse(msg) -> QdiscStat | None:
    """One RTM_NEWQDISC message -> QdiscStat (None for clsact/ingress or no stats)."""
    kind = msg.get_attr("TCA_KIND")
    stats2 = msg.get_attr("TCA_STATS2")
    if kind in SKIP_KINDS or stats2 is None:
        return None
    queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
    basic = stats2.get_attr("TCA_STATS_BASIC") or {}
    return QdiscStat(int(msg["index"]), str(kind), handle_text(msg["handle"]),
                     handle_text(msg["parent"]), int(queue.get("backlog", 0)),
                     int(queue.get("qlen", 0)), int(queue.get("drops", 0)),
                     int(queue.get("overlimits", 0)), int(queue.get("requeues", 0)),
                     int(basic.get("bytes", 0)), int(basic.get("packets", 0)))


def read(ipr, ifindexes: list[int]) -> list[QdiscStat]:
    """Qdiscs of the given interfaces. `ipr`: a pyroute2 IPRoute opened in the agent's
    namespace and kept open (a fresh one per read costs ~10 ms of CPU)."""
    from pyroute2.netlink.exceptions import NetlinkError

    out: list[QdiscStat] = []
    for ifindex in ifindexes:
        try:
            msgs = ipr.get_qdiscs(index=ifindex)
        except NetlinkError:        # interface gone
            continue
        out += [s for s in map(parse, msgs) if s is not None and s.ifindex == ifindex]
    return out


class QdiscDeltas:
    def __init__(self, baseline: list[QdiscStat]):
        self._prev = {s.key: s for s in baseline}

    def update(self, current: list[QdiscStat]) -> list[QdiscStat]:
        """Same stats with the counters replaced by their growth since the last update."""
        out = []
        for s in current:
            old = self._prev.get(s.key)
            grown = {c: getattr(s, c) - (getattr(old, c) if old else 0) for c in COUNTERS}
            if old is not None and any(v < 0 for v in grown.values()):
                grown = {c: getattr(s, c) for c in COUNTERS}
            out.append(QdiscStat(s.ifindex, s.kind, s.handle, s.parent, s.backlog_bytes,
                                 s.qlen, **grown))
        self._prev = {s.key: s for s in current}
        return out
