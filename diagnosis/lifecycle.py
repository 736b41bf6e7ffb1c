"""The findings' lifecycle of one job: candidates in, findings opened, updated,
superseded and closed.

A candidate that matches an open finding (same cause and place) updates it; a new
one opens a finding whose `start` is its first evidence and whose `first_seen` is the
evaluation's wall time; an open finding without evidence for `close_clean_seconds` of
newer evidence ends at its last evidence. A new network finding is confirmed first
(two evaluations in a row that agree, longer while other places explain its hops as
well); a finding whose place explains every hop an older one was named on, and hops
that one's place cannot, takes the older one over.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fabricscope.diagnosis.advice import advise
from fabricscope.diagnosis.candidate import Candidate, RuledOut
from fabricscope.diagnosis.causes import EXPLAINING_CAUSES, NETWORK_CAUSES, STEP_CAUSES, Cause
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Finding, severity_rank
from fabricscope.diagnosis.localize import Hops, elements, path
from fabricscope.diagnosis.memory import place_of
from fabricscope.diagnosis.snapshot import Snapshot
from fabricscope.diagnosis.thresholds import DEFAULT, Thresholds

#: causes a job has at most one of: a served model has one latency distribution, so
#: one tail, whose place (rank, node or none) is refined as its evidence comes in
ONE_PER_JOB = frozenset({Cause.TAIL_LATENCY})

REOPEN_S = 10              # a finding that comes back this soon reopens instead of a new one
JOB_GONE_S = 30           # a network finding whose place carries nothing closes after this
INFO_CLOSE_S = 10          # info findings (bursts, duty cycle) flicker: they close slower
#: causes read from one window of hops: a new finding needs two evaluations in a row
#: that agree on cause and place (the first seconds of a fault can show its loss before
#: its queue, or one of its hops before the others), over thresholds.confirm_seconds
CONFIRMED_CAUSES = NETWORK_CAUSES
#: while other places explain a new network finding's hops as well, it waits up to this
#: many evaluations for the hops that tell them apart (the flows that cross one of the
#: places and not the other: in a training job, within a few of its steps)
AMBIGUOUS_EVALS = 8


@dataclass
class Lifecycle:
    job: str
    thresholds: Thresholds = DEFAULT
    backend: str = "gloo"
    open: dict = field(default_factory=dict)        # key -> Finding
    closed: dict = field(default_factory=dict)      # key -> Finding (recently closed)
    pending: dict = field(default_factory=dict)     # network key -> (evals, first evidence)
    hops_of: dict = field(default_factory=dict)     # open network key -> its hops (elements)

    def apply(self, snap: Snapshot, candidates: list[Candidate],
              ruled_out: list[RuledOut], now_ns: int) -> list[Finding]:
        """This evaluation's candidates against the open findings: what changed."""
        changed = []
        seen = set()
        pending, self.pending = self.pending, {}
        for c in candidates:
            if not self._confirmed(c, pending):
                continue
            c.advice = advise(c, self.backend)
            others = [{"cause": r.cause, "why": r.why} for r in ruled_out if r.cause != c.cause]
            f = self.open.get(c.key) or self._reopened(c)
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
            if key not in seen and self._quiet(snap, f):
                changed.append(self.close(key))
        return changed

    def _confirmed(self, c: Candidate, pending: dict) -> bool:
        """A new network finding: seen twice in a row first, and while other places
        explain its hops as well (one hop of a fault shows first), up to
        AMBIGUOUS_EVALS times, for the hops that tell them apart, where the job sends
        any (facts["told_apart"]: no wait for a place in series with it on every way
        the job's traffic goes, which no evaluation can tell apart); and its bad seconds
        must span confirm_seconds (the windows overlap). The finding starts at the
        first evidence of the evaluations it waited for."""
        if c.cause not in CONFIRMED_CAUSES or c.key in self.open:
            return True
        times, since_ns = pending.get(c.key, (0, c.bad_from_ns))
        times += 1
        c.bad_from_ns = min(c.bad_from_ns, since_ns)
        need = AMBIGUOUS_EVALS if c.facts.get("told_apart") else 2
        if times < need or c.bad_until_ns - c.bad_from_ns < \
                self.thresholds.confirm_seconds * SECOND:
            self.pending[c.key] = (times, c.bad_from_ns)
            return False
        return True

    def _reopened(self, c: Candidate) -> Finding | None:
        """The finding of this cause and place closed less than REOPEN_S before the
        candidate's evidence, open again (None: none such)."""
        old = self.closed.get(c.key)
        if old is None or old.superseded_by or \
                c.bad_from_ns - (old.end_ns or 0) > REOPEN_S * SECOND:
            return None
        f = self.closed.pop(c.key)
        f.end_ns = None
        self.open[c.key] = f
        return f

    def _quiet(self, snap: Snapshot, f: Finding) -> bool:
        """Has an open finding not named in this evaluation been without evidence long
        enough to close? A network finding whose place carried no clean data since
        stays open (no evidence that it is healthy) up to JOB_GONE_S."""
        quiet = (INFO_CLOSE_S if f.severity == "info" else
                 self.thresholds.close_clean_seconds) * SECOND
        clock = clock_of(f.cause, snap)
        if f.cause in NETWORK_CAUSES and not _carried_clean(snap, f) and \
                clock - f.last_seen_ns < JOB_GONE_S * SECOND:
            return False
        return clock - f.last_seen_ns >= quiet

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
        place under its other cause, once the evidence revised it
        (PlaceMemory.same_cause). An unexplained slowdown that a cause named since
        explains (_explained_slowdowns). And a cause a job has once (ONE_PER_JOB)
        named at another place: placed better, or moved."""
        out = [self._close_taken_over(k, taker) for k, taker in self._explained_slowdowns(seen)]
        for key in sorted((k for k in seen if k in self.open
                           and self.open[k].cause in ONE_PER_JOB),
                          key=lambda k: self.open[k].id):
            taker = self.open[key]
            out += [self._close_taken_over(k, taker) for k in list(self.open)
                    if k not in seen and self.open[k].cause == taker.cause]
        for key in sorted((k for k in seen if k in self.hops_of), key=lambda k: self.open[k].id):
            mine, taker = self.hops_of[key].evidence, self.open[key]
            place = place_of(taker.place)
            els = elements(place)
            for other_key in [k for k in self.open if k not in seen and k in self.hops_of]:
                f = self.open[other_key]
                other = place_of(f.place)
                theirs, other_els = self.hops_of[other_key].evidence, elements(other)
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
        f = self.close(key)
        f.superseded_by = taker.id
        return f

    def close(self, key: tuple, end_ns: int | None = None) -> Finding:
        """End an open finding (at its last evidence unless told) and forget its hops."""
        f = self.open.pop(key)
        f.end_ns = end_ns if end_ns is not None else f.last_seen_ns
        self.hops_of.pop(key, None)
        self.closed[key] = f
        return f

    def close_all(self, end_ns: int | None = None) -> list[Finding]:
        """End every open finding (the job stopped, or its ownership moved)."""
        return [self.close(key, end_ns) for key in list(self.open)]

    def findings(self) -> list[Finding]:
        return list(self.open.values()) + list(self.closed.values())


def clock_of(cause: str, snap: Snapshot) -> int:
    """The evidence time a finding of this cause is judged at."""
    if cause in STEP_CAUSES and snap.steps_end_ns:
        return snap.steps_end_ns
    return snap.window.end_ns


def _carried_clean(snap: Snapshot, f: Finding) -> bool:
    """Data crossed the finding's place in this window and none of it was bad."""
    tor_of = snap.notes.get("tor_of") or (lambda node: None)
    els = elements(place_of(f.place))
    bad = {id(c) for c in snap.lossy + snap.delayed}
    return any(id(c) not in bad and path(c.key.node, c.peer_node, tor_of, c.key.peer) & els
               for c in snap.data_cells)


def _apply(f: Finding, c: Candidate, ruled_out: list[dict]) -> None:
    """Update a finding with this evaluation's candidate. Its account (summary,
    evidence, impact, advice) is that of its strongest evaluation so far, so the tail
    of a fault (its last retransmits on one hop) does not overwrite what it did at
    its worst; its severity only rises. A candidate whose cause was held
    (Candidate.held) only says the fault goes on: its sentence and its figures were
    written for the other cause."""
    f.last_seen_ns = max(f.last_seen_ns, c.bad_until_ns)   # start stays: it is the point's time
    if c.held:
        return
    if severity_rank(c.severity) < severity_rank(f.severity) or \
            (f.evidence and c.step_seconds_added < f.step_seconds_added
             and c.severity == f.severity):
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
