"""The causes of one class of job (diagnosis/detect_class.py) and the models they read
(fabricscope.alltoallmodel, fabricscope.requestmodel): synthetic collectives
classified as the collector's analyzer classifies them, handed to the engine as it
replays a synthetic job (tests/unit/test_diagnosis_evidence.py)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from fabricscope.alltoallmodel import alltoall_model, step_imbalance
from fabricscope.diagnosis.advice import advise
from fabricscope.diagnosis.candidate import Candidate
from fabricscope.diagnosis.causes import CLASS_CAUSES, Cause
from fabricscope.diagnosis.engine import JobEngine
from fabricscope.diagnosis.evidence import SECOND, CellKey, CellSecond
from fabricscope.diagnosis.replay import replay
from fabricscope.diagnosis.thresholds import DEFAULT
from fabricscope.jobclass import JobClass, Observation, classify
from fabricscope.requestmodel import request_model
from tests.unit.test_diagnosis_evidence import T0, HopPlan, StepPlan, SynthJob, build, node

MS = 1_000_000
RANKS = (0, 1, 2)
FAULT = 30                  # seconds into the job at which the faults of these tests begin


def steps(per_rank, seconds: float, step_ms: float, since_s: float = 0.0, seed: int = 1,
          ranks=RANKS):
    """A loop from T0 + since_s: per_rank(rank) -> ((op, bytes, offset_ms, duration_ms),
    ...) every step, each step's length jittered by +-5 %."""
    rng, out = random.Random(seed), []
    t, end = int((T0 + since_s) * SECOND), int((T0 + since_s + seconds) * SECOND)
    while t < end:
        for rank in ranks:
            for op, size, off, dur in per_rank(rank):
                start = t + int(off * MS)
                out.append(Observation(op, size, start, start + int(dur * MS), rank=rank))
        t += int(step_ms * MS * (1 + rng.uniform(-0.05, 0.05)))
    return out


def moe(hot: float):
    """An MoE step: the count exchange, dispatch and combine and their gradients, rank 0
    receiving `hot` times the bytes of each other rank in the skewed half."""
    def per_rank(rank):
        skewed = int((64 << 10) * (hot if rank == 0 else 1.0))
        return [("AlltoAll", 24, 1, 0.3), ("AlltoAllv", skewed, 2, 8), ("AlltoAllv", 64 << 10, 12, 4),
                ("AlltoAllv", skewed, 20, 8), ("AlltoAllv", 64 << 10, 30, 4),
                ("AllReduce", 8 << 10, 36, 0.5)]
    return per_rank


def pipeline(slow_rank: int | None):
    """Three stages of a 40 ms step: the others wait in their Recv and Send for a slow
    stage; balanced, each spends a third of the step in transfers."""
    def per_rank(rank):
        if slow_rank is None:
            return [("Recv", 32 << 10, 0, 6), ("Send", 32 << 10, 14, 3),
                    ("Recv", 32 << 10, 20, 3), ("Send", 32 << 10, 30, 2)]
        if rank == slow_rank:
            return [("Recv", 32 << 10, 0, 1), ("Send", 32 << 10, 18, 0.5),
                    ("Recv", 32 << 10, 20, 1), ("Send", 32 << 10, 38, 0.5)]
        return [("Recv", 32 << 10, 0, 14), ("Send", 32 << 10, 15, 4),
                ("Recv", 32 << 10, 20, 14), ("Send", 32 << 10, 35, 4)]
    return per_rank


FSDP = [("AllGather", 1 << 20, 2 + 3 * i, 1.5) for i in range(4)] + \
       [("AllGather", 1 << 20, 15 + 4 * i, 1.5) for i in range(4)] + \
       [("AllReduce", 1 << 20, 16.5 + 4 * i, 2) for i in range(4)]

DDP = [("AllReduce", 1 << 20, 10, 2), ("AllReduce", 6 << 20, 13, 8)]


REQUEST = (("AlltoAll", 24, 0, 0.3), ("AlltoAllv", 64 << 10, 1, 0.5),
           ("AlltoAllv", 64 << 10, 3, 0.5))


