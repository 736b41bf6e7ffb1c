"""Running the engine after the fact: `diagnose --recompute` and the tests replay a
window of stored evidence second by second, as the live engine would have seen
it arrive (a second's cells and nodes once it is over, a step once it ended, a
step in progress as its report then said), so each finding's `first_seen` is
when the live engine would have raised it."""

from __future__ import annotations

from fabricscope.diagnosis.engine import JobEngine
from fabricscope.diagnosis.evidence import SECOND, JobEvidence, Progress
from fabricscope.diagnosis.finding import Finding


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
    for table in ev.progress.values():
        for p in table.values():
            if p.time_ns < t_ns:
                out.take_progress(progress_at(p, t_ns))
    out.last_seen_ns = {}
    for node, table in out.nodes.items():
        if table:
            out.last_seen_ns[node] = max(table) * SECOND
    out.lost_records = dict(ev.lost_records)
    out.take_ras({c: ns for c, ns in ev.ras_polls.items() if ns < t_ns},
                 [r for r in ev.ras_ranks.values() if r.time_ns < t_ns])
    return out


def progress_at(p: Progress, t_ns: int) -> Progress:
    """What a report of a step in progress said at t_ns: the store keeps each step's
    last report only, so an earlier one is that report cut at t_ns: its time so far,
    its sync time no longer than that, and inside a collective while its sync so far
    had not yet reached the report's (a step opens with its gradient AllReduce; the
    compute after it is the rest); its throttled time at the report's share of the
    time so far (the report's whole throttled time, capped at the time so far, would
    make a step throttled through half of it look throttled through all of its
    first half)."""
    seconds = (t_ns - p.time_ns) / SECOND
    if seconds >= p.seconds:
        return p
    return p._replace(seconds=seconds, sync_seconds=min(p.sync_seconds, seconds),
                      waiting=p.waiting or seconds < p.sync_seconds,
                      throttled_seconds=None if p.throttled_seconds is None
                      else p.throttled_seconds * seconds / p.seconds)


def replay(engine: JobEngine, ev: JobEvidence, start_s: int, end_s: int,
           classes=None) -> list[Finding]:
    """Evaluate once per second over [start_s, end_s); every finding it raised.
    `classes`: the job's classification as of a second (diagnosis/jobclass.py
    replay_classes), handed to the engine before each evaluation as the collector
    hands it in."""
    for t in range(start_s, end_s):
        engine.ev = JobEvidence(engine.job)
        engine.feed(slice_until(ev, t))
        if classes is not None:
            engine.classified(classes(t))
        engine.evaluate(t * SECOND)
    return engine.findings()
