"""One job's evaluation: its evidence, what is usual for it, and the detectors run
over each window.

Each evaluation sums the last `eval_seconds` of the job's cells and nodes and the
ranks' latest steps into a Snapshot (diagnosis/snapshot.py), runs every detector on
it, and reconciles their candidates (a compute straggler's slow host also inflates
its hops' RTT: that is not a slow link), naming a slowdown no cause explains. What is
usual is learnt once: the job's baseline is its first stretch of `baseline_steps`
steps (after `warmup_steps`) in which no warning was raised, and each hop's RTT, each
node's received peak and its reads' rate over it; the RTT floor is the lowest median
RTT a data hop between the job's nodes has shown. The job's class and its model,
when the collector hands them in (`job_class`), add the causes of that class
(diagnosis/detect_class.py), with the served requests' own baseline.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from fabricscope.diagnosis import detect_class, detect_network, detect_steps
from fabricscope.diagnosis.candidate import Candidate, RuledOut
from fabricscope.diagnosis.causes import EXPLAINING_CAUSES, NETWORK_CAUSES, Cause
from fabricscope.diagnosis.detect_trends import JitterTracker, mad, telemetry
from fabricscope.diagnosis.evidence import SECOND, CellTotals, JobEvidence
from fabricscope.diagnosis.finding import severity_rank
from fabricscope.diagnosis.memory import PlaceMemory, place_of
from fabricscope.diagnosis.snapshot import (Baseline, Snapshot, classify_cells, median_or_none,
                                phase_seconds, read_rates, recent_ranks)
from fabricscope.diagnosis.thresholds import DEFAULT, Thresholds

UNEXPLAINED_AFTER_S = 5   # a slowdown stays unexplained this long before it is a finding
HORIZON_S = 120            # seconds of evidence kept in memory ...
PRUNE_EVERY_S = 10         # ... give or take this (pruning walks every table)
#: seconds of the baseline a hop must carry data in for its usual RTT to be known, and a
#: node must receive in for its usual NIC peak to be
USUAL_SECONDS = 3


def _baseline_medians(tables: dict, b: Baseline, value) -> dict:
    """For each key of tables (key -> second -> record), the median of value(record)
    over the baseline's seconds where it is not None, at least USUAL_SECONDS of them."""
    lo, hi = b.start_ns // SECOND, b.end_ns // SECOND
    usual = {}
    for key, table in tables.items():
        values = [v for s, x in table.items() if lo <= s < hi and (v := value(x)) is not None]
        if len(values) >= USUAL_SECONDS:
            usual[key] = statistics.median(values)
    return usual


@dataclass
class Gauges:
    """The job's numbers for /metrics (the alerts' trends)."""

    step_s: float | None = None
    spread_s: float | None = None
    baseline_spread_s: float | None = None
    sync_slowdown: float | None = None
    retransmit_ratio: float = 0.0
    amplification: float = 0.0