def served(seconds: float, late_rank: int | None = None, late_from_s: float = 1e9,
           late_ms: float = 5.0, rate: float = 20.0, seed: int = 2, slow_ms: float = 0.0,
           until_s: float = 1e9):
    """A MoE server from T0: requests arrive as a Poisson process, served one at a time,
    each a count exchange and two all-to-alls on every rank. From late_from_s on (to
    until_s), late_rank enters each request late_ms late and the others wait for it
    inside the first exchange, and every exchange lasts slow_ms longer on every rank."""
    rng, out, arrival, free = random.Random(seed), [], 0.0, 0.0
    while arrival < seconds * 1e3:
        arrival += rng.expovariate(rate) * 1e3               # ms since T0
        begin = max(arrival, free)
        faulty = late_from_s * 1e3 <= begin < until_s * 1e3
        late = late_ms if faulty and late_rank is not None else 0.0
        slow = slow_ms if faulty else 0.0
        for rank in RANKS:
            for i, (op, size, off, dur) in enumerate(REQUEST):
                if i == 0:          # the late rank enters late; the others wait inside
                    begun = begin + (late if rank == late_rank else 0.0)
                    ended = begin + late + dur + slow
                else:
                    begun = begin + late + off + i * slow
                    ended = begun + dur + slow
                out.append(Observation(op, size, int(T0 * SECOND + begun * MS),
                                       int(T0 * SECOND + ended * MS), rank=rank))
        free = begin + 3.5 + late + len(REQUEST) * slow
    return out


def analyzer(observations, every_s: int = 10, window_s: int = 30):
    """The job's classification at second t as the collector's analyzer made it: every
    every_s, over the window_s before (diagnosis/jobclass.py)."""
    made: dict = {}

    def at(t_s: int):
        due = t_s // every_s * every_s
        if due not in made:
            lo, hi = (due - window_s) * SECOND, due * SECOND
            window = [o for o in observations if lo <= o.start_ns < hi]
            made[due] = classify(window) if window else None
        return made[due]
    return at


def diagnose(observations, seconds: int = 70, hop=lambda s, src, dst: HopPlan()):
    spec = SynthJob(seconds=seconds, hop=hop)
    engine = JobEngine(spec.job)
    found = replay(engine, build(spec), spec.t0_s, spec.end_s, classes=analyzer(observations))
    return [f for f in found if f.cause in CLASS_CAUSES]


# -- the models --------------------------------------------------------------------------

def test_the_all_to_all_model_names_the_rank_that_receives_most_and_what_evenness_saves():
    m = alltoall_model(steps(moe(hot=4.0), 2, 40))
    assert m.hot_rank == 0 and m.named
    # the skewed half: 4 + 1 + 1 against the even half's 1 + 1 + 1 per rank
    assert m.hot_share == pytest.approx((4 + 1) / (4 + 1 + 2 * (1 + 1)), rel=0.001)
    assert m.imbalance == pytest.approx(5 / 3, rel=0.01)
    # 24.3 of 40 ms inside AlltoAll (of a span one step's tail short), x (1 - 3/5)
    assert m.cost_share == pytest.approx(m.time_share[1] * (1 - 3 / 5), rel=0.01)
    assert "rank 0 receives" in m.reason


def test_a_steps_all_to_all_imbalance_agrees_with_the_windows_model():
    """step_imbalance over one step's calls is the window model's imbalance where every
    step routes alike; the AllReduce and a lone rank count for nothing."""
    obs = steps(moe(hot=4.0), 2, 40)
    first = min(o.start_ns for o in obs)
    one = step_imbalance(obs, first, first + 35 * MS)     # one step: its calls span 30 ms
    assert one == pytest.approx(alltoall_model(obs).imbalance, rel=0.001)
    assert step_imbalance([o for o in obs if o.rank == 0], first, first + 40 * MS) is None
    assert step_imbalance(obs, first - 10 * MS, first) is None


def test_even_routing_names_no_hot_destination():
    m = alltoall_model(steps(moe(hot=1.0), 2, 40))
    assert m.imbalance == pytest.approx(1.0) and m.cost_share == pytest.approx(0.0)
    assert not m.named


