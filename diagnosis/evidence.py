"""What the engine knows of a job: per-second tables of its nodes' and flows' evidence,
and its ranks' steps and phases, as read from the store (diagnosis/source.py).

The agents' records are already aggregated in the kernel and per window; the
engine reads them back and sums them per second (diagnosis/source.py) and keeps a
sliding horizon in memory. Seconds are UNIX seconds (int); a record's second is
that of its window start. Evaluation windows sum seconds (`Window`), so the
live engine and `diagnose --recompute` aggregate with the same code.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass, field
from typing import NamedTuple

SECOND = 1_000_000_000


# The per-second rows and the steps and phases are NamedTuples: an engine holds about
# a million of them per thousand nodes (steps and phases of its horizon), and a tuple
# is built, compared and stored without the instance dict of a dataclass. The
# garbage collector still tracks them (it untracks exact tuples only), so a full
# collection walks them all: ~0.3 s at a thousand nodes, once every few dozen ticks.
class CellSecond(NamedTuple):
    """One node's flows to one peer address in one second (tcp_flow, summed)."""

    bytes_acked: int = 0
    bytes_received: int = 0
    retrans_segs: int = 0
    retrans_bytes: int = 0
    timeouts: int = 0
    rtt_p50_us: float | None = None
    rtt_p90_us: float | None = None
    rtt_samples: int = 0
    rx_data_segs: int = 0          # data segments the node's sockets to the peer received
    rx_ooo_pkts: int = 0           # ... of them queued out of order (a hole before them)


class CellKey(NamedTuple):
    """A cell: one node's flows to one peer address (a tuple: a tick builds and hashes
    one for every series it reads, which a frozen dataclass made a visible cost)."""

    node: str        # the sending side's node
    addr: str        # its address
    peer: str        # the remote address
    rank: str        # the owning process's rank ('' when none)


class NodeSecond(NamedTuple):
    """One node in one second: TCP totals (tcp_node), NIC peaks (nic_window), qdiscs."""

    segs_out: int = 0
    retrans_segs: int = 0
    timeouts: int = 0
    bytes_out: int = 0
    tx_peak_util: float = 0.0      # of the line rate; 0 where the link has none (virtual)
    rx_peak_util: float = 0.0
    hot_bins: int = 0
    bursts: int = 0
    qdisc_drops: int = 0
    qdisc_backlog_bytes: int = 0
    tx_peak_bps: float = 0.0       # the busiest 100 us bin, as a rate: known on every link
    rx_peak_bps: float = 0.0


class StepSource(enum.StrEnum):
    """Where a job's steps come from (diagnosis/source.py reads one per job). The value
    is the measurement of the steps; `sync` names the one their grad sync comes from."""

    GLOO = "gloo_step"                  # the gloo probe: steps, grad sync, progress
    NCCL = "nccl_step"                  # NCCL calls' enqueue times: no grad sync split
    NCCL_PROFILED = "nccl_step+ncclprof"  # ... with the profiler plugin's kernel windows

    @property
    def steps(self) -> str:
        """The measurement the step times come from."""
        return "gloo_step" if self is StepSource.GLOO else "nccl_step"

    @property
    def sync(self) -> str:
        """The measurement the grad sync (time inside the collectives) comes from."""
        return {StepSource.GLOO: "gloo_step", StepSource.NCCL: "nccl_step",
                StepSource.NCCL_PROFILED: "ncclprof_collective"}[self]

    @property
    def progress(self) -> str:
        """The measurement of the steps in progress (only gloo reports them)."""
        return "gloo_progress"


class Step(NamedTuple):
    """One inferred training step of one rank (from the measurement `source` names)."""

    rank: str
    node: str
    time_ns: int
    seconds: float | None          # None: the rank's last step so far (no length yet)
    sync_seconds: float
    compute_seconds: float | None
    retrans_segs: int = 0
    sync_retrans_segs: int = 0
    throttled_seconds: float | None = None   # its CPU cgroup's throttled time (None: unread)
    cpu_limit: float | None = None           # that cgroup's quota in CPUs (None: none)
    cpu_limit_held: bool = False             # the same quota from the step's start to end
    source: StepSource = StepSource.GLOO

    @property
    def end_ns(self) -> int:
        return self.time_ns + int((self.seconds or self.sync_seconds) * SECOND)


class Progress(NamedTuple):
    """The step a rank is in, as its agent last reported it (gloo_progress): each
    value so far, a lower bound of the step's own."""

    rank: str
    node: str
    time_ns: int                   # the step's start (its gloo_step will have it)
    seconds: float
    sync_seconds: float
    waiting: bool                  # inside a gradient AllReduce at the report
    throttled_seconds: float | None = None

    def as_step(self) -> Step:
        """The step so far, as a Step whose values are lower bounds."""
        return Step(self.rank, self.node, self.time_ns, self.seconds, self.sync_seconds,
                    max(0.0, self.seconds - self.sync_seconds),
                    throttled_seconds=self.throttled_seconds)


