"""The causes that only some kinds of job have, read from the job's class and its model
(fabricscope.jobclass: the collector's job-class analyzer hands each owned job's
latest classification to its engine: collector/diagnosis.py).

- pipeline: a stage that computes more than the others paces them all
  (STAGE_IMBALANCE, from fabricscope.stagemodel);
- MoE: a hot destination receives most of the all-to-all bytes (ALLTOALL_SKEW, from
  fabricscope.alltoallmodel); a queue at a ToR's uplink is the all-to-all's demand
  across the racks (BISECTION_LIMIT: `bisection` takes the network detector's
  buffer_saturation there over);
- sharded: many small collectives per step each pay the hops' extra RTT
  (LATENCY_BOUND);
- inference: requests' P99 latency rose against the job's own first requests
  (TAIL_LATENCY), with the rank or hop that carries the tail.

Each is decided by the same bar as every other cause: it costs a tenth of the step
(or of the request). A classification is evidence while it is fresh: its last
collective at most FRESH_S before the window the engine evaluates.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from fabricscope.alltoallmodel import SKEW_COST
from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.causes import Cause
from fabricscope.diagnosis.detect_network import extra_rtt_us, in_series_note
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Evidence
from fabricscope.diagnosis.snapshot import Snapshot
from fabricscope.jobclass import Classification, JobClass, OpFamily
from fabricscope.requestmodel import RequestModel
from fabricscope.stagemodel import SLOW_STAGE_COST

#: a classification is the job's state while its last collective is this recent: two
#: analyses (diagnosis/jobclass.py classifies every EVERY_S = 10 s)
FRESH_S = 20
#: the share of a step that the extra RTT of its collectives must cost to be named
LATENCY_COST = 0.10
#: requests' P99 must rise this much over the baseline's to be named: the bar of a
#: tenth that every cause meets
TAIL_GROWTH = 0.10
#: ... and more requests than the baseline's P99 must exceed it than chance allows:
#: named when P(count at least this) is below TAIL_P under no change
#: (exceedance_tail: exact for a P99 taken from the baseline's own requests)
TAIL_P = 0.001
#: requests a baseline holds at least, its P99 their nearest-rank 99th percentile
REQUESTS_BASELINE = 50
#: a rank carries the tail when it trails the others' first call in the slow requests
#: by this share of their excess latency, more than it did in the baseline
TAIL_RANK_SHARE = 0.5

__all__ = ["detect", "bisection", "SKEW_COST", "SLOW_STAGE_COST", "LATENCY_COST",
           "TAIL_GROWTH", "TAIL_P", "REQUESTS_BASELINE", "FRESH_S", "TAIL_RANK_SHARE",
           "RequestBaseline"]


class RequestBaseline:
    """The job's own normal request latency: its first REQUESTS_BASELINE requests at
    least, gathered over its first classifications (a later request in a window
    already taken is not taken twice)."""

    def __init__(self):
        self.seconds: list[float] = []
        self.lags: dict[int, list[float]] = {}
        self.until_ns = 0
        self.p99_s: float | None = None
        self.p99_rank = 0          # the p99's place among the sorted baseline (1-based)

    def take(self, model: RequestModel) -> None:
        if self.p99_s is not None:
            return
        for r in model.requests:
            if r.start_ns >= self.until_ns:
                self.seconds.append(r.seconds)
                for rank, lag in r.lags.items():
                    self.lags.setdefault(rank, []).append(lag)
        self.until_ns = max(self.until_ns, max(r.end_ns for r in model.requests))
        if len(self.seconds) >= REQUESTS_BASELINE:
            ordered = sorted(self.seconds)
            self.p99_rank = min(len(ordered), math.ceil(0.99 * len(ordered)))
            self.p99_s = ordered[self.p99_rank - 1]


def _fresh(c: Classification | None, snap: Snapshot) -> bool:
    return c is not None and snap.window.end_ns - c.until_ns <= FRESH_S * SECOND


def detect(c: Classification | None, snap: Snapshot, baseline: RequestBaseline) \
        -> list[Candidate]:
    """The class causes of the job's latest classification, judged at this snapshot."""
    if not _fresh(c, snap):
        return []
    out = []
    if c.stages is not None and c.stages.slow_stage is not None:
        out.append(_stage(c, snap))
    if c.alltoall is not None and c.alltoall.named and \
            c.job_class in (JobClass.MOE_ALLTOALL, JobClass.INFERENCE, JobClass.MIXED):
        out.append(_skew(c, snap))
    if c.job_class is JobClass.SHARDED:
        out += _latency(c, snap)
    if c.job_class is JobClass.INFERENCE and c.requests is not None:
        if baseline.p99_s is None:
            baseline.take(c.requests)
        else:
            out += _tail(c, c.requests, baseline, snap)
    return out