def test_a_window_with_fewer_of_one_ranks_exchanges_names_no_hot_destination():
    """Even routing, and the window holds only the first half of rank 2's exchanges (its
    records still on their way): the others' sums are twice its, their bytes per
    exchange are not (CI named rank 0 hot so at a MoE job's first analysis)."""
    obs = steps(moe(hot=1.0), 20, 40)
    half = sorted(o.start_ns for o in obs)[len(obs) // 2]
    m = alltoall_model([o for o in obs if o.rank != 2 or o.start_ns < half])
    # a cut inside a step leaves one rank a call more of one kind: 1.0001
    assert m.imbalance == pytest.approx(1.0, abs=0.01) and not m.named


def test_requests_are_cut_at_the_idle_gaps_and_timed_over_every_rank():
    obs = served(10)
    exchange = sorted(obs, key=lambda o: o.start_ns)
    ref = [o for o in exchange if o.rank == 0]
    m = request_model(exchange, 3, ref)
    assert len(m.requests) >= 150                    # ~200 arrivals, the cut ones left out
    assert m.p50_s == pytest.approx(0.0035, abs=0.0002)
    assert all(set(r.lags) == set(RANKS) for r in m.requests)


def test_a_served_model_is_classified_inference_with_its_request_latency():
    c = classify(served(30))
    assert c.job_class is JobClass.INFERENCE
    assert c.requests is not None and c.requests.p99_s == pytest.approx(0.0035, abs=0.0003)
    assert "requests, latency p50" in c.reason


# -- the causes, through the engine ------------------------------------------------------

def test_a_pipelines_slow_stage_is_named_at_its_rank_with_the_others_as_victims():
    found = diagnose(steps(pipeline(slow_rank=1), 70, 40))
    assert [(f.cause, f.place["rank"], f.place["node"]) for f in found] == \
        [(Cause.STAGE_IMBALANCE, "1", "node1")]
    f = found[0]
    assert f.share_of_step >= 0.10 and {v["rank"] for v in f.victims} == {"0", "2"}
    assert any("layers" in a.knob for a in f.advice)


def test_balanced_stages_are_no_finding():
    assert diagnose(steps(pipeline(slow_rank=None), 70, 40)) == []


def test_a_hot_expert_rank_is_an_all_to_all_skew_with_its_share_of_the_bytes():
    found = diagnose(steps(moe(hot=4.0), 70, 40))
    assert [(f.cause, f.place["rank"]) for f in found] == [(Cause.ALLTOALL_SKEW, "0")]
    assert "receives" in found[0].summary and found[0].share_of_step >= 0.10
    assert any("capacity" in a.knob for a in found[0].advice)


def test_even_routing_is_no_finding():
    assert diagnose(steps(moe(hot=1.0), 70, 40)) == []


def rtt_from(fault_us: float):
    return lambda s, src, dst: HopPlan(rtt_us=fault_us if s >= FAULT else 200.0)


def test_a_sharded_jobs_collectives_that_pay_a_risen_rtt_are_latency_bound():
    """12 collectives per 40 ms step over 3 ranks, 8 AllGathers of 2 ring steps and 4
    AllReduces of 4; each hop's RTT 0.2 -> 1.0 ms, so each ring step waits 0.4 ms
    more: 12 x 32 / 12 x 0.4 ms = 12.8 ms, 32 % of the step."""
    found = diagnose(steps(lambda r: FSDP, 70, 40), hop=rtt_from(1000.0))
    assert [f.cause for f in found] == [Cause.LATENCY_BOUND]
    f = found[0]
    assert f.step_seconds_added == pytest.approx(32 * 0.0004, rel=0.05)
    # its evidence is the window the RTT first rose in
    assert f.start_ns >= (T0 + FAULT - DEFAULT.eval_seconds) * SECOND


def test_the_steps_latency_bound_collectives_lose_are_no_unexplained_slowdown():
    """48 collectives per 1 s step; from FAULT every hop's RTT rises 0.2 -> 20.2 ms and
    the steps take 2 s: 48 x 20 ms = 0.96 s of the 1 s lost is the round trips'."""
    layers = [("AllGather", 1 << 17, 2 + 3 * i, 1.5) for i in range(16)] + \
        [("AllGather", 1 << 17, 60 + 4 * i, 1.5) for i in range(16)] + \
        [("AllReduce", 1 << 17, 61.5 + 4 * i, 2) for i in range(16)]
    spec = SynthJob(seconds=90, hop=rtt_from(20_200.0),
                    step=lambda i, t: StepPlan(seconds=2.0, sync=1.3) if t >= FAULT
                    else StepPlan())
    observations = steps(lambda r: layers, FAULT, 1000) + \
        steps(lambda r: layers, 90 - FAULT, 2000, since_s=FAULT)
    found = replay(JobEngine(spec.job), build(spec), spec.t0_s, spec.end_s,
                   classes=analyzer(observations))
    warned = [f for f in found if f.severity != "info"]
    assert [f.cause for f in warned] == [Cause.LATENCY_BOUND]
    assert warned[0].explained_share >= DEFAULT.explains


@pytest.mark.parametrize("rtt_us", [200.0, 300.0])
def test_a_sharded_job_whose_rtt_holds_or_barely_rises_is_not_latency_bound(rtt_us):
    """0.1 ms more RTT on 32 ring steps is 1.6 ms of a 40 ms step: 4 %, under the bar."""
    assert diagnose(steps(lambda r: FSDP, 70, 40), hop=rtt_from(rtt_us)) == []


def test_a_data_parallel_job_is_never_latency_bound():
    assert diagnose(steps(lambda r: DDP, 70, 40), hop=rtt_from(5000.0)) == []


def test_a_served_models_tail_is_named_at_the_rank_the_others_wait_for():
    found = diagnose(served(70, late_rank=2, late_from_s=FAULT))
    assert [(f.cause, f.place["rank"]) for f in found] == [(Cause.TAIL_LATENCY, "2")]
    f = found[0]
    assert "rank 2 arrives" in f.summary
    # named two classifications (20 s) after, and dated where the requests slowed
    assert (T0 + FAULT - 1) * SECOND <= f.start_ns <= (T0 + FAULT + 1) * SECOND, \
        (f.start_ns / SECOND - T0)
    # the quantile that rose and, beside it, the P99 once
    assert f.summary.count("P99") == 1, f.summary
    assert len({e.what for e in f.evidence}) == len(f.evidence), f.evidence


def test_a_served_models_tail_is_named_at_the_node_whose_hops_slowed():
    """Every rank enters each request on time and every exchange lasts 2 ms longer:
    node2's link delays its two ring hops (the data into it, the ACKs of its data out)
    by 2 ms and no other hop."""
    def hop(s, src, dst):
        return HopPlan(rtt_us=2200.0 if s >= FAULT and 2 in (src, dst) else 200.0)
    found = diagnose(served(70, late_from_s=FAULT, slow_ms=2.0), hop=hop)
    assert [(f.cause, f.place["node"], f.place["rank"]) for f in found] == \
        [(Cause.TAIL_LATENCY, "node2", None)]
    assert "node2's hops wait 2.0 ms more" in found[0].summary


def test_a_hops_rtt_set_by_its_receivers_delayed_ack_does_not_hide_the_slow_node():
    """As above, and each node also sends a few hundred bytes a second back upstream, a
    round trip each: their ACKs wait on the receiver's delayed-ACK timer, and node0's
    to node1 swing from 0.3 ms to 4 ms after the fault, on a hop that crosses no
    delayed link. They are no measure of the network: node2 is still named."""
    def hop(s, src, dst):
        return HopPlan(rtt_us=2200.0 if s >= FAULT and 2 in (src, dst) else 200.0)
    spec = SynthJob(seconds=70, hop=hop)
    ev = build(spec)
    assert sorted(spec.ring()) == [(0, 2), (1, 0), (2, 1)]     # the data hops; back:
    for src, dst in ((0, 1), (1, 2), (2, 0)):
        key = CellKey(spec.node(src), spec.addr(src), spec.addr(dst), str(src))
        ev.cells[key] = {spec.t0_s + s: CellSecond(
            bytes_acked=200, rtt_samples=4, rtt_p50_us=4000.0 if s >= FAULT and src == 0
            else 300.0, rtt_p90_us=6000.0) for s in range(spec.seconds)}
    found = replay(JobEngine(spec.job), ev, spec.t0_s, spec.end_s,
                   classes=analyzer(served(70, late_from_s=FAULT, slow_ms=2.0)))
    assert [(f.cause, f.place.get("node")) for f in found if f.cause in CLASS_CAUSES] == \
        [(Cause.TAIL_LATENCY, "node2")]


def test_a_tail_with_every_hop_slower_names_no_node():
    """A fabric whose latency rose delays every hop alike: no node's link stands out."""
    found = diagnose(served(70, late_from_s=FAULT, slow_ms=2.0), hop=rtt_from(2200.0))
    assert [(f.cause, f.place.get("node")) for f in found] == [(Cause.TAIL_LATENCY, None)]


def test_a_stall_of_a_few_seconds_is_no_tail():
    """Every exchange 3 ms slower for 6 s (a busy host's stall): one classification's
    new requests rose, the next one's did not."""
    assert diagnose(served(90, late_from_s=FAULT + 12, until_s=FAULT + 18, slow_ms=3.0),
                    seconds=90) == []


def test_a_served_model_that_keeps_its_latency_has_no_tail_finding():
    assert diagnose(served(70)) == []


#: four nodes on two ToRs
RACKS = {"node0": "tor0", "node1": "tor0", "node2": "tor1", "node3": "tor1"}


def across_tor0(loss: float, rtt_us: float):
    """From FAULT on, tor0's uplink: the hops out of its rack resend `loss` of their
    payload at rtt_us; those into it queue too (their ACKs leave through it), and the
    hops inside each rack keep their 0.2 ms."""
    def hop(s, src, dst):
        a, b = RACKS[node(src)], RACKS[node(dst)]
        if s < FAULT or a == b:
            return HopPlan()
        return HopPlan(loss=loss, rtt_us=rtt_us) if a == "tor0" else HopPlan(rtt_us=rtt_us)
    return hop


def diagnose_racks(observations, hop, seconds: int = 70, step=lambda i, t: StepPlan()):
    """The warnings still standing at the end of an all-to-all job over RACKS."""
    spec = SynthJob(nodes=4, seconds=seconds, hop=hop, all_to_all=True, step=step)
    engine = JobEngine(spec.job, tor_of=RACKS.get)
    found = replay(engine, build(spec), spec.t0_s, spec.end_s, classes=analyzer(observations))
    return [f for f in found if f.severity != "info" and not f.superseded_by]


def test_a_queue_at_an_uplink_under_an_all_to_all_is_its_bisection_limit():
    found = diagnose_racks(steps(moe(hot=1.0), 70, 40, ranks=range(4)),
                           across_tor0(loss=0.02, rtt_us=3000.0))
    assert [(f.cause, f.place.get("tor")) for f in found] == [(Cause.BISECTION_LIMIT, "tor0")]
    f = found[0]
    # 2 of 4 nodes behind tor0 send 2 x 2 / 3 = 1.3 nodes' worth of each exchange; the
    # hops across the racks carry 8 of the 12 hops' bytes
    assert "1.3 nodes' worth" in f.summary and "67% of the job's bytes" in f.summary
    assert any("expert-parallel" in a.knob for a in f.advice)


def test_the_bisection_limit_explains_the_slower_steps_inside_the_all_to_alls():
    """Steps 1.0 -> 1.5 s from the onset, the gradient AllReduce unchanged: the growth
    lies inside the all-to-alls (61 % of the ranks' time), so the finding costs it all
    and no slowdown is left unexplained."""
    found = diagnose_racks(steps(moe(hot=1.0), 70, 40, ranks=range(4)),
                           across_tor0(loss=0.02, rtt_us=3000.0),
                           step=lambda i, t: StepPlan(seconds=1.0 if t < FAULT else 1.5))
    assert [(f.cause, f.severity) for f in found] == [(Cause.BISECTION_LIMIT, "critical")]
    assert found[0].step_seconds_added == pytest.approx(0.5, abs=0.05)


def test_the_same_queue_under_a_data_parallel_job_is_buffer_saturation():
    found = diagnose_racks(steps(lambda r: DDP, 70, 40, ranks=range(4)),
                           across_tor0(loss=0.02, rtt_us=3000.0))
    assert [(f.cause, f.place.get("tor")) for f in found] == [(Cause.BUFFER_SATURATION, "tor0")]


def test_random_loss_at_an_uplink_under_an_all_to_all_stays_a_lossy_link():
    found = diagnose_racks(steps(moe(hot=1.0), 70, 40, ranks=range(4)),
                           across_tor0(loss=0.02, rtt_us=200.0))
    assert [(f.cause, f.place.get("tor")) for f in found] == [(Cause.LOSSY_LINK, "tor0")]


def test_a_classification_that_is_no_longer_fresh_is_no_evidence():
    obs = steps(pipeline(slow_rank=1), 20, 40)          # the job's collectives stop at 20 s
    spec = SynthJob(seconds=70)
    engine = JobEngine(spec.job)
    found = replay(engine, build(spec), spec.t0_s, spec.end_s, classes=analyzer(obs))
    stage = [f for f in found if f.cause is Cause.STAGE_IMBALANCE]
    assert stage and not stage[0].open                   # named while fresh, then closed


@pytest.mark.parametrize("cause", sorted(CLASS_CAUSES))
def test_every_class_cause_gets_advice(cause):
    facts = {"slow_rank": 1, "compute_ratio": 2.0, "cost": 0.3, "bubble": 0.4, "hot_rank": 0,
             "hot_share": 0.6, "imbalance": 1.8, "per_step": 40, "extra_rtt_us": 500.0,
             "p50_bytes": 4096.0, "over": 12, "requests": 300, "base_p99_s": 0.01,
             "rate": 20.0, "tail_rank": 2}
    c = Candidate(cause, "warning", {"rank": "1"}, "", 0, 0, facts=facts)
    assert advise(c, "gloo") and advise(c, "nccl")
    assert dataclasses.asdict(advise(c)[0])["why"]


@pytest.mark.parametrize("n, k, m", [(300, 10, 50), (300, 42, 50), (20, 3, 7), (5, 0, 9)])
def test_the_tail_count_is_exact_for_a_p99_that_is_the_baselines_largest_request(n, k, m):
    """The j-th of m is the largest (50 requests' nearest-rank P99): K new requests
    above it all lie above every baseline request, the top k of the m + n values all
    new, which any ordering of one distribution's values gives with C(n, k) / C(m+n, k)."""
    from fabricscope.diagnosis.detect_class import exceedance_tail
    assert exceedance_tail(n, k, m, m) == pytest.approx(math.comb(n, k) / math.comb(m + n, k))


def test_a_binomial_at_one_percent_would_call_a_healthy_server_tail_latency():
    """Eleven of 300 requests above 50 requests' P99 happens in one healthy window of
    six, where Binomial(300, 1 %) calls it rarer than one in a thousand."""
    from fabricscope.diagnosis.detect_class import TAIL_P, exceedance_tail
    binomial = 1 - sum(math.comb(300, i) * 0.01 ** i * 0.99 ** (300 - i) for i in range(11))
    assert binomial < TAIL_P < 0.15 < exceedance_tail(300, 11, 50, 50)


def test_a_saturated_server_stays_a_server():
    """Requests at 400/s against 3.5 ms of service each come back to back: the repeats
    are clocked by the service. Served before, and with no backward pass, the job is
    still the server; the same window read fresh looks like a loop."""
    window = served(10, rate=400.0)
    fresh = classify(window)
    assert fresh.job_class is JobClass.MOE_ALLTOALL and fresh.period_s is not None
    kept = classify(window, served=True)
    assert kept.job_class is JobClass.INFERENCE and kept.period_s is None
    assert "saturated server" in kept.reason and kept.requests is not None


def test_training_served_before_is_training():
    """A job that trains shows its gradients: what it served before does not hold it."""
    c = classify(steps(moe(1.0), 10, 40), served=True)
    assert c.job_class is JobClass.MOE_ALLTOALL and c.period_s is not None


def test_a_tail_placed_later_takes_the_unplaced_one_over():
    """The requests slow from FAULT, node2's hops only 20 s later: the tail is first
    named with no place, then at node2, and the job has one current tail finding."""
    def hop(s, src, dst):
        return HopPlan(rtt_us=2200.0 if s >= FAULT + 20 and 2 in (src, dst) else 200.0)
    found = diagnose(served(90, late_from_s=FAULT, slow_ms=2.0), seconds=90, hop=hop)
    current = [(f.cause, f.place.get("node")) for f in found if not f.superseded_by]
    assert current == [(Cause.TAIL_LATENCY, "node2")]
    assert [f.place.get("node") for f in found if f.superseded_by] == [None]
