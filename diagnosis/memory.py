"""What the engine remembers of places between evaluations, so that one window's
reading does not decide alone: the lossy hops of the last seconds (they rank the
places of later windows), the hops whose loss came with a standing queue, and how
long a named place's evidence has shown another cause than its finding's.

Each evaluation reads one window of hops; a fault shows differently from window to
window (a queue drains between bursts, a lossy link's first losses delay its
recovery), and the flows that tell two places apart cross them in different
seconds. The memory is what carries that across windows; the lifecycle
(diagnosis/lifecycle.py) carries the findings themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.causes import NETWORK_CAUSES
from fabricscope.diagnosis.finding import Finding
from fabricscope.diagnosis.localize import Place

#: lossy cells rank the places of later windows this long (localize.locate's `recent`):
#: a few of a training job's steps, in which its checkpoints and other nodes' flows
#: cross the places that one window's hops cannot tell apart
LOSS_MEMORY_S = 10
#: evaluations in a row in which a named place's evidence shows the other network cause
#: (a queue, or loss without one) before its finding takes that cause: a queue's dip
#: between bursts, or a lossy link's RTT rise while its first losses recover, lasts one
#: to three evaluations (windows overlap: a second is read eval_seconds times), so
#: twice the window leaves that behind
CAUSE_REVISE_EVALS = 6


def place_of(p: dict) -> Place:
    """The fabric place a network finding's or candidate's place names."""
    if p.get("node"):
        return Place("node", p["node"])
    if p.get("tor"):
        return Place("tor", p["tor"])
    return Place("peer", p.get("peer") or "")


@dataclass
class PlaceMemory:
    lossy_seen: dict = field(default_factory=dict)   # cell key -> (window end s, BadCell)
    queued_seen: dict = field(default_factory=dict)  # cell key -> [window end s, lossy+queued]
    other_cause_evals: dict = field(default_factory=dict)  # place -> evaluations in a row
    #                                  its evidence showed another cause than its finding's

    def recent_loss(self, end_s: int, bad: list) -> list:
        """The lossy cells of the last LOSS_MEMORY_S, each as last seen, this window's
        (`bad`, ending at end_s) included (detect_network leaves out those the window
        holds)."""
        for b in bad:
            if b.lossy:
                self.lossy_seen[b.cell.key] = (end_s, b)
        for key in [k for k, (s, _) in self.lossy_seen.items() if end_s - s > LOSS_MEMORY_S]:
            del self.lossy_seen[key]
        return [b for _, b in self.lossy_seen.values()]

    def with_recent_queue(self, end_s: int, bad: list, need: int) -> list:
        """The bad cells, a lossy hop whose loss came with a standing queue in the last
        LOSS_MEMORY_S marked delayed in a window where its median RTT dips: an
        overflowing queue drains between the job's bursts, and one window's median
        between two queued ones reads as loss without a queue, at the sender's port.
        What same_cause is for an open finding, for its hops before one opens. A
        standing queue: lossy and delayed in at least `need` evaluations (the window's
        length in seconds, so at least as many of its seconds: overlapping windows read
        a delayed second more than once), for a link that starts dropping delays its
        hops' RTT for a second or two as well (the resent segments' recovery)."""
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

    def same_cause(self, c: Candidate, open_findings: list[Finding]) -> Candidate:
        """A place keeps the network cause it was named with: a window in which an
        overflowing queue's RTT medians dip (or a lossy link's rise) is the same fault,
        not a new one. Until its evidence has shown the other cause in
        CAUSE_REVISE_EVALS evaluations in a row: then the first windows misled, and
        the finding with the cause the evidence shows now takes the old one over
        (Lifecycle.supersede)."""
        if c.cause not in NETWORK_CAUSES:
            return c
        place = place_of(c.place)
        named = [f for f in open_findings
                 if f.cause in NETWORK_CAUSES and place_of(f.place) == place]
        if not named or any(f.cause == c.cause for f in named):
            self.other_cause_evals.pop(place, None)      # it agrees, or nothing is named
            return c
        seen = self.other_cause_evals[place] = self.other_cause_evals.get(place, 0) + 1
        if seen < CAUSE_REVISE_EVALS:
            f = named[0]
            c.cause, c.summary, c.held = f.cause, f.summary, True
        return c
