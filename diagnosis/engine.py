"""The engine of one job: evidence in, findings out, evaluation by evaluation.

    job = JobEngine("198.18.0.1:29500", tor_of=topology.tor_of)
    job.feed(evidence)                    # what the store holds of the job (merged)
    changed = job.evaluate(now_ns)        # findings opened, updated or closed

Each evaluation sums the last `eval_seconds` of the job's cells and nodes and
the ranks' latest steps into a Snapshot (diagnosis/snapshot.py), runs every
detector on it, reconciles their candidates (a compute straggler's slow host
also inflates its hops' RTT: that is not a slow link), names a slowdown no
cause explains, and keeps the findings' lifecycle: a candidate that matches an
open finding (same cause and place) updates it; a new one opens a finding whose
`start` is its first evidence and whose `first_seen` is the evaluation's wall
time; an open finding without evidence for `close_clean_seconds` of newer
evidence ends at its last evidence. The job's baseline is its first stretch of
`baseline_steps` steps (after `warmup_steps`) in which no warning was raised.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field, replace

from diagnosis import detect_network, detect_steps
from diagnosis.advice import advise
from diagnosis.candidate import Candidate, RuledOut
from diagnosis.causes import EXPLAINING_CAUSES, NETWORK_CAUSES, STEP_CAUSES, Cause
from diagnosis.detect_trends import JitterTracker, mad, telemetry
from diagnosis.evidence import SECOND, CellTotals, JobEvidence
from diagnosis.finding import Finding, severity_rank
from diagnosis.localize import Hops, Place, elements, path
from diagnosis.snapshot import (Baseline, Snapshot, classify_cells, median_or_none,
                                read_rates,
                                phase_seconds, recent_ranks)
from diagnosis.thresholds import DEFAULT, Thresholds

UNEXPLAINED_AFTER_S = 5   # a slowdown stays unexplained this long before it is a finding
REOPEN_S = 10              # a finding that comes back this soon reopens instead of a new one
JOB_GONE_S = 30           # a network finding whose place carries nothing closes after this
INFO_CLOSE_S = 10          # info findings (bursts, duty cycle) flicker: they close slower
HORIZON_S = 120            # seconds of evidence kept in memory ...
PRUNE_EVERY_S = 10         # ... give or take this (pruning walks every table)
#: causes read from one window of hops: a new finding needs two evaluations in a row
#: that agree on cause and place (the first seconds of a fault can show its loss before
#: its queue, or one of its hops before the others), over thresholds.confirm_seconds
CONFIRMED_CAUSES = NETWORK_CAUSES
#: while other places explain a new network finding's hops as well, it waits up to this
#: many evaluations for the hops that tell them apart (the flows that cross one of the
#: places and not the other: in a training job, within a few of its steps)
AMBIGUOUS_EVALS = 8
#: lossy cells rank the places of later windows this long (localize.locate's `recent`):
#: a few of a training job's steps, in which its checkpoints and other nodes' flows
#: cross the places that one window's hops cannot tell apart
LOSS_MEMORY_S = 10
#: evaluations in a row in which a named place's evidence shows the other network cause
#: (a queue, or loss without one) before its finding takes that cause: a queue's dip
#: between bursts, or a lossy link's RTT rise while its first losses recover, lasts one
#: to three windows in the lab's runs; tor0's uplink at 300 Mbit/s, named a lossy link
#: in the windows its queue drained, then queued in every window for 7 s
CAUSE_REVISE_EVALS = 6
#: seconds of the baseline a hop must carry data in for its usual RTT to be known, and a
#: node must receive in for its usual NIC peak to be
USUAL_SECONDS = 3
#: a file every evaluation appends one JSON line to (the hops it judged bad, the
#: candidates, what waits, what is open), to follow a live run's decisions after the
#: fact: a replay of the records cannot repeat the order in which they arrived. Unset
#: (the default), nothing is written
TRACE_PATH = os.environ.get("FABRICSCOPE_DIAGNOSIS_TRACE", "")


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
class JobEngine:
    job: str
    tor_of: object = staticmethod(lambda node: None)
    thresholds: Thresholds = DEFAULT
    backend: str = "gloo"
    clock: object = staticmethod(time.time_ns)
    ev: JobEvidence = None                          # type: ignore[assignment]
    baseline: Baseline | None = None
    rtt_floor_us: float | None = None
    open: dict = field(default_factory=dict)        # key -> Finding
    closed: dict = field(default_factory=dict)      # key -> Finding (recently closed)
    bad_ns: list = field(default_factory=list)      # [(start, end)] with a warning raised
    jitter: JitterTracker = field(default_factory=JitterTracker)
    lost_seen: dict = field(default_factory=dict)
    gauges: Gauges = field(default_factory=Gauges)
    last_snapshot: Snapshot | None = None
    slow_since_ns: int = 0
    pending: dict = field(default_factory=dict)      # network key -> (evals, first evidence)
    node_known_ns: dict = field(default_factory=dict)   # node -> when the engine first knew it
    lossy_seen: dict = field(default_factory=dict)  # cell key -> (window end s, BadCell)
    queued_seen: dict = field(default_factory=dict)  # cell key -> [window end s, lossy+queued]
    other_cause_evals: dict = field(default_factory=dict)  # place -> evaluations in a row
    #                                  its evidence showed another cause than its finding's
    hops_of: dict = field(default_factory=dict)     # open network key -> its hops (elements)
    usual_rtt_us: dict = field(default_factory=dict)  # cell key -> its RTT in the baseline
    usual_rx_peak: dict = field(default_factory=dict)  # node -> its peak received, baseline
    usual_read_bps: dict = field(default_factory=dict)  # node -> its reads' rate, baseline
    pruned_s: int = 0

    def __post_init__(self) -> None:
        if self.ev is None:
            self.ev = JobEvidence(self.job)

    # -- input -------------------------------------------------------------------------
    def feed(self, evidence: JobEvidence) -> None:
        """Take what was read (evidence read into the engine's own is taken already)."""
        if evidence is not self.ev:
            self.ev.merge(evidence)
        latest = self.ev.latest_second()
        if latest is not None and latest - self.pruned_s >= PRUNE_EVERY_S:
            self.pruned_s = latest
            self.ev.prune(latest - HORIZON_S, (latest - HORIZON_S) * SECOND)

    # -- evaluation --------------------------------------------------------------------
    def evaluate(self, now_ns: int | None = None) -> list[Finding]:
        now_ns = self.clock() if now_ns is None else now_ns
        latest = self.ev.latest_second()
        if latest is None:
            return []
        snap = self.snapshot(latest + 1)
        bad = self._with_recent_queue(snap.window.end_s, detect_network.bad_cells(snap))
        candidates, ruled_out = self._detect(snap, bad)
        self.bad_ns += [(c.bad_from_ns, c.bad_until_ns) for c in candidates
                        if severity_rank(c.severity) >= 1]
        self._update_gauges(snap)
        self.last_snapshot = snap
        changed = self._lifecycle(snap, candidates, ruled_out, now_ns)
        if TRACE_PATH:
            self._trace(snap, bad, candidates, now_ns)
        return changed

    def _trace(self, snap: Snapshot, bad: list, candidates: list[Candidate],
               now_ns: int) -> None:
        hops = [f"{b.src or b.cell.key.peer}>{b.dst or b.cell.key.peer}{'L' if b.lossy else ''}"
                f"{'D' if b.delayed else ''} {(b.cell.rtt_p50_us or 0) / 1000:.1f}ms"
                for b in bad]
        line = {"job": self.job, "now_ns": now_ns, "window_end_s": snap.window.end_s,
                "bad": hops, "floor_us": self.rtt_floor_us,
                "candidates": [[c.cause, c.severity, c.place,
                                sorted(map(sorted, c.hops.evidence))] for c in candidates],
                "pending": [[list(k), n] for k, (n, _) in self.pending.items()],
                "open": [[f.cause, f.where, f.id, sorted(map(sorted, self.hops_of[k].evidence))
                          if k in self.hops_of else None] for k, f in self.open.items()]}
        with open(TRACE_PATH, "a") as out:
            out.write(json.dumps(line, default=str) + "\n")

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
    def _detect(self, snap: Snapshot, bad: list) -> tuple[list[Candidate], list[RuledOut]]:
        """`bad`: the window's bad cells (detect_network.bad_cells, with the recent
        queues: _with_recent_queue)."""
        strag, ruled = detect_steps.straggler(snap)
        stragglers = frozenset(c.place.get("node") for c in strag) | frozenset(
            f.place.get("node") for f in self.open.values() if f.cause == Cause.STRAGGLER_COMPUTE)
        prefer = frozenset(_place_of(f.place) for f in self.open.values()
                           if f.cause in NETWORK_CAUSES)
        net, r1 = detect_network.detect(snap, self.tor_of, prefer, stragglers,
                                        self._recent_loss(snap.window.end_s, bad), bad)
        net = [self._same_cause(c) for c in net]
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
                      for f in self.open.values()):
            ruled += [RuledOut(Cause.STRAGGLER_NETWORK, f"{c.place.get('node')}'s hops are "
                               "delayed without loss while the ranks wait on their reads: "
                               "their grad sync grows by their staggered arrival")
                      for c in net if c.cause == Cause.STRAGGLER_NETWORK]
            net = [c for c in net if c.cause != Cause.STRAGGLER_NETWORK]
        causal = [c for c in net + strag + inp if c.cause in EXPLAINING_CAUSES]
        network_open = any(c.cause in NETWORK_CAUSES for c in net) or \
            any(f.cause in NETWORK_CAUSES for f in self.open.values())
        self.jitter.feed(self.ev, snap)
        # jitter of a job with a named fault is the fault's symptom, not a trend of its
        # own: the trend starts over once the fault is gone
        busy = causal or any(f.cause in EXPLAINING_CAUSES and f.severity != "info"
                             for f in self.open.values())
        if busy:
            self.jitter.reset()
        out = net + strag + inp + ([] if busy else self.jitter.candidate(snap))
        for node in set(self.ev.node_of_rank.values()):
            self.node_known_ns.setdefault(node, snap.now_ns)
        out += telemetry(snap, self.lost_seen, self.node_known_ns)
        self.lost_seen = dict(self.ev.lost_records)
        # what the named causes explain: this evaluation's, and those still open
        shares = {c.key: c.explained_share for c in causal}
        for key, f in self.open.items():
            if f.cause in EXPLAINING_CAUSES:
                shares.setdefault(key, f.explained_share)
        slow = detect_steps.slowdown(snap, sum(shares.values()))
        # a slowdown is unexplained only once the detectors had the steps to explain it
        clock = snap.steps_end_ns or snap.window.end_ns
        if not slow:
            self.slow_since_ns = 0
        elif not self.slow_since_ns:
            self.slow_since_ns = clock
        unexplained = bool(slow) and clock - self.slow_since_ns >= UNEXPLAINED_AFTER_S * SECOND
        if unexplained:
            out += slow
        # a D that rises as the steps slow is a warning only while nothing else explains
        # the slowdown, held as long as an unexplained slowdown is: a compute straggler's
        # late entry lengthens the others' grad sync before the straggler is named
        out += detect_steps.network_bound(snap, may_warn=unexplained and not (
            network_open or busy or strag))
        return out, ruled

    def _recent_loss(self, end_s: int, bad: list) -> list:
        """The lossy cells of the last LOSS_MEMORY_S, each as last seen, this window's
        (`bad`, ending at end_s) included (detect_network leaves out those the window
        holds)."""
        for b in bad:
            if b.lossy:
                self.lossy_seen[b.cell.key] = (end_s, b)
        for key in [k for k, (s, _) in self.lossy_seen.items() if end_s - s > LOSS_MEMORY_S]:
            del self.lossy_seen[key]
        return [b for _, b in self.lossy_seen.values()]

    def _with_recent_queue(self, end_s: int, bad: list) -> list:
        """The bad cells, a lossy hop whose loss came with a standing queue in the last
        LOSS_MEMORY_S marked delayed in a window where its median RTT dips: an
        overflowing queue drains between the job's bursts (tor0's uplink at 300
        Mbit/s: one window's median at 0.6 ms between 2.5 ms ones), and that one window
        read as loss without a queue, at the sender's port, moved a pending uplink's
        finding there. What _same_cause is for an open finding, for its hops before
        one opens. A standing queue: lossy and delayed in at least eval_seconds
        evaluations (so at least as many of its seconds: the overlapping windows
        read two delayed seconds twice), for a link that starts dropping delays its
        hops' RTT for a second or two as well (the resent segments' recovery)."""
        need = self.thresholds.eval_seconds
        for b in (b for b in bad if b.lossy and b.delayed):
            ends = self.queued_seen.setdefault(b.cell.key, [])
            if end_s not in ends:                        # a window read again counts once
                ends.append(end_s)
        for key, ends in list(self.queued_seen.items()):
            ends[:] = [s for s in ends if end_s - s <= LOSS_MEMORY_S]
            if not ends:
                del self.queued_seen[key]
        return [replace(b, delayed=True) if b.lossy and b.timed and not b.delayed
                and len(self.queued_seen.get(b.cell.key, ())) >= need else b for b in bad]

    def _same_cause(self, c: Candidate) -> Candidate:
        """A place keeps the network cause it was named with: a window in which an
        overflowing queue's RTT medians dip (or a lossy link's rise) is the same fault,
        not a new one. Until its evidence has shown the other cause in
        CAUSE_REVISE_EVALS evaluations in a row: then the first windows misled, and
        the finding with the cause the evidence shows now takes the old one over
        (_supersede)."""
        if c.cause not in NETWORK_CAUSES:
            return c
        place = _place_of(c.place)
        named = [f for f in self.open.values()
                 if f.cause in NETWORK_CAUSES and _place_of(f.place) == place]
        if not named or any(f.cause == c.cause for f in named):
            self.other_cause_evals.pop(place, None)      # it agrees, or nothing is named
            return c
        seen = self.other_cause_evals[place] = self.other_cause_evals.get(place, 0) + 1
        if seen < CAUSE_REVISE_EVALS:
            f = named[0]
            c.cause = f.cause
            c.summary = f.summary if c.step_seconds_added <= f.step_seconds_added \
                else c.summary
        return c

    # -- lifecycle ---------------------------------------------------------------------
    def _clock_of(self, cause: str, snap: Snapshot) -> int:
        """The evidence time a finding of this cause is judged at."""
        if cause in STEP_CAUSES and snap.steps_end_ns:
            return snap.steps_end_ns
        return snap.window.end_ns

    def _lifecycle(self, snap: Snapshot, candidates: list[Candidate],
                   ruled_out: list[RuledOut], now_ns: int) -> list[Finding]:
        changed = []
        seen = set()
        pending, self.pending = self.pending, {}
        for c in candidates:
            if c.cause in CONFIRMED_CAUSES and c.key not in self.open:
                times, since_ns = pending.get(c.key, (0, c.bad_from_ns))
                times += 1
                # the finding starts at the first evidence of the evaluations it waited for
                c.bad_from_ns = min(c.bad_from_ns, since_ns)
                # a new network finding: seen twice in a row first, and while other
                # places explain its hops as well (one hop of a fault shows first),
                # up to AMBIGUOUS_EVALS times, for the hops that tell them apart; and
                # its bad seconds must span confirm_seconds (the windows overlap)
                need = AMBIGUOUS_EVALS if c.facts.get("alternatives") else 2
                span_ns = c.bad_until_ns - c.bad_from_ns
                if times < need or span_ns < self.thresholds.confirm_seconds * SECOND:
                    self.pending[c.key] = (times, c.bad_from_ns)
                    continue
            c.advice = advise(c, self.backend)
            others = [{"cause": r.cause, "why": r.why} for r in ruled_out if r.cause != c.cause]
            f = self.open.get(c.key)
            if f is None and c.key in self.closed and not self.closed[c.key].superseded_by \
                    and c.bad_from_ns - (self.closed[c.key].end_ns or 0) <= REOPEN_S * SECOND:
                f = self.closed.pop(c.key)
                f.end_ns = None
                self.open[c.key] = f
            if f is None:
                f = Finding(c.cause, c.severity, self.job, c.place, c.bad_from_ns, c.summary,
                            first_seen_ns=now_ns)
                self.open[c.key] = f
            _apply(f, c, others)
            if c.cause in NETWORK_CAUSES:
                self.hops_of[c.key] = self.hops_of.get(c.key, Hops()) | c.hops
            seen.add(c.key)
            changed.append(f)
        changed += self._supersede(seen)
        for key, f in list(self.open.items()):
            if key in seen:
                continue
            quiet = (INFO_CLOSE_S if f.severity == "info" else
                     self.thresholds.close_clean_seconds) * SECOND
            clock = self._clock_of(f.cause, snap)
            if f.cause in NETWORK_CAUSES and not _carried_clean(snap, f) and \
                    clock - f.last_seen_ns < JOB_GONE_S * SECOND:
                continue      # nothing crossed the place since: no evidence it is healthy
            if clock - f.last_seen_ns >= quiet:
                changed.append(self._close(key))
        return changed

    def _supersede(self, seen: set) -> list[Finding]:
        """Close the open network findings that a finding named in this evaluation took
        over: its place explains every hop the other was named on, and it explains hops
        the other's place cannot, while the other was not named this time. That is one
        fault whose first hops to show could be explained by a place on their path (the
        sender's port, for a ToR uplink's first lossy hop; a neighbour, for the first
        hop of the ring to meet a port's loss), localized again once its other hops
        showed; two faults keep a hop each that only their own place explains. The
        hops compared are each finding's evidence (localize.Hops): its lossy hops where
        it had any, so that a busy host's delayed hop, which no place's loss explains,
        cannot hold a finding that the loss has moved on from. The finding of the same
        place under its other cause, once the evidence revised it (_same_cause). And an
        unexplained slowdown that a cause named since explains (_explained_slowdowns)."""
        out = [self._close_taken_over(k, taker) for k, taker in self._explained_slowdowns(seen)]
        for key in sorted((k for k in seen if k in self.hops_of), key=lambda k: self.open[k].id):
            mine, taker = self.hops_of[key].evidence, self.open[key]
            place = _place_of(taker.place)
            els = elements(place)
            for other_key in [k for k in self.open if k not in seen and k in self.hops_of]:
                f = self.open[other_key]
                other = _place_of(f.place)
                theirs, other_els = self.hops_of[other_key].evidence, elements(other)
                # the same place, its cause revised (_same_cause)
                revised = other == place and f.cause != taker.cause
                if revised or (all(h & els for h in theirs)
                               and any(not h & other_els for h in mine)):
                    out.append(self._close_taken_over(other_key, taker))
        return out

    def _explained_slowdowns(self, seen: set) -> list[tuple]:
        """(key, taker) for each open unexplained slowdown that a cause named since
        explains: a warning of an explaining cause, first raised after the slowdown was,
        named in this evaluation with at least thresholds.explains of the lost time,
        while the slowdown itself was not raised again. "Slow, cause unclear" was what
        was known until the cause's evidence came in (a compute straggler is named only
        after its slow steps have ended)."""
        out = []
        for key, f in list(self.open.items()):
            if f.cause != Cause.UNEXPLAINED_SLOWDOWN or key in seen:
                continue
            takers = [self.open[k] for k in seen
                      if self.open[k].cause in EXPLAINING_CAUSES
                      and severity_rank(self.open[k].severity) >= 1
                      and self.open[k].first_seen_ns >= f.first_seen_ns
                      and self.open[k].explained_share >= self.thresholds.explains]
            if takers:
                out.append((key, max(takers, key=lambda g: (g.explained_share, g.id))))
        return out

    def _close_taken_over(self, key: tuple, taker: Finding) -> Finding:
        f = self._close(key)
        f.superseded_by = taker.id
        return f

    def _close(self, key: tuple, end_ns: int | None = None) -> Finding:
        """End an open finding (at its last evidence unless told) and forget its hops."""
        f = self.open.pop(key)
        f.end_ns = end_ns if end_ns is not None else f.last_seen_ns
        self.hops_of.pop(key, None)
        self.closed[key] = f
        return f

    def close_all(self, end_ns: int | None = None) -> list[Finding]:
        """End every open finding (the job stopped, or its ownership moved)."""
        return [self._close(key, end_ns) for key in list(self.open)]

    def findings(self) -> list[Finding]:
        return list(self.open.values()) + list(self.closed.values())

    # -- gauges --------------------------------------------------------------------------
    def _update_gauges(self, snap: Snapshot) -> None:
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