class Phase(NamedTuple):
    """A data_load or checkpoint phase of a rank (gloo_phase)."""

    rank: str
    node: str
    time_ns: int
    phase: str
    seconds: float
    bytes: int
    peer: str


class RasState(enum.StrEnum):
    """A rank's trouble as NCCL's RAS reports it (nccl_ras_rank's `state` tag)."""

    DEAD = "dead"                      # silent for ~60 s
    UNRESPONSIVE = "unresponsive"      # did not answer RAS's status collective
    MISSING = "missing"
    ERROR = "error"
    ABORTED = "aborted"


#: the states that say the rank no longer takes part: its job hangs on it
RAS_HANGING = frozenset({RasState.DEAD, RasState.UNRESPONSIVE})


class RasRank(NamedTuple):
    """One rank of a communicator in trouble at one RAS status poll (nccl_ras_rank)."""

    comm: str
    rank: str                          # its rank in the communicator
    time_ns: int                       # the poll
    state: str                         # a RasState value (unknown ones are kept as read)
    host: str


class Reports(NamedTuple):
    """JobEvidence.latest_reports: rank -> its latest step start and phase start (ns)."""

    step_ns: dict[str, int]
    phase_ns: dict[str, int]


@dataclass
class JobEvidence:
    job: str
    cells: dict[CellKey, dict[int, CellSecond]] = field(default_factory=dict)
    nodes: dict[str, dict[int, NodeSecond]] = field(default_factory=dict)
    steps: dict[str, dict[int, Step]] = field(default_factory=dict)          # rank -> time -> step
    phases: dict[str, dict[tuple, Phase]] = field(default_factory=dict)
    progress: dict[str, dict[int, Progress]] = field(default_factory=dict)  # rank -> time ->
    node_of_rank: dict[str, str] = field(default_factory=dict)
    addr_node: dict[str, str] = field(default_factory=dict)                 # address -> node
    last_seen_ns: dict[str, int] = field(default_factory=dict)              # node -> latest window
    lost_records: dict[str, int] = field(default_factory=dict)              # node -> agent_loss
    ras_polls: dict[str, int] = field(default_factory=dict)       # comm -> its latest RAS poll
    ras_ranks: dict[tuple, RasRank] = field(default_factory=dict)  # (comm, rank) -> latest
    # the order of each rank's steps and phases, as evaluations walk them every tick:
    # kept up by merge and prune, rebuilt when a table was replaced or resized
    _order: dict = field(default_factory=dict, repr=False, compare=False)
    # each node's latest second, with the size and last key of its table when found
    # (latest_second: a tick asks several times, and a scan of every node's seconds
    # was a few ms at 1,000 nodes); cleared by prune, the only path that removes keys
    _latest_of: dict = field(default_factory=dict, repr=False, compare=False)

    def _ordered(self, table_name: str, rank: str, kind: str | None = None) -> list:
        table = getattr(self, table_name).get(rank, {})
        orders = self._order.setdefault((table_name, rank), {})
        order = orders.get(kind)
        if order is None or order.table is not table or order.size != len(table):
            order = orders[kind] = _Order(table, kind)
        return order.keys

    def step_times(self, rank: str) -> list[int]:
        """The start times of the rank's steps, in order (ev.steps[rank][t] is the step)."""
        return self._ordered("steps", rank)

    def phases_between(self, rank: str, kind: str, t0_ns: int, t1_ns: int) -> list[Phase]:
        """The rank's `kind` phases that started in [t0, t1), in time order: a bisection,
        since every evaluation asks this for each of a rank's recent steps."""
        return self.phases_of(rank, kind).between(t0_ns, t1_ns)

    def phases_of(self, rank: str, kind: str) -> "PhaseIndex":
        """The rank's `kind` phases in time order, for several lookups in a row (an
        evaluation asks for each of a rank's recent steps: looking the order up once
        per rank, not once per step, was a tenth of a tick at 1,000 ranks)."""
        keys = self._ordered("phases", rank, kind)
        return PhaseIndex(keys, self.phases[rank] if keys else {})

    def latest_phase_ns(self, rank: str) -> int:
        """When the rank's latest phase began (0: none yet)."""
        keys = self._ordered("phases", rank)
        return keys[-1][0] if keys else 0

    def latest_reports(self) -> "Reports":
        """What each rank has reported so far: its latest step start and phase start."""
        steps = {r: times[-1] for r in self.steps if (times := self.step_times(r))}
        phases = {r: self.latest_phase_ns(r) for r, table in self.phases.items() if table}
        return Reports(steps, phases)

    def merge(self, other: "JobEvidence") -> None:
        """Take what `other` read (newer reads of a second replace older ones)."""
        for key, seconds in other.cells.items():
            update_changed(self.cells.setdefault(key, {}), seconds)
        for node, seconds in other.nodes.items():
            update_changed(self.nodes.setdefault(node, {}), seconds)
        for name in ("steps", "phases"):
            mine = getattr(self, name)
            for rank, rows in getattr(other, name).items():
                table = mine.setdefault(rank, {})
                added = [k for k in rows if k not in table]
                update_changed(table, rows)
                self.keys_added(name, rank, added)
        for table in other.progress.values():
            for progress in table.values():
                self.take_progress(progress)
        self.node_of_rank.update(other.node_of_rank)
        self.addr_node.update(other.addr_node)
        for node, ns in other.last_seen_ns.items():
            self.last_seen_ns[node] = max(ns, self.last_seen_ns.get(node, 0))
        for node, n in other.lost_records.items():
            self.lost_records[node] = max(n, self.lost_records.get(node, 0))
        self.take_ras(other.ras_polls, other.ras_ranks.values())

    def take_ras(self, polls: dict[str, int], ranks) -> None:
        """RAS polls of communicators and their ranks' troubles; later ones win."""
        for comm, ns in polls.items():
            self.ras_polls[comm] = max(ns, self.ras_polls.get(comm, 0))
        for r in ranks:
            old = self.ras_ranks.get((r.comm, r.rank))
            if old is None or r.time_ns >= old.time_ns:
                self.ras_ranks[(r.comm, r.rank)] = r

    def ras_hanging(self) -> list[RasRank]:
        """The ranks RAS's latest poll of their communicator reports dead or
        unresponsive (a rank missing from a later poll's troubles has recovered)."""
        return sorted((r for r in self.ras_ranks.values()
                       if r.state in RAS_HANGING and r.time_ns >= self.ras_polls.get(r.comm, 0)),
                      key=lambda r: (r.comm, _rank_order(r.rank)))

    def step_source(self) -> StepSource:
        """Where this job's steps come from (one source per job: diagnosis/source.py)."""
        for table in self.steps.values():
            for step in table.values():
                return step.source
        return StepSource.GLOO

    def take_progress(self, p: Progress) -> None:
        """A rank's report of a step in progress (one per step: a later report of the
        same step, which has been running longer, replaces an earlier one)."""
        table = self.progress.setdefault(p.rank, {})
        old = table.get(p.time_ns)
        if old is None or p.seconds >= old.seconds:
            table[p.time_ns] = p

    def open_step(self, rank: str) -> Progress | None:
        """The rank's step in progress: its latest report, unless that step has ended
        (a step of the rank starts at or after it)."""
        table = self.progress.get(rank)
        if not table:
            return None
        p = table[max(table)]
        times = self.step_times(rank)
        return p if not times or times[-1] < p.time_ns else None

    def in_collective(self, rank: str) -> bool:
        """The rank's step in progress has it inside a collective now."""
        p = self.open_step(rank)
        return p is not None and p.waiting

    def keys_added(self, table_name: str, rank: str, keys: list) -> None:
        """Keys just added to a rank's steps or phases (by merge, or by a read into
        this evidence): the kept orders take them in."""
        if keys:
            for order in self._order.get((table_name, rank), {}).values():
                order.add(keys)

    def prune(self, before_s: int, steps_before_ns: int) -> None:
        """Forget seconds before `before_s` and steps before `steps_before_ns` (the
        engine keeps its baselines as numbers, not as rows)."""
        for table in list(self.cells.values()) + list(self.nodes.values()):
            for s in [s for s in table if s < before_s]:
                del table[s]
        self._latest_of.clear()
        for name in ("steps", "phases"):
            for rank, table in getattr(self, name).items():
                orders = self._order.get((name, rank), {})
                for k in [k for k in table if (k if name == "steps" else k[0]) <
                          steps_before_ns]:
                    del table[k]
                for order in orders.values():
                    order.drop_before(steps_before_ns)
        for table in self.progress.values():
            for t in [t for t in table if t < steps_before_ns]:
                del table[t]

    # -- views ----------------------------------------------------------------------
    def latest_second(self) -> int | None:
        """The latest second any node has reported."""
        latest = None
        known = self._latest_of
        for node, table in self.nodes.items():
            if not table:
                continue
            size, last = len(table), next(reversed(table))
            hit = known.get(node)
            # keys are only added between prunes: a new one grows the table
            if hit is None or hit[0] is not table or hit[1] != size or hit[2] != last:
                hit = known[node] = (table, size, last, max(table))
            if latest is None or hit[3] > latest:
                latest = hit[3]
        return latest

    def ranks(self) -> list[str]:
        return sorted(self.steps, key=_rank_order)

    def window(self, start_s: int, end_s: int) -> "Window":
        return Window(self, start_s, end_s)


