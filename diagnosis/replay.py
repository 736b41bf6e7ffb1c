"""Running the engine after the fact: `diagnose --recompute` and the tests replay a
window of stored evidence second by second, as the live engine would have seen
it arrive (a second's cells and nodes once it is over, a step once it ended), so
each finding's `first_seen` is when the live engine would have raised it."""

from __future__ import annotations

from diagnosis.engine import JobEngine
from diagnosis.evidence import SECOND, JobEvidence
from diagnosis.finding import Finding


def slice_until(ev: JobEvidence, t_s: int) -> JobEvidence:
    """What of `ev` existed at second t_s: seconds before it, steps ended by it."""
    t_ns = t_s * SECOND
    out = JobEvidence(ev.job, node_of_rank=dict(ev.node_of_rank), addr_node=dict(ev.addr_node))
    out.cells = {k: {s: v for s, v in table.items() if s < t_s} for k, table in ev.cells.items()}
    out.nodes = {n: {s: v for s, v in table.items() if s < t_s} for n, table in ev.nodes.items()}
    out.steps = {r: {k: s for k, s in steps.items() if s.seconds is not None and s.end_ns <= t_ns}
                 for r, steps in ev.steps.items()}
    out.phases = {r: {k: p for k, p in ph.items() if p.time_ns + p.seconds * SECOND <= t_ns}
                  for r, ph in ev.phases.items()}
    out.last_seen_ns = {}
    for node, table in out.nodes.items():
        if table:
            out.last_seen_ns[node] = max(table) * SECOND
    out.lost_records = dict(ev.lost_records)
    return out


def replay(engine: JobEngine, ev: JobEvidence, start_s: int, end_s: int) -> list[Finding]:
    """Evaluate once per second over [start_s, end_s); every finding it raised."""
    for t in range(start_s, end_s):
        engine.ev = JobEvidence(engine.job)
        engine.feed(slice_until(ev, t))
        engine.evaluate(t * SECOND)
    return engine.findings()