def bisection(c: Classification | None, snap: Snapshot, net: list[Candidate],
              tor_of) -> list[Candidate]:
    """The network detector's candidates (detect_network.detect), with a queue at a
    ToR's uplink (buffer_saturation placed at a ToR) read as the all-to-all's bisection
    limit while the job's AlltoAll carries the most bytes of its exchanges. Every rank
    sends to every other at once, so the n of the job's N nodes in the ToR's rack send
    n (N - n) / (N - 1) nodes' worth of each exchange through its uplink, where a
    node's port carries one: an uplink with less than that queues at every exchange
    however its buffers are set, and what helps is less traffic across the racks."""
    if not _fresh(c, snap) or not c.components or \
            c.components[0] is not JobClass.MOE_ALLTOALL or c.alltoall is None:
        return net
    return [_bisection(c, snap, x, tor_of)
            if x.cause is Cause.BUFFER_SATURATION and x.place.get("tor") else x for x in net]


def _bisection(c: Classification, snap: Snapshot, x: Candidate, tor_of) -> Candidate:
    tor = x.place["tor"]
    nodes = sorted(set(snap.evidence.node_of_rank.values()))
    inside = [n for n in nodes if tor_of(n) == tor]
    if not inside or len(inside) == len(nodes):
        return x                     # no job traffic crosses it: not the job's bisection
    demand = len(inside) * (len(nodes) - len(inside)) / (len(nodes) - 1)
    hops = [h for h in snap.data_cells if h.peer_node in nodes]
    total = sum(h.bytes_acked for h in hops)
    across = sum(h.bytes_acked for h in hops
                 if (tor_of(h.key.node) == tor) != (tor_of(h.peer_node) == tor))
    share = across / total if total else 0.0
    in_alltoall = statistics.fmean(c.alltoall.time_share.values())
    # what it costs: the step's growth over the baseline, as far as the time inside the
    # all-to-alls reaches (the network detector's cost is the growth of the gradient
    # AllReduce, which an all-to-all job hardly runs)
    step = snap.step_s or (snap.baseline.step_s if snap.baseline else 0.0)
    added = max(x.step_seconds_added, min(snap.step_added_s or 0.0, in_alltoall * step))
    share_of_step = added / step if step else 0.0
    f = x.facts
    rtt, floor = f.get("rtt_p50_us"), f.get("rtt_floor_us")
    queue = f"RTT {rtt:.0f} us vs floor {floor:.0f} us, " if rtt and floor else ""
    cost = f"; {added:.2f} s of each step ({share_of_step:.0%})" if added else ""
    summary = (f"Bisection limit at {tor}'s uplink: the all-to-all sends {share:.0%} of the "
               f"job's bytes across it ({len(inside)} of its {len(nodes)} nodes in the rack: "
               f"{demand:.2g} nodes' worth of each exchange at once, where a node's port "
               f"carries one), and its queue overflows under them ({queue}"
               f"{f.get('loss_ratio', 0.0):.2%} resent); the ranks spend {in_alltoall:.0%} "
               f"of their time in AlltoAll{cost}{in_series_note(f.get('in_series', []))}")
    w = snap.window
    return replace(
        x, cause=Cause.BISECTION_LIMIT, summary=summary, severity=_severity(share_of_step, snap),
        step_seconds_added=round(added, 4), share_of_step=round(share_of_step, 4),
        explained_share=round(min(1.0, added / snap.step_added_s), 3)
        if snap.step_added_s else 0.0,
        evidence=x.evidence + [
            Evidence("tcp_flow", f"share of the job's bytes across {tor}'s uplink", share,
                     "fraction", w.start_ns, w.end_ns),
            Evidence("gloo_collective", f"nodes' worth of each exchange through {tor}'s "
                     f"uplink: n (N - n) / (N - 1), n = {len(inside)}, N = {len(nodes)}",
                     round(demand, 3), "nodes"),
            Evidence("gloo_collective", "ranks' mean share of time inside AlltoAll",
                     in_alltoall, "fraction")],
        facts={**f, "cross_share": share, "demand_nodes": demand, "rack_nodes": len(inside),
               "nodes": len(nodes), "alltoall_share": in_alltoall})


def _severity(share: float, snap: Snapshot) -> str:
    return "critical" if share >= snap.thresholds.critical_share else "warning"


def _place(snap: Snapshot, rank: int | None, **more) -> dict:
    node = snap.evidence.node_of_rank.get(str(rank)) if rank is not None else None
    return {"node": node, "rank": str(rank) if rank is not None else None, **more}