@dataclass
class Evaluation:
    job: str
    tor_of: object = staticmethod(lambda node: None)
    thresholds: Thresholds = DEFAULT
    ev: JobEvidence = None                          # type: ignore[assignment]
    baseline: Baseline | None = None
    rtt_floor_us: float | None = None
    bad_ns: list = field(default_factory=list)      # [(start, end)] with a warning raised
    jitter: JitterTracker = field(default_factory=JitterTracker)
    lost_seen: dict = field(default_factory=dict)
    gauges: Gauges = field(default_factory=Gauges)
    last_snapshot: Snapshot | None = None
    slow_since_ns: int = 0
    node_known_ns: dict = field(default_factory=dict)   # node -> when the engine first knew it
    usual_rtt_us: dict = field(default_factory=dict)  # cell key -> its RTT in the baseline
    usual_rx_peak: dict = field(default_factory=dict)  # node -> its peak received, baseline
    usual_read_bps: dict = field(default_factory=dict)  # node -> its reads' rate, baseline
    pruned_s: int = 0
    job_class: object = None        # fabricscope.jobclass.Classification, latest handed in
    requests_baseline: detect_class.RequestBaseline = field(
        default_factory=detect_class.RequestBaseline)

    def __post_init__(self) -> None:
        if self.ev is None:
            self.ev = JobEvidence(self.job)

    def feed(self, evidence: JobEvidence) -> None:
        """Take what was read (evidence read into the engine's own is taken already)."""
        if evidence is not self.ev:
            self.ev.merge(evidence)
        latest = self.ev.latest_second()
        if latest is not None and latest - self.pruned_s >= PRUNE_EVERY_S:
            self.pruned_s = latest
            self.ev.prune(latest - HORIZON_S, (latest - HORIZON_S) * SECOND)

    def warned(self, candidates: list[Candidate]) -> None:
        """Remember when warnings were raised: the baseline is a stretch clear of them."""
        self.bad_ns += [(c.bad_from_ns, c.bad_until_ns) for c in candidates
                        if severity_rank(c.severity) >= 1]

    # -- the window ----------------------------------------------------------------------
    def snapshot(self, end_s: int) -> Snapshot:
        t = self.thresholds
        window = self.ev.window(end_s - t.eval_seconds, end_s)
        cells = window.cells()
        job_nodes = set(self.ev.node_of_rank.values())
        self._learn_floors(cells, job_nodes)
        data, lossy, delayed, timed = classify_cells(
            cells, lambda cell: self._floor_of(cell, job_nodes), t)
        ranks = recent_ranks(self.ev, 1 << 62, t.recent_steps)
        if self.baseline is None:
            self.baseline = self._find_baseline()
            if self.baseline is not None:
                self.usual_rtt_us = self._usual_rtts(self.baseline)
                self.usual_rx_peak = self._usual_rx_peaks(self.baseline)
                self.usual_read_bps = read_rates(self.ev, self.baseline.start_ns,
                                                 self.baseline.end_ns)
        snap = Snapshot(self.job, end_s * SECOND, window, cells, data, lossy, delayed,
                        self.rtt_floor_us, window.nodes(), ranks, self.baseline, self.ev, t,
                        notes={"tor_of": self.tor_of}, timed=timed,
                        usual_rtt_us=self.usual_rtt_us, usual_rx_peak=self.usual_rx_peak,
                        usual_read_bps=self.usual_read_bps)
        if ranks:
            snap.step_s = statistics.median(r.seconds for r in ranks.values())
            snap.sync_s = statistics.median(r.sync for r in ranks.values())
            snap.compute_s = statistics.median(r.compute for r in ranks.values())
            snap.data_load_s = median_or_none(r.data_load for r in ranks.values())
            snap.steps_end_ns = max(r.steps[-1].end_ns for r in ranks.values())
        return snap

    def _floor_of(self, cell: CellTotals, job_nodes: set[str]) -> float | None:
        """The RTT floor a cell's delay is judged against: the job's, for hops between
        its nodes. A hop to a peer outside the job (storage, the collector) has no
        floor: its RTT carries the server's own pace (a store busy writing a
        checkpoint acknowledges late), which is no queue in the fabric; its loss
        still counts, and a slow store is the input detector's."""
        return self.rtt_floor_us if cell.peer_node in job_nodes else None

    def _usual_rtts(self, b: Baseline) -> dict:
        """Each hop's median RTT over the seconds of the job's baseline in which it
        carried data: what its flows' RTT is while the job runs healthy, its hosts'
        own pace and the load's included."""
        t = self.thresholds
        return _baseline_medians(self.ev.cells, b, lambda c: c.rtt_p50_us
                                 if c.bytes_acked >= t.cell_min_bytes else None)

    def _usual_rx_peaks(self, b: Baseline) -> dict:
        """Each node's median over the baseline's seconds with traffic of its busiest
        100 us bin received in the second: the peak its port passes while the job
        runs healthy (detect_network.port_rates)."""
        return _baseline_medians(self.ev.nodes, b, lambda x: x.rx_peak_bps or None)

    def _learn_floors(self, cells: list[CellTotals], job_nodes: set[str]) -> None:
        """The lowest median RTT a data hop between the job's nodes showed."""
        t = self.thresholds
        for c in cells:
            if c.bytes_acked >= t.cell_min_bytes and c.rtt_p50_us is not None \
                    and c.peer_node in job_nodes:
                self.rtt_floor_us = min(self.rtt_floor_us or c.rtt_p50_us, c.rtt_p50_us)

    def _find_baseline(self) -> Baseline | None:
        t, ev = self.thresholds, self.ev
        if not ev.steps:
            return None
        per_rank = {}
        need = t.warmup_steps + t.baseline_steps
        for rank, table in ev.steps.items():
            done = [s for s in map(table.__getitem__, ev.step_times(rank))
                    if s.seconds is not None]
            if len(done) < need:
                return None
            per_rank[rank] = done
        # the first stretch of baseline_steps after the warm-up clear of any warning
        start = max(done[t.warmup_steps].time_ns for done in per_rank.values())
        while True:
            stretch = {r: [s for s in done if s.time_ns >= start][:t.baseline_steps]
                       for r, done in per_rank.items()}
            if any(len(s) < t.baseline_steps for s in stretch.values()):
                return None
            lo = min(s[0].time_ns for s in stretch.values())
            hi = max(s[-1].end_ns for s in stretch.values())
            clash = [e for b, e in self.bad_ns if b < hi and e > lo]
            if not clash:
                break
            start = max(clash)
        ref = min(stretch, key=lambda r: (len(r), r))
        plain = [s.seconds for s in stretch[ref]
                 if phase_seconds(ev, ref, s, "checkpoint") == 0] or \
            [s.seconds for s in stretch[ref]]

        def med(fn) -> float:
            return statistics.median(statistics.median(fn(r, s) for s in steps)
                                     for r, steps in stretch.items())
        step_s = med(lambda r, s: s.seconds)
        sync_s = med(lambda r, s: s.sync_seconds)
        return Baseline(step_s=step_s, sync_s=sync_s,
                        compute_s=med(lambda r, s: max(0.0, s.seconds - s.sync_seconds)),
                        data_load_s=med(lambda r, s: phase_seconds(ev, r, s, "data_load")),
                        spread_s=mad(plain) if len(plain) >= 3 else 0.0,
                        duty=sync_s / step_s if step_s else 0.0, start_ns=lo, end_ns=hi)

    # -- detectors ---------------------------------------------------------------------
    def detect(self, snap: Snapshot, bad: list, memory: PlaceMemory,
               open_findings: dict) -> tuple[list[Candidate], list[RuledOut]]:
        """Every detector over the window. `bad`: its bad cells (detect_network.bad_cells,
        with the recent queues: PlaceMemory.with_recent_queue); `open_findings`: the
        job's open findings by key (read, not changed)."""
        opened = list(open_findings.values())
        strag, ruled = detect_steps.straggler(snap)
        stragglers = frozenset(c.place.get("node") for c in strag) | frozenset(
            f.place.get("node") for f in opened if f.cause == Cause.STRAGGLER_COMPUTE)
        prefer = frozenset(place_of(f.place) for f in opened
                           if f.cause in NETWORK_CAUSES)
        net, r1 = detect_network.detect(snap, self.tor_of, prefer, stragglers,
                                        memory.recent_loss(snap.window.end_s, bad), bad)
        # a queue at an uplink under an all-to-all is the job's demand across the racks
        net = detect_class.bisection(self.job_class, snap, net, self.tor_of)
        net = [memory.same_cause(c, opened) for c in net]
        # a rank whose own port is a network culprit waits on its link, not on its CPU
        culprits = {c.place.get("node") for c in net if c.cause in NETWORK_CAUSES}
        ruled += [RuledOut(Cause.STRAGGLER_COMPUTE, f"rank {c.place.get('rank')} is slow, but "
                           f"its node {c.place.get('node')}'s link is the network finding's "
                           "place") for c in strag if c.place.get("node") in culprits]
        strag = [c for c in strag if c.place.get("node") not in culprits]
        inp, r3 = detect_steps.input_stall(snap)
        ruled += r1 + r3
        # ranks that wait on a slow store reach each collective apart, and those that
        # come first wait inside it: grad sync grows with no slow link, so delay alone
        # (a slow link's only evidence) proves nothing while an input stall is named
        if inp or any(f.cause == Cause.INPUT_STALL and f.severity != "info"
                      for f in opened):
            ruled += [RuledOut(Cause.STRAGGLER_NETWORK, f"{c.place.get('node')}'s hops are "
                               "delayed without loss while the ranks wait on their reads: "
                               "their grad sync grows by their staggered arrival")
                      for c in net if c.cause == Cause.STRAGGLER_NETWORK]
            net = [c for c in net if c.cause != Cause.STRAGGLER_NETWORK]
        by_class = detect_class.detect(self.job_class, snap, self.requests_baseline)
        causal = [c for c in net + strag + inp + by_class if c.cause in EXPLAINING_CAUSES]
        network_open = any(c.cause in NETWORK_CAUSES for c in net) or \
            any(f.cause in NETWORK_CAUSES for f in opened)
        self.jitter.feed(self.ev, snap)
        # jitter of a job with a named fault is the fault's symptom, not a trend of its
        # own: the trend starts over once the fault is gone
        busy = causal or any(f.cause in EXPLAINING_CAUSES and f.severity != "info"
                             for f in opened)
        if busy:
            self.jitter.reset()
        out = net + strag + inp + ([] if busy else self.jitter.candidate(snap))
        for node in set(self.ev.node_of_rank.values()):
            self.node_known_ns.setdefault(node, snap.now_ns)
        out += telemetry(snap, self.lost_seen, self.node_known_ns)
        out += by_class
        self.lost_seen = dict(self.ev.lost_records)
        # what the named causes explain: this evaluation's, and those still open
        shares = {c.key: c.explained_share for c in causal}
        for key, f in open_findings.items():
            if f.cause in EXPLAINING_CAUSES:
                shares.setdefault(key, f.explained_share)
        unexplained, slow = self._unexplained(snap, sum(shares.values()))
        out += slow if unexplained else []
        # a D that rises as the steps slow is a warning only while nothing else explains
        # the slowdown, held as long as an unexplained slowdown is: a compute straggler's
        # late entry lengthens the others' grad sync before the straggler is named
        out += detect_steps.network_bound(snap, may_warn=unexplained and not (
            network_open or busy or strag))
        return out, ruled

    def _unexplained(self, snap: Snapshot, explained: float) -> tuple[bool, list]:
        """(the slowdown has been unexplained UNEXPLAINED_AFTER_S, its candidates): a
        slowdown is unexplained only once the detectors had the steps to explain it."""
        slow = detect_steps.slowdown(snap, explained)
        clock = snap.steps_end_ns or snap.window.end_ns
        if not slow:
            self.slow_since_ns = 0
        elif not self.slow_since_ns:
            self.slow_since_ns = clock
        return bool(slow) and clock - self.slow_since_ns >= UNEXPLAINED_AFTER_S * SECOND, slow

    # -- gauges --------------------------------------------------------------------------
    def update_gauges(self, snap: Snapshot) -> None:
        g, b = self.gauges, snap.baseline
        g.step_s = snap.step_s
        g.spread_s = self.jitter.last_spread or None
        if b is not None:
            g.baseline_spread_s = self.jitter.base_spread(b, self.thresholds)
            g.sync_slowdown = (snap.sync_s / b.sync_s) if snap.sync_s and b.sync_s else None
        segs = sum(n.segs_out for n in snap.nodes.values())
        g.retransmit_ratio = sum(n.retrans_segs for n in snap.nodes.values()) / segs \
            if segs else 0.0
        g.amplification = ((g.sync_slowdown - 1) / g.retransmit_ratio
                           if g.sync_slowdown and g.retransmit_ratio > 0
                           and g.sync_slowdown > 1 else 0.0)
        self.last_snapshot = snap
