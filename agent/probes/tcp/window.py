"""Window aggregation of the tcp_flows probe (pure logic: numpy in, Records out).

Input per window: the finished slot of every flow's per-CPU value (the kernel's
fs_flow_stat, see bpf/tcp_flows.bpf.c), the window's retransmit records, and
the node's TC egress totals. Per-CPU slots are merged (sums, histograms, min of
minima, max of maxima; slots of another generation are stale and left out), RTT
percentiles come from the merged log2 histogram, and one `tcp_flow` record per
active flow plus one `tcp_node` record are written.

Percentiles from a log2 histogram: the nearest rank picks the bucket, the value
is interpolated linearly inside it by rank and clamped to the observed min and
max, so it is always inside the right power-of-two bucket, and exact when every
sample is equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fabricscope.agent.probes.tcp.common import flow_tags
from fabricscope.agent.probes.tcp.flow_layout import SSTHRESH_INFINITE
from fabricscope.records import Record

U32_MAX = 0xFFFFFFFF
_SUM = ("segs_in", "rtt_samples", "acked", "rtt_sum_us", "rtt_sumsq_us", "received")
_MIN = ("rtt_min_us", "cwnd_min", "ssthresh_min")
_MAX = ("rtt_max_us", "cwnd_max", "ssthresh_max")


def merge_slots(slots: np.ndarray, gen: int) -> dict[str, np.ndarray]:
    """slots: (flows, cpus) array of SLOT_DTYPE -> per-flow merged columns.

    Only slots whose gen equals `gen` count; `active` says which flows had any."""
    valid = slots["gen"] == gen
    out = {name: np.where(valid, slots[name], 0).astype(np.uint64).sum(axis=1)
           for name in _SUM}
    for name in _MIN:
        out[name] = np.where(valid, slots[name], U32_MAX).min(axis=1)
    for name in _MAX:
        out[name] = np.where(valid, slots[name], 0).max(axis=1)
    for name in ("rtt_hist", "cwnd_hist"):
        out[name] = (slots[name] * valid[..., None]).astype(np.uint64).sum(axis=1)
    out["active"] = valid.any(axis=1)
    return out


def bucket_bounds(index: int, buckets: int) -> tuple[float, float]:
    """[low, high) of a log2 bucket: 0 holds [0, 2), i holds [2^i, 2^(i+1))."""
    low = 0.0 if index == 0 else float(1 << index)
    high = math.inf if index == buckets - 1 else float(1 << (index + 1))
    return low, high


def quantile_log2(hist, q: float, lo: float, hi: float) -> float | None:
    """q-quantile (0..1] of samples counted in a log2 histogram with known min/max."""
    counts = [int(c) for c in hist]
    total = sum(counts)
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(counts):
        if seen + count >= rank:
            low, high = bucket_bounds(index, len(counts))
            low, high = max(low, lo), min(high, hi)
            value = low + (rank - seen - 0.5) / count * (high - low)
            return float(min(max(value, lo), hi))
        seen += count
    return float(hi)


@dataclass
class FlowRetrans:
    """Retransmits of one flow in one window (from tcp_retransmit records)."""

    segs: int = 0
    bytes: int = 0
    events: int = 0
    timeouts: int = 0


@dataclass
class NodeTally:
    """Node totals of one window that do not come from the flow map."""

    segs_by_kind: dict[str, int] = field(default_factory=dict)
    timeouts: int = 0
    resets_sent: int = 0
    resets_received: int = 0
    opens: int = 0
    closes: int = 0

    def add_record(self, rec: Record) -> None:
        if rec.measurement == "tcp_retransmit":
            kind = rec.tags.get("kind", "unknown")
            self.segs_by_kind[kind] = self.segs_by_kind.get(kind, 0) + int(rec.fields["segs"])
            self.timeouts += kind in ("rto", "syn", "synack")
        elif rec.measurement == "tcp_reset":
            if rec.tags.get("direction") == "sent":
                self.resets_sent += 1
            else:
                self.resets_received += 1
        elif rec.measurement == "tcp_flow_open":
            self.opens += 1
        elif rec.measurement == "tcp_flow_close":
            self.closes += 1


def flow_fields(m: dict[str, np.ndarray], i: int, seconds: float) -> dict[str, int | float]:
    """tcp_flow fields of merged flow i (without retransmits)."""
    segs_in = int(m["segs_in"][i])
    acked = int(m["acked"][i])
    received = int(m["received"][i])
    out: dict[str, int | float] = {"seconds": seconds, "segs_in": segs_in, "bytes_acked": acked,
                                   "acked_bps": acked * 8 / seconds if seconds > 0 else 0.0,
                                   "bytes_received": received,
                                   "received_bps": received * 8 / seconds if seconds > 0
                                   else 0.0}
    if segs_in:
        out["cwnd_min"] = int(m["cwnd_min"][i])
        out["cwnd_max"] = int(m["cwnd_max"][i])
    if int(m["ssthresh_max"][i]) and int(m["ssthresh_min"][i]) < SSTHRESH_INFINITE:
        out["ssthresh_min"] = int(m["ssthresh_min"][i])
        out["ssthresh_max"] = int(m["ssthresh_max"][i])
    n = int(m["rtt_samples"][i])
    out["rtt_samples"] = n
    if n:
        lo, hi = float(m["rtt_min_us"][i]), float(m["rtt_max_us"][i])
        mean = int(m["rtt_sum_us"][i]) / n
        var = max(0.0, int(m["rtt_sumsq_us"][i]) / n - mean * mean)
        out.update(rtt_min_us=lo, rtt_max_us=hi, rtt_mean_us=mean, rtt_stddev_us=math.sqrt(var))
        for name, q in (("rtt_p50_us", 0.5), ("rtt_p90_us", 0.9), ("rtt_p99_us", 0.99)):
            out[name] = quantile_log2(m["rtt_hist"][i], q, lo, hi)
    return out


def flow_record(key, fields: dict, retrans: FlowRetrans | None, start_ns: int,
                owner_tags: dict[str, str]) -> Record:
    fields = dict(fields)
    r = retrans or FlowRetrans()
    fields.update(retrans_segs=r.segs, retrans_bytes=r.bytes, timeouts=r.timeouts)
    return Record("tcp_flow", start_ns, {**flow_tags(key), **owner_tags}, fields)


def retrans_only_fields(seconds: float) -> dict[str, int | float]:
    """tcp_flow fields of a flow that only retransmitted in the window (no ACK seen)."""
    return {"seconds": seconds, "segs_in": 0, "bytes_acked": 0, "acked_bps": 0.0,
            "bytes_received": 0, "received_bps": 0.0, "rtt_samples": 0}


def node_record(start_ns: int, seconds: float, flows: int, bytes_acked: int,
                out_delta: tuple[int, int], retrans: dict, tally: NodeTally) -> Record:
    """tcp_node: out_delta = (segments, payload bytes) seen on TC egress in the window."""
    segs_out, bytes_out = out_delta
    r_segs = sum(r.segs for r in retrans.values())
    r_bytes = sum(r.bytes for r in retrans.values())
    fields: dict[str, int | float] = {
        "seconds": seconds, "flows": flows, "bytes_acked": bytes_acked,
        "segs_out": segs_out, "bytes_out": bytes_out,
        "retrans_segs": r_segs, "retrans_bytes": r_bytes,
        "retrans_ratio": r_bytes / bytes_out if bytes_out else 0.0,
        "retrans_seg_ratio": r_segs / segs_out if segs_out else 0.0,
        "timeouts": tally.timeouts, "resets_sent": tally.resets_sent,
        "resets_received": tally.resets_received, "opens": tally.opens,
        "closes": tally.closes}
    for kind in ("fast", "rto", "slow_start", "tlp", "syn", "synack", "unknown"):
        fields[f"{kind}_segs"] = tally.segs_by_kind.get(kind, 0)
    return Record("tcp_node", start_ns, {}, fields)
