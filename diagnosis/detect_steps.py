"""Causes read from the ranks' steps: straggler_compute, input_stall, network_bound,
and the slowdown no cause explains (unexplained_slowdown).

A rank's steps also carry the time its CPU cgroup was throttled by its quota
(gloo_step throttled_seconds: a Kubernetes CPU limit, the lab's CPU fault). A
quota bites inside the collectives as well (gloo's reduction and transport run on
the CPU), so a throttled rank can slow the ring without entering it late. Its
throttled time is evidence and advice on a straggler found late, and names a
straggler of its own only where one standing limit throttled the rank through
each of its last steps, or it was throttled through nearly all of each
(starved_share): a quota that comes and goes throttles neighbouring steps as
well, which then vary (jitter) rather than run at its pace.

A step of one rank (gloo_step, or nccl_step with the NCCL profiler's kernel windows:
diagnosis/source.py; the Evidence names the measurement its Step.source says) is
its grad-sync time (a gradient AllReduce in
flight) and its compute (the rest: forward, backward outside the buckets'
AllReduce, optimizer, data loading). In a ring, a rank that computes slowly
enters every collective late and the others wait inside it: their grad sync
grows, its compute stands out. Data loading (gloo_phase data_load, the
process's dataset reads) is part of compute; when it grows and grad sync does
not, the input stalls the steps. A straggler is judged by its compute outside
storage I/O (snapshot.cpu_compute): a rank that is late because it reads from a
slow store is the input's victim, not a straggler.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace

from fabricscope.diagnosis.candidate import Candidate, RuledOut
from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.finding import Evidence
from fabricscope.diagnosis.snapshot import RankRecent, Snapshot, cpu_compute, throttled_in


def _steps_span(snap: Snapshot) -> tuple[int, int]:
    steps = [s for r in snap.ranks.values() for s in r.steps]
    if not steps:
        return snap.window.start_ns, snap.window.end_ns
    return min(s.time_ns for s in steps), max(s.end_ns for s in steps)


def _same_step(step, steps):
    """The step of another rank that is the same training step: the one whose start
    lies nearest (ranks' records arrive at different times, so list positions do not
    match), within half a step."""
    best = min(steps, key=lambda s: abs(s.time_ns - step.time_ns), default=None)
    if best is None or abs(best.time_ns - step.time_ns) > (step.seconds or 0) * 5e8:
        return None
    return best


def _every_step_late(top, rest, count: int, base_sync: float | None) -> bool:
    """The slow rank is slow in each of its last `count` steps (twice the others'
    median in the same step), not in one step whose outlier carried the median, and
    the others waited for it inside that step's collectives: their grad sync grew over
    the baseline's by at least half its lateness (a rank that computes longer without
    anyone waiting holds nobody back; the first reader of a slowed store, whose read's
    last pieces were not in yet, looked 0.18 s late in a CI run whose steps did not
    slow). The step it is in (taken only while most of the others wait inside a
    collective: snapshot.recent_ranks) is held against their recent compute."""
    for i, (step, cpu) in enumerate(zip(top.steps[-count:], top.step_cpu[-count:]),
                                    start=1 - count):
        if cpu is None:                   # its read has not come: not known to be late
            return False
        if i == 0 and top.in_progress:
            ref = statistics.median(r.cpu_compute for r in rest)
            waited = None                 # they are waiting now: recent_ranks checked it
        else:
            same = [(r, s, c) for r in rest if (s := _same_step(step, r.steps)) is not None
                    and (c := r.cpu_of(s)) is not None]
            if not same:
                return False
            ref = statistics.median(c for _, _, c in same)
            waited = statistics.median(s.sync_seconds for _, s, _ in same) - base_sync \
                if base_sync is not None else None
        late = cpu - ref
        if late < ref or (waited is not None and waited < late / 2):
            return False
    return True


def _throttled_rank(snap: Snapshot, base_step: float):
    """The rank its CPU limit holds back: in each of its last straggler_steps steps
    its cgroup was throttled for at least straggler_min_share of the baseline step
    and the step took that much longer than the baseline (a quota that bites in
    every other step only makes the steps vary: jitter, not a rank that holds the
    ring at its pace), and its median throttled time is more than twice the others'
    (a limit that throttles every rank alike slows the job, it does not make one
    rank its straggler). None when no rank is, or the cgroups cannot be read."""
    t = snap.thresholds
    views = {r.rank: _throttle_view(snap, r, base_step) for r in snap.ranks.values()}
    known = [r for r, _ in views.values() if r.throttled is not None]
    if len(known) < 2:
        return None
    top = max(known, key=lambda r: r.throttled)
    others = statistics.median(r.throttled for r in known if r is not top)
    floor = t.straggler_min_share * base_step
    last = top.steps[-t.straggler_steps:]
    if top.throttled < max(floor, 2 * others) or any(
            (throttled_in(s) or 0.0) < floor or (s.seconds or 0.0) - base_step < floor
            for s in last):
        return None
    return top, others, views[top.rank][1]


def _throttle_view(snap: Snapshot, rank: RankRecent, base_step: float) -> tuple[RankRecent,
                                                                                 bool]:
    """The rank as its cgroup's throttling reads, and whether its last step is the one
    it is in: the step in progress (gloo_progress: its time and throttled time so far)
    takes the place of its oldest recent step once it has run straggler_min_share of
    a baseline step longer than one. Long past its start, what a quota spills from
    the step before (at most a CFS period) is a small share of it; a step ended says
    so only when it ends, and a rank its quota starves is slow inside the
    collectives, so it is not the step in progress recent_ranks takes (computing,
    late to the next collective): without this a starved rank was named a step
    late. Unchanged where the step in progress is not that far yet."""
    p = snap.evidence.open_step(rank.rank)
    floor = snap.thresholds.straggler_min_share * base_step
    if p is None or p.throttled_seconds is None or p.seconds < base_step + floor or \
            p.time_ns + int(p.seconds * 1e9) > snap.window.end_ns:
        return rank, False
    ended = rank.steps[:-1] if rank.in_progress else rank.steps
    steps = ended[-(len(rank.steps) - 1):] + [p.as_step()]
    return replace(rank, steps=steps, seconds=statistics.median(s.seconds for s in steps),
                   throttled=statistics.median(throttled_in(s) or 0.0 for s in steps),
                   in_progress=False,
                   step_cpu=[cpu_compute(snap.evidence, s) for s in steps]), True


def _starved(held, t) -> bool:
    """The rank its limit holds back (_throttled_rank) sets the ring's pace under its
    limit: throttled through at least starved_share of each of its last
    straggler_steps steps (it ran only in the rest, so the quota paces its compute and
    its part of the collectives alike), or under one standing limit through those
    steps (the same quota from the start to the end of each: a Kubernetes CPU
    limit). A quota that comes and goes (the lab's jitter runs: a quota on every
    other step, a smaller one each time) throttles the neighbouring steps as well,
    which then vary rather than run at its pace: it is neither standing nor
    throttles through nearly all of each. A step in progress counts by its share so
    far (_throttle_view); whether a limit holds to a step's end is known when it
    ends."""
    rank, _, step_open = held
    # the step in progress of a rank computing late does not count: the share of a
    # step its cgroup was throttled through, and its limit at the end, are known when
    # it ends (or, for _throttle_view's, far into it)
    last = (rank.steps[:-1] if rank.in_progress else rank.steps)[-t.straggler_steps:]
    if len(last) < t.straggler_steps:
        return False

    def starved_through(s) -> bool:
        return bool(s.seconds) and (throttled_in(s) or 0.0) >= t.starved_share * s.seconds
    ended = last[:-1] if step_open else last
    # standing: the same quota from the start to the end of each step (a quota set
    # anew at every step boundary shows a change inside one step or the next)
    limits = {(s.cpu_limit, s.cpu_limit_held) for s in ended}
    standing = len(limits) == 1 and all(kept and limit is not None for limit, kept in limits) \
        and (not step_open or starved_through(last[-1]))
    return standing or all(starved_through(s) for s in last)


def straggler(snap: Snapshot) -> tuple[list[Candidate], list[RuledOut]]:
    """A rank late to every collective (its compute stands out), or one its CPU limit
    starves (throttled through nearly all of each of its steps: slow inside the
    collectives rather than late to them); where its limit throttles it, the finding
    says so and advises on the limit."""
    t, b = snap.thresholds, snap.baseline
    if len(snap.ranks) < 2:
        return [], []
    ranked = sorted(snap.ranks.values(), key=lambda r: r.cpu_compute, reverse=True)
    top, rest = ranked[0], ranked[1:]
    others = statistics.median(r.cpu_compute for r in rest)
    late = top.cpu_compute - others
    base_step = b.step_s if b else statistics.median(r.seconds for r in snap.ranks.values())
    is_late = (top.cpu_compute >= t.straggler_ratio * max(others, 1e-3)
               and late >= t.straggler_min_share * base_step
               and _every_step_late(top, rest, t.straggler_steps,
                                    b.sync_s if b else None))
    held = _throttled_rank(snap, base_step)
    starved = not is_late and held is not None and _starved(held, t)
    if starved:
        top, rest = held[0], [r for r in snap.ranks.values() if r.rank != held[0].rank]
        others = statistics.median(r.cpu_compute for r in rest)
        late = max(0.0, top.cpu_compute - others)
    elif not is_late:
        # a rank its limit throttles for part of its steps under a quota that changed
        # between them, and that is not late to the collectives, is not named on the
        # throttling: a quota that comes and goes (the lab's jitter runs: on every
        # other step) throttles the neighbouring steps too, and those steps vary
        # rather than run at the quota's pace
        quota = (f"; rank {held[0].rank}'s cgroup is throttled {held[0].throttled:.3f} s "
                 "per step") if held else ""
        return [], [RuledOut(Cause.STRAGGLER_COMPUTE, f"no rank computes much longer than the "
                             f"others (slowest {top.cpu_compute:.3f} s, rank {top.rank}; median "
                             f"{others:.3f} s per step){quota}")]
    lo = top.steps[-t.straggler_steps].time_ns        # its first late step
    _lo, hi = _steps_span(snap)
    added = snap.step_added_s
    # what the rank's own slowness accounts for: its lateness, or the time its limit
    # kept it off the CPU (the longer of the two where both show)
    throttled = held[0].throttled if held and held[0].rank == top.rank else None
    own = max(late, throttled or 0.0)
    explained = 1.0 if added and not snap.lossy else (min(1.0, own / added) if added else 0.0)
    victims = [{"rank": r.rank, "node": r.node,
                "waited_s": round(max(0.0, r.sync - (b.sync_s if b else 0.0)), 3)}
               for r in rest]
    step = snap.step_s or base_step
    share = (added * explained) / step if step else 0.0
    severity = "critical" if share >= t.critical_share else "warning"
    cost = (f"; steps {b.step_s:.2f} -> {snap.step_s:.2f} s ({share:.0%} of each)"
            if b and snap.step_s else "")
    limit = next((s.cpu_limit for s in reversed(top.steps) if s.cpu_limit is not None), None)
    evidence = []
    src = top.steps[-1].source          # the measurements its steps and grad sync came from
    facts = {"late_s": late, "compute_s": top.cpu_compute, "others_s": others,
             "starved": starved}
    if starved:
        bound = f" ({limit:.2f} CPUs)" if limit is not None else ""
        summary = (f"Compute straggler: rank {top.rank} on {top.node} is starved by its "
                   f"CPU limit{bound}, throttled {top.throttled:.3f} s of its "
                   f"{top.seconds:.3f} s steps, so it is slow inside the collectives "
                   f"(gloo's reductions and transport need the CPU too) and the ring runs "
                   f"at its pace; its network is clean{cost}")
    else:
        summary = (f"Compute straggler: rank {top.rank} on {top.node} computes "
                   f"{top.cpu_compute:.3f} s per step against {others:.3f} s on the others, "
                   f"so it enters every collective {late:.3f} s late and the other ranks "
                   f"wait inside them; its network is clean{cost}")
    evidence += [
        Evidence(src.sync, f"compute per step of rank {top.rank} (step minus grad sync and storage I/O)",
                 round(top.cpu_compute, 4), "s", lo, hi, [top.node]),
        Evidence(src.sync, "median compute per step of the other ranks",
                 round(others, 4), "s", lo, hi, sorted(r.node for r in rest))]
    if throttled is not None:
        facts.update(throttled_s=throttled, limit_cpus=limit)
        evidence += [
            Evidence(src.steps, f"CPU throttled per step of rank {top.rank} (its cgroup's "
                     "CFS quota; cpu.stat)", round(throttled, 4), "s", lo, hi, [top.node]),
            Evidence(src.steps, "median CPU throttled per step of the other ranks",
                     round(held[1], 4), "s", lo, hi, sorted(r.node for r in rest))]
        if limit is not None:
            evidence.append(Evidence(src.steps, f"CPU limit of rank {top.rank}'s cgroup",
                                     round(limit, 3), "CPUs", lo, hi, [top.node]))
    now = snap.evidence.open_step(top.rank) if top.in_progress else None
    if now is not None:
        waiting = sum(snap.evidence.in_collective(r.rank) for r in rest)
        evidence.append(Evidence(
            src.progress, f"step in progress of rank {top.rank}: computing, "
            f"{now.seconds:.3f} s so far" + (f", while {waiting} of the others are "
                                              "inside a collective" if waiting else ""),
            round(now.seconds, 4), "s", now.time_ns, now.time_ns + int(now.seconds * 1e9),
            [top.node]))
    evidence.append(Evidence(src.sync, f"grad sync per step of the others (they wait for "
                             f"rank {top.rank})", round(statistics.median(r.sync for r in rest),
                                                        4), "s", lo, hi))
    rtts = [c.rtt_p50_us for c in snap.delayed if top.node in (c.key.node, c.peer_node)]
    if rtts:
        evidence.append(Evidence("tcp_flow", f"RTT on {top.node}'s hops: its host is slow to "
                                 "read and acknowledge, not its link (no loss)",
                                 round(max(rtts)), "us", snap.window.start_ns,
                                 snap.window.end_ns, [top.node]))
    return [Candidate(Cause.STRAGGLER_COMPUTE, severity, {"node": top.node, "rank": top.rank},
                      summary, lo, hi, evidence=evidence,
                      step_seconds_added=round(added * explained, 4),
                      share_of_step=round(share, 4), explained_share=round(explained, 3),
                      victims=victims, facts=facts)], []


def input_stall(snap: Snapshot) -> tuple[list[Candidate], list[RuledOut]]:
    t, b = snap.thresholds, snap.baseline
    if b is None or snap.data_load_s is None:
        return [], []
    grew = snap.data_load_s - b.data_load_s
    sync_grew = (snap.sync_s or 0.0) - b.sync_s
    if not (snap.data_load_s >= t.input_ratio * max(b.data_load_s, 1e-3)
            and grew >= t.input_min_share * b.step_s and grew > sync_grew):
        return [], [RuledOut(Cause.INPUT_STALL, f"data loading takes {snap.data_load_s:.3f} s per "
                             f"step (baseline {b.data_load_s:.3f} s)")]
    peers = Counter(p.peer for phases in snap.evidence.phases.values() for p in phases.values()
                    if p.phase == "data_load" and p.peer)
    peer = peers.most_common(1)[0][0] if peers else None
    lo, hi = _steps_span(snap)
    added = snap.step_added_s
    explained = min(1.0, grew / added) if added else 0.0
    step = snap.step_s or b.step_s
    share = grew / step if step else 0.0
    severity = "critical" if share >= t.critical_share else "warning"
    src = f"from {peer}" if peer else ""
    summary = (f"Input stall: data loading {src} takes {snap.data_load_s:.3f} s per step "
               f"against {b.data_load_s:.3f} s at the start, while grad sync stays at "
               f"{snap.sync_s or 0:.3f} s; steps {b.step_s:.2f} -> {snap.step_s or 0:.2f} s "
               f"({share:.0%} of each)")
    evidence = [
        Evidence("gloo_phase", "data loading per step (median of the ranks)",
                 round(snap.data_load_s, 4), "s", lo, hi),
        Evidence("gloo_phase", "data loading per step, baseline", round(b.data_load_s, 4), "s",
                 b.start_ns, b.end_ns),
        Evidence(snap.evidence.step_source().sync, "grad sync per step (unchanged: not the network)",
                 round(snap.sync_s or 0.0, 4), "s", lo, hi)]
    reads = [p for phases in snap.evidence.phases.values() for p in phases.values()
             if p.phase == "data_load" and lo <= p.time_ns < hi and p.seconds > 0]
    if reads:
        rate = sum(p.bytes for p in reads) / sum(p.seconds for p in reads)
        evidence.append(Evidence("gloo_phase", "read rate from the storage", round(rate / 1e6, 2),
                                 "MB/s", lo, hi))
    return [Candidate(Cause.INPUT_STALL, severity, {"peer": peer}, summary, lo, hi,
                      evidence=evidence, step_seconds_added=round(grew, 4),
                      share_of_step=round(share, 4), explained_share=round(explained, 3),
                      victims=[{"rank": r.rank, "node": r.node,
                                "waited_s": round(r.data_load - b.data_load_s, 3)}
                               for r in snap.ranks.values() if r.data_load is not None],
                      facts={"load_s": snap.data_load_s, "step_s": snap.step_s or b.step_s,
                             "peer": peer})], []


def network_bound(snap: Snapshot, may_warn: bool) -> list[Candidate]:
    """The job's duty cycle D when it exceeds thresholds.duty_cycle: info, a property
    of the workload; a warning when D rose by thresholds.duty_rise against the job's
    baseline and `may_warn` (the steps slowed, and no other finding explains it)."""
    t, b = snap.thresholds, snap.baseline
    if not snap.ranks or snap.step_s is None or snap.sync_s is None or snap.step_s <= 0 \
            or not snap.data_cells:         # the job is not moving data now: nothing to say
        return []
    duty = snap.sync_s / snap.step_s
    if duty <= t.duty_cycle:
        return []
    rose = b is not None and duty - b.duty >= t.duty_rise
    # a higher D alone may be compute getting faster; it is a warning when the steps
    # slowed with it and nothing else explains why
    severity = "warning" if rose and snap.slow and may_warn else "info"
    lo, hi = _steps_span(snap)
    # B: the bandwidth during the bursts, the busiest 100 us bin each node received
    # (nic_window), not an average over the step; unknown without the nic probe
    peaks = sorted(x.rx_peak_bps for x in snap.nodes.values() if x.rx_peak_bps > 0)
    burst_bps = peaks[len(peaks) // 2] if peaks else None
    b_text = f"B = {burst_bps / 1e9:.2f} Gbit/s per node at its 100 us peaks" \
        if burst_bps else "B unknown: no NIC peaks"
    trend = f", up from D = {b.duty:.2f} at the start" if rose else ""
    summary = (f"Network-bound: grad sync takes {duty:.0%} of each {snap.step_s:.2f} s step "
               f"(T = {snap.step_s:.2f} s, D = {duty:.2f}, {b_text}{trend}): the fabric, "
               "not compute, sets the step time")
    src = snap.evidence.step_source()
    evidence = [
        Evidence(src.sync, "duty cycle D (grad sync / step)", round(duty, 3), "fraction",
                 lo, hi),
        Evidence(src.steps, "sync period T (step time)", round(snap.step_s, 4), "s", lo, hi)]
    if burst_bps:
        evidence.append(Evidence("nic_window", "burst bandwidth B per node (median of the "
                                 "nodes' busiest 100 us bin received)",
                                 round(burst_bps / 1e9, 3), "Gbit/s", snap.window.start_ns,
                                 snap.window.end_ns, sorted(snap.nodes)))
    return [Candidate(Cause.NETWORK_BOUND, severity, {}, summary, lo, hi, evidence=evidence,
                      facts={"duty": duty})]


def slowdown(snap: Snapshot, explained: float) -> list[Candidate]:
    """Steps slower than the baseline by thresholds.slowdown that the named causes
    explain less than thresholds.explains of."""
    b, t = snap.baseline, snap.thresholds
    if not snap.slow or explained >= t.explains:
        return []
    lo, hi = _steps_span(snap)
    factor = snap.step_s / b.step_s
    sync_added = (snap.sync_s or 0.0) - b.sync_s
    compute_added = (snap.compute_s or 0.0) - b.compute_s
    part = "collectives" if sync_added >= compute_added else "compute between collectives"
    severity = "warning" if factor >= 2 else "info"
    summary = (f"Steps are x{factor:.1f} slower than at the start ({b.step_s:.2f} -> "
               f"{snap.step_s:.2f} s), mostly in the {part} (+{max(sync_added, 0):.3f} s "
               f"grad sync, +{max(compute_added, 0):.3f} s compute per step); no cause's "
               "evidence explains it")
    src = snap.evidence.step_source()
    return [Candidate(Cause.UNEXPLAINED_SLOWDOWN, severity, {}, summary, lo, hi, evidence=[
        Evidence(src.steps, "step time (median of the ranks)", round(snap.step_s, 4), "s",
                 lo, hi),
        Evidence(src.steps, "baseline step time", round(b.step_s, 4), "s", b.start_ns,
                 b.end_ns),
        Evidence(src.sync, "grad sync added per step", round(sync_added, 4), "s", lo, hi),
        Evidence(src.sync, "compute added per step", round(compute_added, 4), "s", lo, hi)],
        step_seconds_added=round(snap.step_added_s, 4),
        share_of_step=round(snap.step_added_s / snap.step_s, 4))]
