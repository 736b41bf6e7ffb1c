"""What the engine knows of a job: per-second tables of its nodes' and flows' evidence,
and its ranks' steps and phases, as read from the store (diagnosis/source.py).

The agents' records are already aggregated in the kernel and per window; the
engine reads them back per second (InfluxQL GROUP BY time(1s)) and keeps a
sliding horizon in memory. Seconds are UNIX seconds (int); a record's second is
that of its window start. Evaluation windows sum seconds (`Window`), so the
live engine and `diagnose --recompute` aggregate with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SECOND = 1_000_000_000


@dataclass
class CellSecond:
    """One node's flows to one peer address in one second (tcp_flow, summed)."""

    bytes_acked: int = 0
    bytes_received: int = 0
    retrans_segs: int = 0
    retrans_bytes: int = 0
    timeouts: int = 0
    rtt_p50_us: float | None = None
    rtt_p90_us: float | None = None
    rtt_samples: int = 0


@dataclass(frozen=True)
class CellKey:
    node: str        # the sending side's node
    addr: str        # its address
    peer: str        # the remote address
    rank: str        # the owning process's rank ('' when none)


@dataclass
class NodeSecond:
    """One node in one second: TCP totals (tcp_node), NIC peaks (nic_window), qdiscs."""

    segs_out: int = 0
    retrans_segs: int = 0
    timeouts: int = 0
    bytes_out: int = 0
    tx_peak_util: float = 0.0
    rx_peak_util: float = 0.0
    hot_bins: int = 0
    bursts: int = 0
    qdisc_drops: int = 0
    qdisc_backlog_bytes: int = 0


@dataclass(frozen=True)
class Step:
    """One inferred training step of one rank (gloo_step)."""

    rank: str
    node: str
    time_ns: int
    seconds: float | None          # None: the rank's last step so far (no length yet)
    sync_seconds: float
    compute_seconds: float | None
    retrans_segs: int = 0
    sync_retrans_segs: int = 0

    @property
    def end_ns(self) -> int:
        return self.time_ns + int((self.seconds or self.sync_seconds) * SECOND)


@dataclass(frozen=True)
class Phase:
    """A data_load or checkpoint phase of a rank (gloo_phase)."""

    rank: str
    node: str
    time_ns: int
    phase: str
    seconds: float
    bytes: int
    peer: str


@dataclass
class JobEvidence:
    job: str
    cells: dict[CellKey, dict[int, CellSecond]] = field(default_factory=dict)
    nodes: dict[str, dict[int, NodeSecond]] = field(default_factory=dict)
    steps: dict[str, dict[int, Step]] = field(default_factory=dict)          # rank -> time -> step
    phases: dict[str, dict[tuple, Phase]] = field(default_factory=dict)
    node_of_rank: dict[str, str] = field(default_factory=dict)
    addr_node: dict[str, str] = field(default_factory=dict)                 # address -> node
    last_seen_ns: dict[str, int] = field(default_factory=dict)              # node -> latest window
    lost_records: dict[str, int] = field(default_factory=dict)              # node -> agent_loss

    def merge(self, other: "JobEvidence") -> None:
        """Take what `other` read (newer reads of a second replace older ones)."""
        for key, seconds in other.cells.items():
            self.cells.setdefault(key, {}).update(seconds)
        for node, seconds in other.nodes.items():
            self.nodes.setdefault(node, {}).update(seconds)
        for rank, steps in other.steps.items():
            self.steps.setdefault(rank, {}).update(steps)
        for rank, phases in other.phases.items():
            self.phases.setdefault(rank, {}).update(phases)
        self.node_of_rank.update(other.node_of_rank)
        self.addr_node.update(other.addr_node)
        for node, ns in other.last_seen_ns.items():
            self.last_seen_ns[node] = max(ns, self.last_seen_ns.get(node, 0))
        for node, n in other.lost_records.items():
            self.lost_records[node] = max(n, self.lost_records.get(node, 0))

    def prune(self, before_s: int, steps_before_ns: int) -> None:
        """Forget seconds before `before_s` and steps before `steps_before_ns` (the
        engine keeps its baselines as numbers, not as rows)."""
        for table in list(self.cells.values()) + list(self.nodes.values()):
            for s in [s for s in table if s < before_s]:
                del table[s]
        for steps in self.steps.values():
            for t in [t for t in steps if t < steps_before_ns]:
                del steps[t]
        for phases in self.phases.values():
            for k in [k for k in phases if k[0] < steps_before_ns]:
                del phases[k]

    # -- views ----------------------------------------------------------------------
    def latest_second(self) -> int | None:
        seconds = [s for table in self.nodes.values() for s in table]
        return max(seconds) if seconds else None

    def ranks(self) -> list[str]:
        return sorted(self.steps, key=_rank_order)

    def window(self, start_s: int, end_s: int) -> "Window":
        return Window(self, start_s, end_s)