def _stage(c: Classification, snap: Snapshot) -> Candidate:
    m = c.stages
    slow = next(s for s in m.stages if s.rank == m.slow_stage)
    others = statistics.median(s.compute_s for s in m.stages if s is not slow)
    added = m.cost_share * c.period_s if c.period_s else 0.0
    return Candidate(
        Cause.STAGE_IMBALANCE, _severity(m.cost_share, snap), _place(snap, m.slow_stage),
        f"Pipeline stage rank {m.slow_stage} computes the most and paces the pipeline: a "
        f"balanced split saves {m.cost_share:.0%} of its time; bubble {m.bubble_share:.0%}",
        c.from_ns, snap.window.end_ns,
        evidence=[Evidence("gloo_collective", f"stage rank {slow.rank} compute (span less "
                           "its time in Send and Recv)", slow.compute_s, "s"),
                  Evidence("gloo_collective", "median compute of the other stages",
                           others, "s"),
                  Evidence("gloo_collective", "bubble: the stages' mean share in transfers",
                           m.bubble_share, "fraction")],
        step_seconds_added=added, share_of_step=m.cost_share,
        victims=[{"rank": str(s.rank), "node": snap.evidence.node_of_rank.get(str(s.rank)),
                  "waited_s": s.recv_s + s.send_s} for s in m.stages if s is not slow],
        facts={"stages": len(m.stages), "bubble": m.bubble_share, "cost": m.cost_share,
               "slow_rank": m.slow_stage,
               "compute_ratio": slow.compute_s / others if others > 0 else None})


def _skew(c: Classification, snap: Snapshot) -> Candidate:
    m = c.alltoall
    total = sum(m.received.values())
    added = m.cost_share * c.period_s if c.period_s else 0.0
    return Candidate(
        Cause.ALLTOALL_SKEW, _severity(m.cost_share, snap), _place(snap, m.hot_rank),
        f"Hot all-to-all destination rank {m.hot_rank}: it receives {m.hot_share:.0%} of the "
        f"all-to-all bytes ({m.imbalance:.1f}x the mean); an even routing saves "
        f"{m.cost_share:.0%} of the step",
        c.from_ns, snap.window.end_ns,
        evidence=[Evidence("gloo_collective", f"rank {r}'s share of the AlltoAll bytes "
                           "received", b / total, "fraction") for r, b in m.received.items()]
        + [Evidence("gloo_collective", "ranks' mean share of time inside AlltoAll",
                    statistics.fmean(m.time_share.values()), "fraction")],
        step_seconds_added=added, share_of_step=m.cost_share,
        facts={"hot_rank": m.hot_rank, "hot_share": m.hot_share, "imbalance": m.imbalance,
               "ranks": len(m.received), "cost": m.cost_share})


def ring_steps(c: Classification) -> float:
    """Ring steps per collective, over the job's mix by count: a ring of p ranks
    passes an AllGather or ReduceScatter in p - 1 steps and an AllReduce in 2 (p - 1)
    (a reduce-scatter, then an all-gather), each step waiting on the data from its
    neighbour; any other exchange counts one."""
    p = max(c.ranks, 2)
    per = {OpFamily.GATHER_SCATTER: p - 1, OpFamily.ALLREDUCE: 2 * (p - 1)}
    counts = {f: s.count for f, s in c.mix.items() if s.count}
    total = sum(counts.values())
    return sum(n * per.get(f, 1) for f, n in counts.items()) / total if total else 1.0


def _latency(c: Classification, snap: Snapshot) -> list[Candidate]:
    """Each ring step of a collective waits for its neighbour's data, which pays the
    hop's added one-way delay, half its extra RTT: n collectives per step of s ring
    steps each add n x s x extra RTT / 2, whether or not the links are busy (a lower
    bound: the median hop, and no round trips of TCP's own)."""
    if not c.period_s or not c.collectives_per_step:
        return []
    found = extra_rtt_us(snap, snap.data_cells)
    if found is None or found[0] <= 0:
        return []
    extra_us, hops = found
    steps = ring_steps(c)
    added = c.collectives_per_step * steps * extra_us / 2 / 1e6
    share = added / c.period_s
    if share < LATENCY_COST:
        return []
    return [Candidate(
        Cause.LATENCY_BOUND, _severity(share, snap), _place(snap, None),
        f"Latency-bound collectives: {c.collectives_per_step:.0f} per step of "
        f"{steps:.1f} ring steps each wait {extra_us / 2e3:.2f} ms more for their "
        f"neighbour's data (half the hops' {extra_us / 1e3:.2f} ms of extra RTT), "
        f"{added * 1e3:.1f} ms ({share:.0%}) of every {c.period_s * 1e3:.0f} ms step",
        snap.window.start_ns, snap.window.end_ns,
        evidence=[Evidence("gloo_collective", "collectives per step", c.collectives_per_step),
                  Evidence("tcp_flow", f"median RTT above the hop's baseline, over {hops} "
                           "hops", extra_us, "us"),
                  Evidence("gloo_collective", "median message size",
                           c.p50_bytes or 0.0, "B")],
        step_seconds_added=added, share_of_step=share,
        explained_share=round(min(1.0, added / snap.step_added_s), 3)
        if snap.step_added_s else 0.0,
        facts={"per_step": c.collectives_per_step, "ring_steps": steps,
               "extra_rtt_us": extra_us,
               "p50_bytes": c.p50_bytes, "step_s": c.period_s,
               "exchange_share": c.exchange_share})]


