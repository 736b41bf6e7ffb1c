"""Trends against the job's own baseline: jitter_accumulation; and telemetry_gap.

Jitter: the spread of step time (median absolute deviation over the last
`jitter_window_steps` steps, checkpoint steps left out: they are slow by design)
is compared with the job's own spread (the median spread of its first
BASE_WINDOWS windows after the baseline). A one-sided CUSUM (Page 1954) on
log(spread / baseline) with an allowance of log(jitter_allowance) sums the
excess step by step: it stays at 0 while the spread wanders around the
baseline, and crosses `jitter_alarm` only when the spread stays above it, the
longer the smaller the excess; each step's excess counts 1/jitter_window_steps,
since a window of steps overlaps the next in all but one. A static threshold on step time would miss a
spread that creeps up, and fire on a job that is merely slow.

Telemetry: each agent writes tcp_node every window, zero when idle, so a node
whose latest window is `silent_seconds` older than its job's freshest while the
job still steps has gone silent; an agent that dropped records says so in
agent_loss. "No finding" must never mean "no data". A rank that NCCL's RAS reports
dead or unresponsive at its latest poll (nccl_ras_rank) is one the job's collectives
wait for in vain: the engine has no steps of it to judge, and the job hangs on it.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field

from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.evidence import SECOND, JobEvidence
from fabricscope.diagnosis.finding import Evidence
from fabricscope.diagnosis.snapshot import Snapshot, phase_seconds


def mad(values: list[float]) -> float:
    m = statistics.median(values)
    return statistics.median(abs(v - m) for v in values)


BASE_WINDOWS = 10          # windows (one per step) whose spreads make the baseline spread


@dataclass
class JitterTracker:
    """Per job: the CUSUM over its reference rank's steps, fed step by step."""

    cusum: float = 0.0
    done_ns: int = 0                    # steps up to here were fed
    series: list[float] = field(default_factory=list)
    last_spread: float = 0.0
    alarm_from_ns: int = 0
    first_spreads: list[float] = field(default_factory=list)   # the job's own normal

    def base_spread(self, b, t) -> float | None:
        """The job's own spread: the median of the spreads of its first BASE_WINDOWS
        windows of steps (a spread taken from one short stretch varies too much to
        be a baseline), at least the baseline's and jitter_floor of its step; None
        until those windows are in."""
        if len(self.first_spreads) < BASE_WINDOWS:
            return None
        return max(statistics.median(self.first_spreads), b.spread_s,
                   t.jitter_floor * b.step_s)

    def reset(self) -> None:
        """Start over (a named fault is open: its steps say nothing of a trend, nor of
        the job's normal spread while that is still being learnt)."""
        self.cusum, self.series, self.alarm_from_ns, self.last_spread = 0.0, [], 0, 0.0
        if len(self.first_spreads) < BASE_WINDOWS:
            self.first_spreads = []

    def feed(self, ev: JobEvidence, snap: Snapshot) -> None:
        b, t = snap.baseline, snap.thresholds
        if b is None or not ev.steps:
            return
        rank = min(ev.steps, key=lambda r: (len(r), r))
        times, table = ev.step_times(rank), ev.steps[rank]
        for t_ns in times[bisect.bisect_right(times, max(self.done_ns, b.end_ns)):]:
            step = table[t_ns]
            if step.seconds is None:
                continue
            self.done_ns = step.time_ns
            if phase_seconds(ev, rank, step, "checkpoint") > 0:
                continue
            self.series = (self.series + [step.seconds])[-t.jitter_window_steps:]
            if len(self.series) < t.jitter_window_steps:
                continue
            self.last_spread = mad(self.series)
            floor = self.base_spread(b, t)
            if floor is None:
                self.first_spreads.append(self.last_spread)
                continue
            # each step's spread shares all but one step with the last one's: a step's
            # excess is counted once over the windows it is in, as in a CUSUM of
            # windows that do not overlap (Page's sums assume independent terms)
            z = math.log(max(self.last_spread, floor) / floor)
            before = self.cusum
            self.cusum = max(0.0, self.cusum + (z - math.log(t.jitter_allowance))
                             / t.jitter_window_steps)
            if before == 0.0 and self.cusum > 0.0:
                self.alarm_from_ns = step.time_ns

    def candidate(self, snap: Snapshot) -> list[Candidate]:
        b, t = snap.baseline, snap.thresholds
        if b is None or self.cusum < t.jitter_alarm:
            return []
        floor = self.base_spread(b, t)
        _place, hop = _contributor(snap)     # named in the text; the finding is the job's
        src = snap.evidence.step_source().steps
        summary = (f"Jitter accumulating: step-time spread {self.last_spread * 1000:.0f} ms "
                   f"against {floor * 1000:.0f} ms at the start (CUSUM {self.cusum:.1f} over "
                   f"{t.jitter_alarm})" + (f"; the hop that varies most is {hop}" if hop else ""))
        return [Candidate(Cause.JITTER_ACCUMULATION, "warning", {}, summary, self.alarm_from_ns,
                          self.done_ns, evidence=[
                              Evidence(src, "step-time spread (MAD of the last "
                                       f"{t.jitter_window_steps} steps)",
                                       round(self.last_spread, 4), "s", self.alarm_from_ns,
                                       self.done_ns),
                              Evidence(src, "baseline spread", round(floor, 4), "s",
                                       b.start_ns, b.end_ns),
                              Evidence(src, "CUSUM of log(spread / baseline)",
                                       round(self.cusum, 2), "", self.alarm_from_ns,
                                       self.done_ns)],
                          facts={"spread_s": self.last_spread, "hop": hop})]


