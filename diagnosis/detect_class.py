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
from fabricscope.diagnosis.detect_network import extra_rtt_us, in_series_note, rise_stands_out
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.finding import Evidence
from fabricscope.diagnosis.snapshot import Snapshot
from fabricscope.jobclass import Classification, JobClass, OpFamily
from fabricscope.requestmodel import REQUESTS_MIN, RequestModel
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
#: seconds of the hops' RTT the tail's node is judged over (_slow_node), up to the last
#: slow request: a classification's newest (diagnosis/jobclass.py classifies every 10
#: s), not the engine's window, which may lie after the slow requests ended. A
#: server's hops carry little, so one second's median RTT swings by milliseconds on a
#: busy host: judged over the engine's 3 s, one run's tail went from node to node
TAIL_HOP_S = 10
#: classifications in a row in which the latency of their new requests (those since
#: the one before: EVERY_S of them, no request judged twice) rose before it is named:
#: a request's latency depends on the host's load in its second, so requests are not
#: independent, and a stall of a few seconds (a healthy 5-node server on the lab's 2
#: cores: +37 % at the median for under 10 s) passes a count that takes them as
#: independent; a fault stays
TAIL_CLASSIFICATIONS = 2
#: bytes a hop must carry per RTT sample for its RTT to be the network's (hop_rtts):
#: two full segments (Linux's MSS on an Ethernet MTU), after which the receiver ACKs
#: at once. A hop that sends less per round trip (a pipeline's replies upstream, a
#: few hundred bytes a second) waits on its receiver's delayed-ACK timer: 3-5 ms
#: against its data hops' 0.2 ms in a lab run, swinging by milliseconds
ACK_AT_ONCE_BYTES = 2 * 1448
#: the quantiles of request latency tested for a rise, in order (_rose)
TAIL_QUANTILES = (0.5, 0.9, 0.99)
#: requests a baseline holds at least, its P99 their nearest-rank 99th percentile
REQUESTS_BASELINE = 50
#: a rank carries the tail when it trails the others' first call in the slow requests
#: by this share of their excess latency, more than it did in the baseline
TAIL_RANK_SHARE = 0.5

__all__ = ["detect", "bisection", "SKEW_COST", "SLOW_STAGE_COST", "LATENCY_COST",
           "TAIL_GROWTH", "TAIL_P", "TAIL_QUANTILES", "TAIL_HOP_S", "TAIL_CLASSIFICATIONS", "REQUESTS_BASELINE", "FRESH_S", "TAIL_RANK_SHARE",
           "ACK_AT_ONCE_BYTES",
           "RequestBaseline"]