def exceedance_tail(n: int, k: int, m: int, j: int) -> float:
    """P(K >= k), K the number of n new requests above the j-th smallest of m baseline
    requests, where all come from one latency distribution (no change). The chance p
    that one request exceeds that order statistic is itself random, Beta(m - j + 1, j)
    whatever the distribution, so K is Beta-Binomial(n, m - j + 1, j): exact and free
    of the distribution. A Binomial(n, 1 %) would take the baseline's P99 as the true
    one, and 50 requests' P99 is their largest (each new request exceeds it with
    chance 1/51 on average, and with more than 5 % in one baseline of 13)."""
    a, b = m - j + 1, j
    log_beta = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def pmf(x: int) -> float:
        return math.exp(math.lgamma(n + 1) - math.lgamma(x + 1) - math.lgamma(n - x + 1)
                        + math.lgamma(x + a) + math.lgamma(n - x + b)
                        - math.lgamma(n + a + b) - log_beta)
    return min(1.0, sum(pmf(x) for x in range(max(k, 0), n + 1)))


def _tail(c: Classification, m: RequestModel, base: RequestBaseline,
          snap: Snapshot) -> list[Candidate]:
    over = [r for r in m.requests if r.seconds > base.p99_s]
    n, k = len(m.requests), len(over)
    if m.p99_s < base.p99_s * (1 + TAIL_GROWTH) or \
            exceedance_tail(n, k, len(base.seconds), base.p99_rank) >= TAIL_P:
        return []
    excess = statistics.median(r.seconds for r in over) - statistics.median(base.seconds)
    rank, lag = _tail_rank(over, base, excess)
    place = _place(snap, rank)
    where = f"rank {rank} arrives {lag * 1e3:.1f} ms late to the slow requests" \
        if rank is not None else _tail_hop(snap, place)
    share = m.p99_s / base.p99_s - 1
    return [Candidate(
        Cause.TAIL_LATENCY, _severity(share, snap), place,
        f"Request P99 {m.p99_s * 1e3:.1f} ms against the job's own {base.p99_s * 1e3:.1f} ms: "
        f"{k} of {n} requests above it; {where}",
        over[0].start_ns, snap.window.end_ns,
        evidence=[Evidence("gloo_collective", "request latency p99 (exchanges, first call to "
                           "last)", m.p99_s, "s", over[0].start_ns, over[-1].end_ns),
                  Evidence("gloo_collective", "baseline request latency p99", base.p99_s, "s"),
                  Evidence("gloo_collective", "requests above the baseline p99", k),
                  Evidence("gloo_collective", "requests in the window", n)],
        step_seconds_added=max(0.0, m.p99_s - base.p99_s), share_of_step=share,
        facts={"p99_s": m.p99_s, "base_p99_s": base.p99_s, "over": k, "requests": n,
               "tail_rank": rank, "rate": c.arrival_rate_per_s})]


def _tail_rank(over, base: RequestBaseline, excess: float) -> tuple[int | None, float]:
    """The rank whose first call trails the others' by most more than it did in the
    baseline, in the slow requests: the one they wait for, when that is at least
    TAIL_RANK_SHARE of their excess latency."""
    best, best_lag = None, 0.0
    for rank in {r for req in over for r in req.lags}:
        usual = statistics.median(base.lags.get(rank) or [0.0])
        lag = statistics.median(req.lags.get(rank, 0.0) for req in over) - usual
        if lag > best_lag:
            best, best_lag = rank, lag
    if best is None or excess <= 0 or best_lag < TAIL_RANK_SHARE * excess:
        return None, 0.0
    return best, best_lag


def _tail_hop(snap: Snapshot, place: dict) -> str:
    """Every rank arrives on time and the exchanges themselves are slower: the hop whose
    flows lose or queue the most carries the tail (its place into `place`)."""
    bad = snap.lossy or snap.delayed
    if not bad:
        return "every rank arrives on time: the exchanges themselves are slower"
    worst = max(bad, key=lambda cell: (cell.loss_ratio, cell.rtt_p50_us or 0.0))
    place.update(node=worst.key.node, peer=worst.key.peer)
    return (f"every rank arrives on time; the hop {worst.key.node} -> "
            f"{worst.peer_node or worst.key.peer} loses or queues the most")