def _contributor(snap: Snapshot) -> tuple[dict, str | None]:
    """The data hop whose RTT varies most over the window's seconds, when it stands out."""
    scores = []
    for key, table in snap.evidence.cells.items():
        secs = [table[s].rtt_p90_us for s in range(snap.window.start_s, snap.window.end_s)
                if s in table and table[s].rtt_p90_us is not None and table[s].bytes_acked]
        if len(secs) >= 2:
            scores.append((statistics.pstdev(secs), key))
    scores.sort(key=lambda s: s[0], reverse=True)
    if not scores or scores[0][0] <= 0 or (len(scores) > 1 and scores[0][0] < 2 * scores[1][0]):
        return {}, None
    key = scores[0][1]
    peer = snap.evidence.addr_node.get(key.peer, key.peer)
    return {"node": key.node, "peer": peer}, f"{key.node}->{peer}"


def telemetry(snap: Snapshot, lost_before: dict[str, int],
              known_ns: dict[str, int]) -> list[Candidate]:
    """known_ns: when the engine first knew each node (a node whose agent has not
    sent a window yet is silent only from then on)."""
    ev, t = snap.evidence, snap.thresholds
    out = ras_hanging(snap)
    nodes = sorted(set(ev.node_of_rank.values()))
    if not ev.last_seen_ns or not nodes:
        return out
    freshest = max(ev.last_seen_ns.values())
    stepping = any(times and times[-1] >= freshest - 10 * SECOND
                   for times in map(ev.step_times, ev.steps))
    # a node's steps come from its agent too: while they keep coming the agent is up
    # and reaches the collector, and its network windows are only late (an agent
    # still starting its probes on a loaded host), not a gap the sentence below names
    step_seen: dict[str, int] = {}
    for rank, node in ev.node_of_rank.items():
        times = ev.step_times(rank)
        if times:
            step_seen[node] = max(step_seen.get(node, 0), times[-1])
    for node in nodes:
        seen = ev.last_seen_ns.get(node)
        quiet_since = seen if seen is not None else known_ns.get(node, freshest)
        quiet_since = max(quiet_since, step_seen.get(node, 0))
        if stepping and freshest - quiet_since >= t.silent_seconds * SECOND:
            ago = (freshest - seen) / SECOND if seen else None
            text = f"for {ago:.0f} s" if ago is not None else "at all"
            out.append(Candidate(
                Cause.TELEMETRY_GAP, "warning", {"node": node},
                f"No telemetry from {node} {text} while the job's other nodes report: its "
                "agent is down or cut off from the collector; the engine cannot judge "
                "that node", seen or freshest, freshest,
                evidence=[Evidence("tcp_node", f"seconds since {node}'s last window",
                                   round(ago, 1) if ago is not None else -1, "s",
                                   seen or 0, freshest, [node])]))
    for node, lost in ev.lost_records.items():
        grew = lost - lost_before.get(node, 0)
        if grew > 0 and node in nodes:
            out.append(Candidate(
                Cause.TELEMETRY_GAP, "info", {"node": node},
                f"The agent on {node} dropped {grew} records (its spool overflowed): the "
                "gap is counted in agent_loss", snap.window.start_ns, snap.window.end_ns,
                evidence=[Evidence("agent_loss", "records lost (cumulative)", lost, "records",
                                   snap.window.start_ns, snap.window.end_ns, [node])]))
    return out


def ras_hanging(snap: Snapshot) -> list[Candidate]:
    """A telemetry_gap at each rank RAS's latest poll of its communicator reports dead
    or unresponsive (JobEvidence.ras_hanging): placed at the rank's node where the job's
    steps name it, else at the host RAS knows it by."""
    ev = snap.evidence
    out = []
    for r in ev.ras_hanging():
        node = ev.node_of_rank.get(r.rank) or r.host
        out.append(Candidate(
            Cause.TELEMETRY_GAP, "warning", {"node": node, "rank": r.rank},
            f"NCCL's RAS reports rank {r.rank} of communicator {r.comm} ({node}) {r.state}: "
            "the job's collectives wait for it, so the job hangs unless it comes back; "
            "the engine cannot judge that rank", r.time_ns, r.time_ns,
            evidence=[Evidence("nccl_ras_rank", f"rank {r.rank} {r.state} at RAS's latest "
                               f"poll of communicator {r.comm}", 1, "ranks", r.time_ns,
                               r.time_ns, [node])],
            facts={"state": r.state, "comm": r.comm, "host": r.host}))
    return out