def update_changed(table: dict, rows: dict, kind=None) -> None:
    """table.update(rows), keeping the objects of rows reread unchanged: most of what a
    tick reads it read before, and a replaced object is one more for the garbage
    collector's next full pass to walk (its cost grows with what survives each tick).
    With `kind` (a NamedTuple), rows are plain tuples of its fields, built into one
    only where they differ from what the table holds."""
    for key, value in rows.items():
        if table.get(key) != value:
            table[key] = value if kind is None else kind._make(value)


class PhaseIndex(NamedTuple):
    """One rank's phases of one kind: their keys in time order, and the table."""

    keys: list
    table: dict

    def between(self, t0_ns: int, t1_ns: int) -> list[Phase]:
        """The phases that started in [t0, t1), in time order."""
        keys = self.keys
        lo = bisect.bisect_left(keys, (t0_ns,))
        hi = bisect.bisect_left(keys, (t1_ns,), lo)
        table = self.table
        return [table[k] for k in keys[lo:hi]]


class _Order:
    """The keys of one rank's steps (times) or phases ((time, phase), all or of one
    kind) in order."""

    def __init__(self, table: dict, kind: str | None):
        self.table, self.kind = table, kind
        self.keys = sorted(self._mine(table))
        self.size = len(table)

    def _mine(self, keys):
        return keys if self.kind is None else [k for k in keys if k[1] == self.kind]

    def add(self, keys: list) -> None:
        """Keys the table just gained: they mostly come after the last one known."""
        new = sorted(self._mine(keys))
        if new and self.keys and new[0] < self.keys[-1]:
            self.keys = sorted(self.keys + new)
        else:
            self.keys += new
        self.size = len(self.table)

    def drop_before(self, t_ns: int) -> None:
        first = self.keys[0] if self.keys else None
        probe = t_ns if isinstance(first, int) else (t_ns,)
        del self.keys[:bisect.bisect_left(self.keys, probe)]
        self.size = len(self.table)