def weighted_median(pairs: list[tuple[float, int]]) -> float | None:
    """The value below which half the weight lies ((value, weight) pairs)."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    acc = 0
    for value, weight in pairs:
        acc += weight
        if acc * 2 >= total:
            return float(value)
    return None


def _rank_order(rank: str):
    return (0, int(rank)) if rank.isdigit() else (1, rank)


@dataclass
class CellTotals:
    key: CellKey
    peer_node: str | None
    bytes_acked: int = 0
    bytes_received: int = 0
    retrans_segs: int = 0
    retrans_bytes: int = 0
    timeouts: int = 0
    rtt_p50_us: float | None = None      # median over the window's seconds
    rtt_p90_us: float | None = None
    rtt_samples: int = 0
    seconds: int = 0

    @property
    def loss_ratio(self) -> float:
        """Payload retransmitted / payload delivered: the share of the bytes resent."""
        sent = self.bytes_acked + self.retrans_bytes
        return self.retrans_bytes / sent if sent else 0.0


@dataclass
class NodeTotals:
    node: str
    segs_out: int = 0
    retrans_segs: int = 0
    timeouts: int = 0
    bytes_out: int = 0
    tx_peak_util: float = 0.0
    rx_peak_util: float = 0.0
    hot_bins: int = 0
    bursts: int = 0
    qdisc_drops: int = 0
    qdisc_backlog_bytes: int = 0
    seconds: int = 0

    @property
    def retrans_ratio(self) -> float:
        return self.retrans_segs / self.segs_out if self.segs_out else 0.0


class Window:
    """The evidence of seconds [start_s, end_s) of a job, summed."""

    def __init__(self, ev: JobEvidence, start_s: int, end_s: int):
        self.ev, self.start_s, self.end_s = ev, start_s, end_s

    @property
    def start_ns(self) -> int:
        return self.start_s * SECOND

    @property
    def end_ns(self) -> int:
        return self.end_s * SECOND

    def cells(self) -> list[CellTotals]:
        out = []
        for key, table in self.ev.cells.items():
            secs = [table[s] for s in range(self.start_s, self.end_s) if s in table]
            if not secs:
                continue
            c = CellTotals(key, self.ev.addr_node.get(key.peer), seconds=len(secs))
            for s in secs:
                c.bytes_acked += s.bytes_acked
                c.bytes_received += s.bytes_received
                c.retrans_segs += s.retrans_segs
                c.retrans_bytes += s.retrans_bytes
                c.timeouts += s.timeouts
                c.rtt_samples += s.rtt_samples
            # weighted by samples: a second of a few RTT samples (a quiet moment, a
            # checkpoint's pause) must not outvote seconds of thousands
            sampled = [s for s in secs if s.rtt_p50_us is not None and s.bytes_acked
                       and s.rtt_samples]
            c.rtt_p50_us = weighted_median([(s.rtt_p50_us, s.rtt_samples) for s in sampled])
            c.rtt_p90_us = weighted_median([(s.rtt_p90_us, s.rtt_samples) for s in sampled
                                            if s.rtt_p90_us is not None])
            out.append(c)
        return out

    def nodes(self) -> dict[str, NodeTotals]:
        out = {}
        for node, table in self.ev.nodes.items():
            secs = [table[s] for s in range(self.start_s, self.end_s) if s in table]
            t = out[node] = NodeTotals(node, seconds=len(secs))
            for s in secs:
                t.segs_out += s.segs_out
                t.retrans_segs += s.retrans_segs
                t.timeouts += s.timeouts
                t.bytes_out += s.bytes_out
                t.tx_peak_util = max(t.tx_peak_util, s.tx_peak_util)
                t.rx_peak_util = max(t.rx_peak_util, s.rx_peak_util)
                t.hot_bins += s.hot_bins
                t.bursts += s.bursts
                t.qdisc_drops += s.qdisc_drops
                t.qdisc_backlog_bytes = max(t.qdisc_backlog_bytes, s.qdisc_backlog_bytes)
        return out

    def steps(self) -> dict[str, list[Step]]:
        """Each rank's complete steps that ended inside the window (by end time)."""
        lo, hi = self.start_ns, self.end_ns
        return {rank: sorted((s for s in steps.values()
                              if s.seconds is not None and lo <= s.end_ns < hi),
                             key=lambda s: s.time_ns)
                for rank, steps in self.ev.steps.items()}