def _place_of(p: dict) -> Place:
    """The fabric place a network finding's or candidate's place names."""
    if p.get("node"):
        return Place("node", p["node"])
    if p.get("tor"):
        return Place("tor", p["tor"])
    return Place("peer", p.get("peer") or "")


def _carried_clean(snap: Snapshot, f: Finding) -> bool:
    """Data crossed the finding's place in this window and none of it was bad."""
    tor_of = snap.notes.get("tor_of") or (lambda node: None)
    els = elements(_place_of(f.place))
    bad = {id(c) for c in snap.lossy + snap.delayed}
    return any(id(c) not in bad and path(c.key.node, c.peer_node, tor_of, c.key.peer) & els
               for c in snap.data_cells)


def _apply(f: Finding, c: Candidate, ruled_out: list[dict]) -> None:
    """Update a finding with this evaluation's candidate. Its account (summary,
    evidence, impact, advice) is that of its strongest evaluation so far, so the tail
    of a fault (its last retransmits on one hop) does not overwrite what it did at
    its worst; its severity only rises."""
    f.last_seen_ns = max(f.last_seen_ns, c.bad_until_ns)   # start stays: it is the point's time
    if severity_rank(c.severity) < severity_rank(f.severity) or \
            (f.evidence and _strength(c) < f.step_seconds_added and c.severity == f.severity):
        return
    f.severity = c.severity
    f.summary = c.summary
    f.evidence = c.evidence
    f.advice = c.advice
    f.ruled_out = ruled_out
    f.step_seconds_added = c.step_seconds_added
    f.share_of_step = c.share_of_step
    f.explained_share = c.explained_share
    f.retransmit_amplification = c.retransmit_amplification
    f.victims = c.victims


def _strength(c: Candidate) -> float:
    return c.step_seconds_added


__all__ = ["JobEngine", "Gauges", "median_or_none"]