def weighted_median(pairs: list[tuple[float, int]]) -> float | None:
    """The value below which half the weight lies ((value, weight) pairs)."""
    if len(pairs) == 1:         # most windows' cells: one sampled second, or one flow
        value, weight = pairs[0]
        return float(value) if weight > 0 else None
    pairs = sorted(pairs)
    total = sum([w for _, w in pairs if w > 0])
    acc = 0
    for value, weight in pairs:
        if weight > 0:
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
    rx_data_segs: int = 0
    rx_ooo_pkts: int = 0
    loss_seconds: int = 0                # seconds in which it resent anything

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
    rx_peak_bps: float = 0.0
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
        seconds, addr_node = range(self.start_s, self.end_s), self.ev.addr_node
        for key, table in self.ev.cells.items():
            secs = [c for c in map(table.get, seconds) if c is not None]
            if not secs:
                continue
            acked, received, retrans, retrans_bytes, timeouts, _p50, _p90, samples, \
                rx_segs, rx_ooo = zip(*secs)
            # weighted by samples: a second of a few RTT samples (a quiet moment, a
            # checkpoint's pause) must not outvote seconds of thousands
            sampled = [s for s in secs if s.rtt_p50_us is not None and s.bytes_acked
                       and s.rtt_samples]
            out.append(CellTotals(
                key, addr_node.get(key.peer), sum(acked), sum(received), sum(retrans),
                sum(retrans_bytes), sum(timeouts),
                weighted_median([(s.rtt_p50_us, s.rtt_samples) for s in sampled]),
                weighted_median([(s.rtt_p90_us, s.rtt_samples) for s in sampled
                                 if s.rtt_p90_us is not None]),
                sum(samples), len(secs), sum(rx_segs), sum(rx_ooo),
                sum(1 for r in retrans if r)))
        return out

    def nodes(self) -> dict[str, NodeTotals]:
        out = {}
        seconds = range(self.start_s, self.end_s)
        for node, table in self.ev.nodes.items():
            secs = [c for c in map(table.get, seconds) if c is not None]
            t = out[node] = NodeTotals(node, seconds=len(secs))
            for s in secs:
                t.segs_out += s.segs_out
                t.retrans_segs += s.retrans_segs
                t.timeouts += s.timeouts
                t.bytes_out += s.bytes_out
                t.tx_peak_util = max(t.tx_peak_util, s.tx_peak_util)
                t.rx_peak_util = max(t.rx_peak_util, s.rx_peak_util)
                t.rx_peak_bps = max(t.rx_peak_bps, s.rx_peak_bps)
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