class RequestBaseline:
    """The job's own normal request latency: its first REQUESTS_BASELINE requests at
    least, gathered over its first classifications (a later request in a window
    already taken is not taken twice)."""

    def __init__(self):
        self.seconds: list[float] = []
        self.lags: dict[int, list[float]] = {}
        self.from_ns = 0
        self.until_ns = 0
        self.p99_s: float | None = None
        self.p99_rank = 0          # the p99's place among the sorted baseline (1-based)
        #: each hop's (median, p90) RTT over the baseline's seconds (hop_rtts)
        self.usual_rtt_us: dict[tuple[str, str], tuple[float, float]] = {}
        #: whether the latency rose (_rose) in each of the last classifications, by
        #: their windows' ends
        self.rises: dict[int, bool] = {}

    def judged_to(self, until_ns: int) -> int:
        """Where the requests a classification ending at until_ns judges begin: after
        those of the last one judged before it (each judges its own new requests), or
        after the baseline's."""
        return max([t for t in self.rises if t < until_ns], default=self.until_ns)

    def judged(self, until_ns: int, rose: bool) -> None:
        self.rises[until_ns] = rose
        for old in sorted(self.rises)[:-TAIL_CLASSIFICATIONS]:
            del self.rises[old]

    def rose_in_a_row(self) -> bool:
        """The latency rose in the last TAIL_CLASSIFICATIONS classifications."""
        return len(self.rises) == TAIL_CLASSIFICATIONS and all(self.rises.values())

    def take(self, model: RequestModel, ev=None) -> None:
        """Take the model's requests not taken yet; `ev` (the job's evidence): where
        the baseline is complete, its hops' RTTs over the baseline's seconds."""
        if self.p99_s is not None:
            return
        for r in model.requests:
            if r.start_ns >= self.until_ns:
                self.from_ns = self.from_ns or r.start_ns
                self.seconds.append(r.seconds)
                for rank, lag in r.lags.items():
                    self.lags.setdefault(rank, []).append(lag)
        self.until_ns = max(self.until_ns, max(r.end_ns for r in model.requests))
        if len(self.seconds) >= REQUESTS_BASELINE:
            ordered = sorted(self.seconds)
            self.p99_rank = min(len(ordered), math.ceil(0.99 * len(ordered)))
            self.p99_s = ordered[self.p99_rank - 1]
            if ev is not None:
                cells = ev.window(self.from_ns // SECOND, self.until_ns // SECOND + 1).cells()
                self.usual_rtt_us = hop_rtts(cells, set(ev.node_of_rank.values()))


def hop_rtts(cells, nodes: set[str]) -> dict[tuple[str, str], tuple[float, float]]:
    """(median, p90) RTT of each hop between the job's nodes with RTT samples, however
    little it carried (a server's exchanges are small, under the network detector's
    cell_min_bytes, and their RTT is still each ACK's), where it sent
    ACK_AT_ONCE_BYTES per RTT sample: less waits on the receiver's delayed ACK, whose
    timer, not the network, sets its RTT."""
    return {(c.key.node, c.peer_node): (c.rtt_p50_us, c.rtt_p90_us or c.rtt_p50_us)
            for c in cells if c.peer_node in nodes and c.key.node in nodes
            and c.peer_node != c.key.node and c.rtt_p50_us is not None
            and c.bytes_acked >= ACK_AT_ONCE_BYTES * max(1, c.rtt_samples)}


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
            baseline.take(c.requests, snap.evidence)
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


def _rose(requests, base: RequestBaseline) -> tuple[float, float, float, int] | None:
    """(q, the baseline's q-quantile, the requests', how many of them exceed the
    baseline's) for the first of TAIL_QUANTILES at which the requests' latency rose
    by TAIL_GROWTH and more of them exceed the baseline's than chance
    allows (exceedance_tail, at TAIL_P over the quantiles tested: Bonferroni); None
    where none did. A P99 of a few hundred requests is their few slowest, which a
    busy host's stalls set as much as the fabric: a delay that slows every request
    shows at the median and the P90, with far more requests to count, before a
    sample's P99 can show it."""
    ordered = sorted(base.seconds)
    now = sorted(r.seconds for r in requests)
    if len(now) < REQUESTS_MIN:
        return None
    for q in TAIL_QUANTILES:
        j = min(len(ordered), math.ceil(q * len(ordered)))
        ref = ordered[j - 1]
        at = now[min(len(now), math.ceil(q * len(now))) - 1]
        if at < ref * (1 + TAIL_GROWTH):
            continue
        k = sum(x > ref for x in now)
        if exceedance_tail(len(now), k, len(ordered), j) < TAIL_P / len(TAIL_QUANTILES):
            return q, ref, at, k
    return None


def _tail(c: Classification, m: RequestModel, base: RequestBaseline,
          snap: Snapshot) -> list[Candidate]:
    """The tail, where the latency rose (_rose) and has a place (a late rank, a node
    whose link slowed, a lossy hop) or rose by thresholds.slowdown: a rise with no
    place is the symptom alone, as an unexplained slowdown of training is, and a
    busy host's own drift reaches a third (a healthy 5-node server on the lab's 2
    cores: +33 % at the median for 30 s, its exchanges no slower)."""
    fresh = [r for r in m.requests if r.start_ns >= base.judged_to(c.until_ns)]
    rose = _rose(fresh, base)
    base.judged(c.until_ns, rose is not None)
    if rose is None or not base.rose_in_a_row():
        return []
    q, ref, at, k = rose
    over = [r for r in fresh if r.seconds > ref]
    n = len(fresh)
    excess = statistics.median(r.seconds for r in over) - statistics.median(base.seconds)
    rank, lag = _tail_rank(over, base, excess)
    place = _place(snap, rank)
    where = f"rank {rank} arrives {lag * 1e3:.1f} ms late to the slow requests" \
        if rank is not None else _tail_hop(snap, place, base, over[-1].end_ns // SECOND + 1)
    share = at / ref - 1
    if rank is None and not place.get("node") and share < snap.thresholds.slowdown:
        return []       # no place: only the bar of an unexplained slowdown tells it from drift
    name = f"P{round(q * 100)}"
    # the P99 beside the quantile that rose, unless that is the P99
    p99 = "" if name == "P99" else \
        f"; P99 {m.p99_s * 1e3:.1f} ms against {base.p99_s * 1e3:.1f} ms"
    p99_evidence = [] if name == "P99" else [
        Evidence("gloo_collective", "request latency p99 (exchanges, first call to last)",
                 m.p99_s, "s", over[0].start_ns, over[-1].end_ns),
        Evidence("gloo_collective", "baseline request latency p99", base.p99_s, "s")]
    return [Candidate(
        Cause.TAIL_LATENCY, _severity(share, snap), place,
        f"Request latency rose: {name} {at * 1e3:.1f} ms against the job's own "
        f"{ref * 1e3:.1f} ms, {k} of {n} requests above it{p99}; {where}",
        _onset_ns([r for r in m.requests if r.start_ns >= base.until_ns], ref,
                  (sum(x > ref for x in base.seconds) + 1) / (len(base.seconds) + 1)),
        snap.window.end_ns,
        evidence=[Evidence("gloo_collective", f"request latency {name.lower()} (exchanges, "
                           "first call to last)", at, "s", over[0].start_ns, over[-1].end_ns),
                  Evidence("gloo_collective", f"baseline request latency {name.lower()}",
                           ref, "s"),
                  *p99_evidence,
                  Evidence("gloo_collective", f"requests above the baseline {name.lower()}", k),
                  Evidence("gloo_collective", "requests in the window", n)],
        step_seconds_added=max(0.0, at - ref), share_of_step=share,
        facts={"p99_s": m.p99_s, "base_p99_s": base.p99_s, "quantile": q, "over": k,
               "requests": n, "tail_rank": rank, "tail_node": place.get("node"),
               "rate": c.arrival_rate_per_s})]


def _onset_ns(requests, ref: float, p0: float) -> int:
    """When the requests (those since the baseline, in the classification's window)
    began to exceed ref more often than p0 (the chance that a new request exceeds that
    order statistic of the baseline, under no change): the change point of
    greatest likelihood ratio, p0 before it and the rate after it since. The tail is
    named a classification or two after it began (each judges its own new requests),
    and at the median half the requests before a fault exceed it too, so neither the
    first new request above ref nor the first of the latest classification says when
    it began."""
    ordered = sorted(requests, key=lambda r: r.start_ns)
    exceeds = [r.seconds > ref for r in ordered]
    best, at, ones = 0.0, len(ordered) - 1, 0
    for k in range(len(ordered) - 1, -1, -1):          # suffixes, shortest first
        ones += exceeds[k]
        size = len(ordered) - k
        rate = ones / size
        if rate <= p0:
            continue
        llr = ones * math.log(rate / p0) + (
            (size - ones) * math.log((1 - rate) / (1 - p0)) if rate < 1 else 0.0)
        if llr > best:
            best, at = llr, k
    return ordered[at].start_ns


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


def _tail_hop(snap: Snapshot, place: dict, base: RequestBaseline, until_s: int) -> str:
    """Every rank arrives on time and the exchanges themselves are slower: the node
    whose hops' RTT rose (_slow_node) carries the tail (into `place`); else the hop
    that loses the most, where the network detector judged one lossy. Hops all
    delayed alike are the fabric's latency: no one of them is its place."""
    slow = _slow_node(snap, base, until_s)
    if slow is not None:
        node, extra_us, others_us = slow
        place.update(node=node)
        return (f"every rank arrives on time; {node}'s hops wait {extra_us / 1e3:.1f} ms "
                f"more per round trip than in the baseline, the job's other hops "
                f"{others_us / 1e3:.1f} ms: its link carries the tail")
    if not snap.lossy:
        return ("no rank arrives late and no node's link slowed: every rank's requests are "
                "slower (their hosts, or the fabric as a whole)")
    worst = max(snap.lossy, key=lambda cell: (cell.loss_ratio, cell.rtt_p50_us or 0.0))
    place.update(node=worst.key.node, peer=worst.key.peer)
    return (f"every rank arrives on time; the hop {worst.key.node} -> "
            f"{worst.peer_node or worst.key.peer} loses the most")


def _slow_node(snap: Snapshot, base: RequestBaseline,
               until_s: int) -> tuple[str, float, float] | None:
    """(node, its hops' median extra RTT, the other hops') where one node's link delays
    the job's exchanges: a link delays every hop that crosses it, data one way and ACKs
    the other, and no other. Over the TAIL_HOP_S seconds up to `until_s` (the last
    slow request's), its hops' RTT rose, most of them to above the 90th
    percentile of their own baseline seconds (a rise that chance gives one second in
    ten), and the hops between the other nodes rose by less than STANDS_OUT_SHARE of
    it (a fabric whose latency rose delays them all alike). Against each hop's own
    baseline, since a server's hops carry too little to learn the job's RTT floor
    from."""
    ev = snap.evidence
    nodes = set(ev.node_of_rank.values())
    now = hop_rtts(ev.window(until_s - TAIL_HOP_S, until_s).cells(), nodes)
    usual = base.usual_rtt_us
    extra = {h: now[h][0] - usual[h][0] for h in now if h in usual}
    above = {h for h in extra if now[h][0] > usual[h][1]}
    best = None
    for node in sorted(nodes):
        mine = [h for h in extra if node in h]
        others = [extra[h] for h in extra if node not in h]
        if not mine or not others or 2 * len([h for h in mine if h in above]) <= len(mine):
            continue                # two nodes' one link is either's
        rise, rest = statistics.median(extra[h] for h in mine), statistics.median(others)
        if rise_stands_out(rise, rest) and (best is None or rise > best[1]):
            best = (node, rise, rest)
    return best
