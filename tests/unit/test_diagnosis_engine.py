"""The detectors and the engine (diagnosis/detect_*.py, diagnosis/engine.py) on synthetic
jobs (tests/unit/test_diagnosis_evidence.py), replayed second by second as the live
engine sees them arrive (diagnosis/replay.py)."""

from __future__ import annotations

import random

import pytest

from fabricscope.diagnosis.detect_network import bad_cells, port_rates
from fabricscope.diagnosis.engine import AMBIGUOUS_EVALS, JobEngine
from fabricscope.diagnosis.evidence import SECOND, CellKey, JobEvidence, NodeSecond, Progress
from fabricscope.diagnosis.finding import Finding, primary, severity_rank
from fabricscope.diagnosis.replay import replay, slice_until
from fabricscope.diagnosis.thresholds import DEFAULT
from tests.unit.test_diagnosis_evidence import (STORAGE, T0, HopPlan, StepPlan, SynthJob,
                                                build, cell_second, node)

FAULT = 25                  # seconds into the job at which the faults of these tests begin
TWO_TORS = {node(0): "tor0", node(1): "tor0", node(2): "tor1", node(3): "tor1"}.get


def run(spec: SynthJob, tor_of=lambda n: None, after_s: int = 5) -> tuple[JobEngine,
                                                                          list[Finding]]:
    engine = JobEngine(spec.job, tor_of=tor_of)
    return engine, replay(engine, build(spec), spec.t0_s, spec.end_s + after_s)


def serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if severity_rank(f.severity) >= 1]


def at(second: float) -> int:
    """The UNIX ns of this many seconds into a synthetic job."""
    return int((T0 + second) * SECOND)


def slowed_sync(until: float = 1e9, since: float = FAULT, no_reads: bool = False):
    """Grad sync 0.3 -> 0.8 s (steps 1.0 -> 1.5 s) while the network misbehaves;
    no_reads: the ranks read nothing from outside the job."""
    load = 0.0 if no_reads else StepPlan().data_load

    def step(i, t):
        return StepPlan(seconds=1.5, sync=0.8, data_load=load) if since <= t < until \
            else StepPlan(data_load=load)
    return step


def lossy_port(k: int, until: int = 10**9, since: int = FAULT, loss: float = 0.01):
    """Node k's switch port drops `loss` of the frames both ways: its hop k -> k-1 and
    the hop into it, k+1 -> k."""
    def hop(s, src, dst):
        return HopPlan(loss=loss if since <= s < until and k in (src, dst) else 0.0)
    return hop


def uplink_queue(s, src, dst):
    """tor0's uplink queues and overflows from FAULT on: 0 -> 3 crosses it (lossy and
    delayed), 2 -> 1's ACKs go up through it (delayed)."""
    if s >= FAULT and (src, dst) == (0, 3):
        return HopPlan(loss=0.01, rtt_us=6000.0)
    if s >= FAULT and (src, dst) == (2, 1):
        return HopPlan(rtt_us=6000.0)
    return HopPlan()


# -- network -------------------------------------------------------------------------------

def test_a_lossy_node_is_a_lossy_link_at_that_node_with_its_cost_against_the_baseline():
    engine, findings = run(SynthJob(seconds=60, step=slowed_sync(), hop=lossy_port(1)))
    assert [(f.cause, f.where) for f in serious(findings)] == [("lossy_link", "node1")]
    f = serious(findings)[0]
    assert f.place["node"] == "node1" and f.place["rank"] == "1"
    assert f.start_ns == at(FAULT)                       # its first lossy second
    assert f.first_seen_ns == at(FAULT + 2)              # two evaluations agreed
    assert f.open
    assert engine.baseline.step_s == 1.0 and engine.baseline.sync_s == 0.3
    # grad sync 0.3 -> 0.8 s: 0.5 s of each 1.5 s step, which makes it critical
    assert f.step_seconds_added == 0.5
    assert f.share_of_step == round(0.5 / 1.5, 4) and f.severity == "critical"
    assert f.explained_share == 1.0
    assert [v["waited_s"] for v in f.victims] == [0.5, 0.5, 0.5]
    resent = cell_second(HopPlan(loss=0.01)).retrans_bytes
    job_ratio = 2 * resent / (3 * 4_000_000 + 2 * resent)
    assert f.retransmit_amplification == pytest.approx((0.8 / 0.3 - 1) / job_ratio, abs=0.01)
    hops = {e.what: e.value for e in f.evidence if e.what.startswith("payload resent")}
    assert hops == {"payload resent on node1->node0": 1.0,
                    "payload resent on node2->node1": 1.0}
    assert f.advice[0].knob == "physical link at the switch port of node1"
    assert any(r["cause"] == "straggler_compute" for r in f.ruled_out)


@pytest.mark.parametrize("reads", [False, True], ids=["no-reads", "reads"])
def test_rtt_inflated_lossy_cells_are_a_saturated_buffer_at_the_tor_uplink(reads):
    """The ring's hops cross tor0's uplink and tor1's downlink alike. Where no rank
    reads from outside the job, nothing it sends can tell the two apart, and the
    finding comes without waiting for it; a read (down one rack, not the other) can,
    so the engine waits for it."""
    engine, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(no_reads=True),
                                    hop=uplink_queue,
                                    reads=lambda s, k: 2_000_000 if reads else 0),
                           tor_of=TWO_TORS)
    assert [(f.cause, f.where) for f in serious(findings)] == [("buffer_saturation",
                                                                "tor0 uplink")]
    f = serious(findings)[0]
    assert f.place == {"node": None, "interface": "uplink", "peer": None, "tor": "tor0",
                       "rank": None}
    assert "RTT 6000 us vs floor 200 us" in f.summary
    assert engine.rtt_floor_us == 200.0
    # tor1's downlink explains the same hops; the finding starts at the first evidence
    # of the fault, and says that the two lie in series on every path between the racks
    assert f.start_ns == at(FAULT)
    if reads:
        assert at(FAULT + AMBIGUOUS_EVALS) <= f.first_seen_ns <= \
            at(FAULT + 3 + AMBIGUOUS_EVALS)
    else:
        assert f.first_seen_ns < at(FAULT + AMBIGUOUS_EVALS)
    assert "(tor1's uplink, the other way, lies in series with it on every path between " \
        "the job's racks" in f.summary
    assert {a.knob for a in f.advice} >= {"ECN marking at tor0's uplinks", "DDP bucket_cap_mb"}


def test_places_the_jobs_own_hops_can_tell_apart_wait_for_them():
    """One lossy hop, 1 -> 0, fits node1's port and node0's alike, and a hop of the job
    through one and not the other could tell them apart: the finding waits up to
    AMBIGUOUS_EVALS evaluations for it before naming one."""
    def hop(s, src, dst):
        return HopPlan(loss=0.01 if s >= FAULT and (src, dst) == (1, 0) else 0.0)
    _, findings = run(SynthJob(seconds=60, step=slowed_sync(), hop=hop))
    (f,) = serious(findings)
    assert f.cause == "lossy_link" and f.where in ("node0", "node1")
    assert f.first_seen_ns >= at(FAULT + AMBIGUOUS_EVALS)
    assert "in series" not in f.summary


def with_storage_writes(spec: SynthJob, writers: tuple[int, ...], hop: HopPlan) -> JobEvidence:
    """The job's evidence plus, from FAULT on, each writer's flow to the storage (a
    peer outside the job: its checkpoint writes) carrying `hop`."""
    ev = build(spec)
    for k in writers:
        key = CellKey(spec.node(k), spec.addr(k), STORAGE, str(k))
        ev.cells[key] = {spec.t0_s + s: cell_second(hop) for s in range(FAULT, spec.seconds)}
    return ev


@pytest.mark.parametrize("hop, writers, cause, where", [
    # tor0's uplink overflows and also drops the checkpoints node0 and node1 write
    # through it: their RTT has no floor, so they cannot say "no queue"
    (uplink_queue, (0, 1), "buffer_saturation", "tor0 uplink"),
    # node1's port drops at random, its checkpoints too, and the store answers late
    (lossy_port(1), (1,), "lossy_link", "node1")])
def test_lossy_hops_to_a_peer_outside_the_job_do_not_vote_on_the_queue(hop, writers, cause,
                                                                      where):
    spec = SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop)
    ev = with_storage_writes(spec, writers, HopPlan(loss=0.02, rtt_us=6000.0))
    engine = JobEngine(spec.job, tor_of=TWO_TORS)
    findings = replay(engine, ev, spec.t0_s, spec.end_s + 5)
    assert [(f.cause, f.where) for f in serious(findings)] == [(cause, where)]


@pytest.mark.parametrize("port, reads, named, waits", [
    # node3's port paces all node3 receives: its reads too
    ("narrowed", True, "node3", False),
    # a queue upstream: node3's reads still arrive at line rate, through its port and
    # tor1's downlink, neither of which the ring's one hop alone could overfill
    ("kept", True, "tor0 uplink", False),
    # no reads: all node3 receives crosses the uplink, at its pace; nothing tells the
    # places apart, and the wait ends with the guess for a queue, the uplink
    ("narrowed", False, "tor0 uplink", True)],
    ids=["port-narrowed", "peak-kept", "no-witness"])
def test_a_queue_into_a_node_is_placed_by_the_peak_its_nic_receives(port, reads, named,
                                                                    waits):
    """0 -> 3, the ring's one hop into node3 and the one hop through tor0's uplink, is
    lossy and delayed, and fits node3's port, tor1's downlink and tor0's uplink. Where
    node3 receives other data (its reads) at a fifth of its usual peak, its port
    paces it and is named; at its usual peak, its port and tor1's downlink pass
    traffic at full rate and the uplink is named; both without waiting. Without
    such data the engine waits for a hop that tells the places apart."""
    def hop(s, src, dst):
        if s >= FAULT and (src, dst) == (0, 3):
            return HopPlan(loss=0.01, rtt_us=6000.0)
        return HopPlan()

    def rx_peak(s, k):
        return 0.1 if port == "narrowed" and s >= FAULT and k == 3 else 0.5

    def read_slow(s, k):          # a narrowed port paces node3's reads as well
        return 5.0 if port == "narrowed" and s >= FAULT and k == 3 else 1.0
    engine, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(no_reads=not reads),
                                    hop=hop, rx_peak=rx_peak, read_slow=read_slow,
                                    reads=lambda s, k: 2_000_000 if reads else 0),
                           tor_of=TWO_TORS)
    (f,) = serious(findings)
    assert (f.cause, f.where) == ("buffer_saturation", named)
    assert (f.first_seen_ns >= at(FAULT + AMBIGUOUS_EVALS)) is waits


@pytest.mark.parametrize("fed", ["reads", "rack", "other rack", "idle"])
def test_a_port_is_judged_only_by_data_that_crossed_no_other_racks_uplink(fed):
    """Node3's NIC peaks at a fiftieth of its usual from FAULT on, while the hop into it
    resends. Its port is narrowed where node3 receives data that came through no
    other rack's uplink meanwhile (its reads; its ring neighbour's hop where node0
    shares its rack); data from node0 in the other rack arrives at the pace of tor0's
    uplink, which may be what narrows it, and an idle node (its training over) lost
    and received nothing: neither says anything about the port. The ranks read
    nothing from outside the job (no data_load phases): the port is judged by its NIC
    peaks alone."""
    def hop(s, src, dst):
        if s >= FAULT and dst == 3:
            return HopPlan(bytes=0) if fed == "idle" else HopPlan(loss=0.01, rtt_us=6000.0)
        return HopPlan()
    spec = SynthJob(nodes=4, seconds=60, hop=hop, step=lambda i, t: StepPlan(data_load=0.0),
                    rx_peak=lambda s, k: 0.01 if s >= FAULT and k == 3 else 0.5,
                    reads=lambda s, k: 2_000_000 if fed == "reads" and k == 3 else 0)
    # node3's ring neighbour is node0 (k -> k-1): in its rack, or in the other one
    tor_of = {node(0): "tor1", node(1): "tor0", node(2): "tor0", node(3): "tor1"}.get \
        if fed == "rack" else TWO_TORS
    engine = JobEngine(spec.job, tor_of=tor_of)
    replay(engine, build(spec), spec.t0_s, spec.end_s)
    snap = engine.snapshot(spec.end_s)
    rates = port_rates(snap, tor_of, bad_cells(snap))
    assert (("in", "node3") in rates.narrowed) is (fed in ("reads", "rack"))
    assert ("in", "node3") not in rates.kept


@pytest.mark.parametrize("slowed, narrowed, kept", [
    ({3}, {("in", "node3")}, set()),
    ({2, 3}, {("down", "tor1")}, set()),
    (set(), set(), {("in", "node3"), ("down", "tor1")})],
    ids=["port", "downlink", "upstream"])
def test_the_reads_into_a_node_say_whether_the_way_in_is_narrowed(slowed, narrowed, kept):
    """0 -> 3 queues and resends while the NIC peaks say nothing (a shaper's bucket lets
    100 us bursts through at line rate). The reads from storage cross only the way
    into their node: node3's alone slowed four times (its port), node2's and node3's
    (tor1's downlink, the least slowed of its rack), or none (the queue is upstream:
    both are kept), each against the other nodes' reads."""
    def hop(s, src, dst):
        return HopPlan(loss=0.01, rtt_us=6000.0) if s >= FAULT and (src, dst) == (0, 3) \
            else HopPlan()
    spec = SynthJob(nodes=4, seconds=FAULT + 4, hop=hop,
                    read_slow=lambda s, k: 4.0 if s >= FAULT - 1 and k in slowed else 1.0)
    engine = JobEngine(spec.job, tor_of=TWO_TORS)
    replay(engine, build(spec), spec.t0_s, spec.end_s)
    snap = engine.snapshot(spec.end_s)
    rates = port_rates(snap, TWO_TORS, bad_cells(snap))
    assert narrowed <= rates.narrowed and not narrowed & rates.kept
    assert kept <= rates.kept


@pytest.mark.parametrize("holes_into, named", [
    ({2, 3}, "tor1 uplink"), ({3}, "node3"), (set(), "node0")],
    ids=["rack", "node", "none"])
def test_holes_in_what_nodes_receive_from_outside_place_a_lossy_way_in(holes_into, named):
    """0 -> 3, the ring's one hop into rack tor1, loses 1 % at the RTT floor: node0's
    port, tor0's uplink, tor1's downlink and node3's port all lie on it. The nodes'
    reads from storage come only through the way into their rack and node, and only
    their receivers see what it drops: holes in the reads of node2 and node3 put the
    drop on tor1's link, in node3's alone on its port (holes name no place of their
    own, they rank those the lossy hop implicates); without them the hop alone leaves
    the guess for random loss: the port the frames leave through."""
    def hop(s, src, dst):
        return HopPlan(loss=0.01) if s >= FAULT and (src, dst) == (0, 3) else HopPlan()
    spec = SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop,
                    reads=lambda s, k: 2_000_000,
                    read_holes=lambda s, k: 80 if s >= FAULT and k in holes_into else 0)
    engine, findings = run(spec, tor_of=TWO_TORS)
    (f,) = serious(findings)
    assert (f.cause, f.where) == ("lossy_link", named)


def test_a_second_whose_nic_peak_has_not_come_is_not_judged():
    """Node3 receives its reads while the hop into it resends, but its nic_window of
    the fault's seconds has not reached the store (its tcp_node has): those seconds
    say nothing of its port, neither narrowed nor kept."""
    def hop(s, src, dst):
        return HopPlan(loss=0.05, rtt_us=6000.0) if s >= FAULT and dst == 3 else HopPlan()
    spec = SynthJob(nodes=4, seconds=FAULT + 4, hop=hop,
                    step=lambda i, t: StepPlan(data_load=0.0),   # judged by its peaks alone
                    rx_peak=lambda s, k: 0.0 if s >= FAULT and k == 3 else 0.5,
                    reads=lambda s, k: 2_000_000 if k == 3 else 0)
    engine = JobEngine(spec.job, tor_of=TWO_TORS)
    replay(engine, build(spec), spec.t0_s, spec.end_s)
    snap = engine.snapshot(spec.end_s)
    rates = port_rates(snap, TWO_TORS, bad_cells(snap))
    assert ("in", "node3") not in rates.narrowed | rates.kept
    assert ("down", "tor1") not in rates.narrowed | rates.kept


def test_a_port_is_judged_over_the_seconds_of_the_fault_after_its_first():
    """Node3's port narrows at FAULT, to 0.4 of its usual peak, but the second the
    fault began in still passed its usual peak (the shaper came mid-second): neither
    that second nor the healthy ones before it count, and node3's reads in the
    fault's later seconds say its port is narrowed (with the onset second, the median
    of the two, 0.7 of its usual, would say neither)."""
    def hop(s, src, dst):
        return HopPlan(loss=0.05, rtt_us=6000.0) if s >= FAULT and dst == 3 else HopPlan()

    def rx_peak(s, k):
        return 0.2 if s > FAULT and k == 3 else 0.5
    spec = SynthJob(nodes=4, seconds=FAULT + 3, hop=hop, rx_peak=rx_peak,
                    step=lambda i, t: StepPlan(data_load=0.0),   # judged by its peaks alone
                    reads=lambda s, k: 2_000_000 if k == 3 else 0)
    engine = JobEngine(spec.job, tor_of=TWO_TORS)
    replay(engine, build(spec), spec.t0_s, spec.end_s)
    snap = engine.snapshot(spec.end_s)
    assert snap.window.start_s <= spec.t0_s + FAULT      # the window holds the onset
    rates = port_rates(snap, TWO_TORS, bad_cells(snap))
    assert ("in", "node3") in rates.narrowed and ("in", "node3") not in rates.kept


def test_a_queue_a_checkpoint_shares_is_named_on_its_uplink_without_waiting():
    """tor0's uplink queues and overflows, on the ring's one hop through it (0 -> 3, its
    ACK hop not delayed) and on node0's checkpoint writes. node0's port explains both
    lossy hops as well, but only as the way they leave node0: a queue there is its
    NIC's, which is no switch buffer; so the uplink is named without waiting
    AMBIGUOUS_EVALS evaluations for a hop that tells the two apart."""
    def hop(s, src, dst):
        if s >= FAULT and (src, dst) == (0, 3):
            return HopPlan(loss=0.01, rtt_us=6000.0)
        return HopPlan()
    spec = SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop)
    ev = with_storage_writes(spec, (0,), HopPlan(loss=0.02))
    findings = replay(JobEngine(spec.job, tor_of=TWO_TORS), ev, spec.t0_s, spec.end_s + 5)
    (f,) = serious(findings)
    assert (f.cause, f.where) == ("buffer_saturation", "tor0 uplink")
    assert f.first_seen_ns < at(FAULT + AMBIGUOUS_EVALS)


@pytest.mark.parametrize("ring_loss, cause", [
    # the checkpoints through tor0's uplink lose 2 %, the ring's steady hop through it
    # (0 -> 3, 16 MB a second: over a window, some 20 of the checkpoints' drops' worth)
    # nothing: the drops hit the bursts, a shallow buffer's
    (0.0, "buffer_saturation"),
    # the steady hop loses its share as well: frames die independent of load
    (0.02, "lossy_link")])
def test_loss_that_spares_the_steady_traffic_through_a_place_is_a_buffers(ring_loss, cause):
    def hop(s, src, dst):
        steady = 16_000_000 if (src, dst) == (0, 3) else HopPlan.bytes
        return HopPlan(steady, loss=ring_loss if s >= FAULT and (src, dst) == (0, 3) else 0.0)
    spec = SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop)
    ev = with_storage_writes(spec, (0, 1), HopPlan(loss=0.02))     # RTT at the floor
    # tor1's nodes write theirs unharmed: the store's own port is not the place
    ev.cells.update(with_storage_writes(spec, (2, 3), HopPlan()).cells)
    findings = replay(JobEngine(spec.job, tor_of=TWO_TORS), ev, spec.t0_s, spec.end_s + 5)
    assert [(f.cause, f.where) for f in serious(findings)] == [(cause, "tor0 uplink")]
    f = serious(findings)[0]
    spared = [e for e in f.evidence if e.what.startswith("payload resent on the clean hops")]
    if cause == "buffer_saturation":
        assert "spare the others through it (0.000% of" in f.summary
        assert spared and spared[0].value == 0.0
    else:
        assert not spared


def test_a_lossy_port_with_one_hop_delayed_by_its_host_is_still_a_lossy_link():
    """Node1's port drops at random both ways; a busy host delays one of its two lossy
    hops (1 -> 0) now and then. A queue must show on most of the lossy hops: one of
    two is a tie, which proves no queue before the drop."""
    lossy = lossy_port(1)

    def hop(s, src, dst):
        h = lossy(s, src, dst)
        return HopPlan(loss=h.loss, rtt_us=3000.0) if (src, dst) == (1, 0) and h.loss else h
    _, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop))
    assert [(f.cause, f.where) for f in serious(findings)] == [("lossy_link", "node1")]


def test_a_queue_shown_in_the_seconds_that_lose_is_a_buffer_though_others_outweigh_them():
    """Node1's port overflows in every other second (its queue fills and drops: 5 %
    resent at 4 ms), and passes the seconds between at full rate with no queue and
    four times the RTT samples. Over each window the quiet seconds' samples outweigh
    the lossy ones', so the window's RTT sits at the floor; in the seconds that lost,
    the queue stood: a buffer's drops, not a lossy link's."""
    def hop(s, src, dst):
        if s < FAULT or 1 not in (src, dst):
            return HopPlan()
        return HopPlan(bytes=1_000_000, loss=0.05, rtt_us=4000.0) if (s - FAULT) % 2 \
            else HopPlan()
    _, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop))
    assert [(f.cause, f.where) for f in serious(findings)] == [("buffer_saturation", "node1")]


def delayed_from_fault(rtt_us: float, nodes=None):
    """From FAULT, the hops into and out of `nodes` (None: every hop) take rtt_us."""
    def hop(s, src, dst):
        late = s >= FAULT and (nodes is None or src in nodes or dst in nodes)
        return HopPlan(rtt_us=rtt_us) if late else HopPlan()
    return hop


def test_a_nodes_slow_link_stands_out_of_the_others_hops():
    """Node1's hops take 3 ms from FAULT, the ring waits on them, the rest stay at
    0.2 ms: the delay is node1's row and column."""
    _, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(),
                               hop=delayed_from_fault(3000.0, nodes={1})))
    assert [(f.cause, f.where) for f in serious(findings)] == [("straggler_network", "node1")]


@pytest.mark.parametrize("rest_us", [3000.0, 1100.0])
def test_a_fabric_whose_every_hop_is_late_has_no_slow_link_of_one_node(rest_us):
    """From FAULT node1's hops take 3 ms (1.6 ms) and every other hop as long (1.1 ms:
    too little over the floor to count as queued): the others carry more than half
    of node1's extra RTT, so no node's link stands out; the fabric's latency rose."""
    mine = delayed_from_fault(3000.0 if rest_us == 3000.0 else 1600.0, nodes={1})
    rest = delayed_from_fault(rest_us)

    def hop(s, src, dst):
        return mine(s, src, dst) if 1 in (src, dst) else rest(s, src, dst)
    _, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop))
    assert "straggler_network" not in {f.cause for f in serious(findings)}


def test_loss_beside_a_compute_straggler_is_placed_at_the_lossy_port():
    """Node2's port drops (hops 3 -> 2 and 2 -> 1) while rank 3 computes late: its
    slow host delays the hop into it (0 -> 3) and the ring waits on it. The delay is
    the straggler's host, not a second lossy place."""
    lossy = lossy_port(2)

    def hop(s, src, dst):
        h = lossy(s, src, dst)
        return HopPlan(rtt_us=3000.0) if s >= FAULT and (src, dst) == (0, 3) else h

    def step(i, t):
        return StepPlan() if t < FAULT else StepPlan(seconds=3.8, sync=3.1,
                                                     sync_of={"3": 0.3})
    _, findings = run(SynthJob(nodes=4, seconds=60, step=step, hop=hop))
    assert sorted((f.cause, f.where) for f in serious(findings)) == [
        ("lossy_link", "node2"), ("straggler_compute", "node3")]


def with_lossy_checkpoint_through_tor0(hop) -> list[Finding]:
    """A 4-node job across two ToRs with these hops, where node1's checkpoint to the
    storage loses frames through tor0's uplink from 15 s after FAULT on: the flow that
    tells the uplink from the ports on the ring's one hop across it. Its findings."""
    spec = SynthJob(nodes=4, seconds=70, step=slowed_sync(), hop=hop)
    ev = build(spec)
    key = CellKey(spec.node(1), spec.addr(1), STORAGE, "1")
    ev.cells[key] = {spec.t0_s + s: cell_second(HopPlan(loss=0.02))
                     for s in range(FAULT + 15, spec.seconds)}
    return replay(JobEngine(spec.job, tor_of=TWO_TORS), ev, spec.t0_s, spec.end_s + 5)


def test_a_finding_whose_hops_a_later_place_explains_with_more_is_taken_over():
    """tor0's uplink drops at random: at first only the ring's hop 0 -> 3 crosses it,
    which node0's port explains as well (the last guess names the port); 15 s later
    node1's checkpoint loses frames through the uplink too, which node0's port cannot
    explain. The uplink's finding takes node0's over: node0's closes, superseded by
    it, and is not the primary."""
    def hop(s, src, dst):
        return HopPlan(loss=0.01) if s >= FAULT and (src, dst) == (0, 3) else HopPlan()
    findings = with_lossy_checkpoint_through_tor0(hop)
    by_where = {f.where: f for f in serious(findings)}
    assert sorted(by_where) == ["node0", "tor0 uplink"]
    port, uplink = by_where["node0"], by_where["tor0 uplink"]
    assert port.first_seen_ns < uplink.first_seen_ns
    assert port.superseded_by == uplink.id and not port.open
    assert uplink.open and uplink.superseded_by is None
    assert primary(findings) is uplink


def test_a_busy_hosts_delayed_hop_does_not_hold_a_finding_the_loss_moved_on_from():
    """tor0's uplink queues and overflows (0 -> 3 lossy and delayed) while node3's busy
    host answers late (3 -> 2 delayed, from before the fault on): node3's port explains
    both hops and is named first. Once node1's checkpoint loses frames through the
    uplink, the uplink explains node3's only lossy hop and one node3 cannot: node3's
    finding closes, taken over, though no loss at the uplink explains its delayed hop."""
    def hop(s, src, dst):
        if s >= FAULT - 10 and (src, dst) == (3, 2):
            return HopPlan(rtt_us=6000.0)
        return HopPlan(loss=0.01, rtt_us=6000.0) if s >= FAULT and (src, dst) == (0, 3) \
            else HopPlan()
    findings = with_lossy_checkpoint_through_tor0(hop)
    by_where = {f.where: f for f in serious(findings)}
    assert sorted(by_where) == ["node3", "tor0 uplink"]
    port, uplink = by_where["node3"], by_where["tor0 uplink"]
    assert port.first_seen_ns < uplink.first_seen_ns
    assert port.superseded_by == uplink.id and not port.open
    assert uplink.cause == "buffer_saturation" and uplink.open
    assert primary(findings) is uplink


def test_a_hop_slow_all_along_does_not_tip_the_place_of_a_new_loss():
    """tor0's uplink queues and overflows (0 -> 3 lossy and delayed), and node0's busy
    host has answered late on 1 -> 0 since the job began (1.5 ms against a 0.2 ms
    floor). Node0's port, the uplink and node3's port explain the lossy hop alike;
    the hop that was this slow in the job's baseline says nothing of which, so the
    engine waits for the tie to be told apart, then names the place where such a
    loss with a queue sits: the uplink, not node0's port."""
    def hop(s, src, dst):
        if (src, dst) == (1, 0):
            return HopPlan(rtt_us=1500.0)
        return HopPlan(loss=0.01, rtt_us=6000.0) if s >= FAULT and (src, dst) == (0, 3) \
            else HopPlan()
    _, findings = run(SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop),
                      tor_of=TWO_TORS)
    assert [(f.cause, f.where) for f in serious(findings)] == [("buffer_saturation",
                                                                "tor0 uplink")]


def test_a_queue_that_drains_for_a_window_keeps_its_place_before_it_is_named():
    """tor0's uplink queues and overflows (0 -> 3 lossy and delayed); for 3 s its
    queue drains between the bursts while the drops go on, node0's checkpoint loses
    frames through it too, and node1's checkpoint crosses it unharmed. Those windows
    alone read as a link that drops at random, which node1's clean checkpoint clears
    the uplink of: node0's port, which explains both lossy hops. The hop's queue, seen
    seconds before, stands: the uplink is named, and nothing else."""
    def hop(s, src, dst):
        if s >= FAULT and (src, dst) == (0, 3):
            return HopPlan(loss=0.01, rtt_us=200.0 if FAULT + 3 <= s < FAULT + 6 else 6000.0)
        return HopPlan()
    spec = SynthJob(nodes=4, seconds=60, step=slowed_sync(), hop=hop)
    ev = build(spec)
    ev.cells[CellKey(spec.node(1), spec.addr(1), STORAGE, "1")] = {
        spec.t0_s + s: cell_second(HopPlan()) for s in range(FAULT, spec.seconds)}
    ev.cells[CellKey(spec.node(0), spec.addr(0), STORAGE, "0")] = {
        spec.t0_s + s: cell_second(HopPlan(loss=0.02)) for s in range(FAULT + 3, FAULT + 6)}
    findings = replay(JobEngine(spec.job, tor_of=TWO_TORS), ev, spec.t0_s, spec.end_s + 5)
    assert [(f.cause, f.where) for f in serious(findings)] == [("buffer_saturation",
                                                                "tor0 uplink")]


def test_a_place_named_a_lossy_link_whose_queue_then_stands_is_a_buffer():
    """tor0's uplink drops without a queue showing for its first 6 s (0 -> 3 lossy at
    the floor's RTT; node1's checkpoint through it lossy too, so the uplink is named),
    then the queue stands in every window: the evidence has changed its mind, not
    flickered. A buffer finding at the uplink takes the lossy link's over."""
    def hop(s, src, dst):
        if s >= FAULT and (src, dst) == (0, 3):
            return HopPlan(loss=0.01, rtt_us=200.0 if s < FAULT + 6 else 6000.0)
        return HopPlan()
    spec = SynthJob(nodes=4, seconds=70, step=slowed_sync(), hop=hop)
    ev = build(spec)
    ev.cells[CellKey(spec.node(1), spec.addr(1), STORAGE, "1")] = {
        spec.t0_s + s: cell_second(HopPlan(loss=0.02)) for s in range(FAULT, spec.seconds)}
    findings = replay(JobEngine(spec.job, tor_of=TWO_TORS), ev, spec.t0_s, spec.end_s + 5)
    by_cause = {f.cause: f for f in serious(findings)}
    assert sorted((f.cause, f.where) for f in serious(findings)) == [
        ("buffer_saturation", "tor0 uplink"), ("lossy_link", "tor0 uplink")]
    link, buffer = by_cause["lossy_link"], by_cause["buffer_saturation"]
    assert link.superseded_by == buffer.id and not link.open
    assert primary(findings) is buffer


def test_a_place_keeps_its_cause_when_its_queue_dips():
    """The queue drains for 14 s while the drops go on: the windows past what the
    recent queue covers (memory.LOSS_MEMORY_S) read a lossy link, fewer times in a row
    than revise a cause (CAUSE_REVISE_EVALS). Its steps cost the most then (the windows
    read them a few seconds late), and still the finding's account stays its cause's."""
    def hop(s, src, dst):
        h = uplink_queue(s, src, dst)
        return HopPlan(loss=h.loss) if 40 <= s < 54 else h

    def step(i, t):
        return StepPlan(seconds=2.0, sync=1.3) if 45 <= t < 50 else slowed_sync()(i, t)
    engine, findings = run(SynthJob(nodes=4, seconds=64, step=step, hop=hop),
                           tor_of=TWO_TORS)
    # the drops alone would be a lossy link (at tor0, or at node0, the sender of the
    # lossy hop): the open finding's place wins the tie and keeps its cause
    assert [(f.cause, f.where, f.open) for f in serious(findings)] == [
        ("buffer_saturation", "tor0 uplink", True)]
    assert serious(findings)[0].start_ns == at(FAULT)
    # and its sentence: the dip's windows, read as a lossy link, only say it goes on
    assert serious(findings)[0].summary.startswith("Buffer saturation at tor0's uplink: "), \
        serious(findings)[0].summary


def test_a_new_network_finding_needs_two_agreeing_evaluations():
    def evaluate(engine, spec, t):
        engine.ev = JobEvidence(engine.job)
        engine.feed(slice_until(build(spec), T0 + t))
        return [f.cause for f in engine.evaluate(at(t))]

    one = SynthJob(seconds=40, hop=lossy_port(1))
    two = SynthJob(seconds=40, hop=lossy_port(2))
    engine = JobEngine(one.job)
    assert evaluate(engine, one, FAULT + 1) == []           # seen once: not yet
    assert evaluate(engine, two, FAULT + 2) == []           # another place: starts over
    assert evaluate(engine, two, FAULT + 3) == ["lossy_link"]
    assert [f.place["node"] for f in engine.open.values()] == ["node2"]


def test_one_bad_second_read_by_several_evaluations_opens_no_finding():
    """One second of loss at node2's port (the ring's first hop to meet a fault, a
    host's stall) is in three overlapping windows; two evaluations agree on it, but it
    spans no confirm_seconds, so it stays pending and is gone with its window. The
    fault at node1 that follows, persisting, opens as soon as two evaluations agree."""
    blip, fault = lossy_port(2, since=FAULT, until=FAULT + 1), lossy_port(1, since=FAULT + 6)

    def hop(s, src, dst):
        a, b = blip(s, src, dst), fault(s, src, dst)
        return a if a.loss else b
    engine, findings = run(SynthJob(seconds=60, step=slowed_sync(since=FAULT + 6), hop=hop))
    assert DEFAULT.confirm_seconds == 2
    assert [(f.cause, f.where) for f in serious(findings)] == [("lossy_link", "node1")]
    assert serious(findings)[0].first_seen_ns == at(FAULT + 6 + 2)


def test_a_fault_that_stops_ends_at_its_last_evidence():
    spec = SynthJob(seconds=70, step=slowed_sync(until=40), hop=lossy_port(1, until=40))
    _, findings = run(spec)
    (f,) = serious(findings)
    assert f.cause == "lossy_link" and not f.open
    # the last lossy second is FAULT..39: the finding ends with it, not with the
    # evaluation windows that still held it
    assert f.end_ns == at(40) and f.last_seen_ns == at(40)
    assert f.step_seconds_added == 0.5        # its account is that of its worst


# -- steps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_rank_computing_five_times_the_others_is_a_compute_straggler(progress):
    def step(i, t):
        if t < FAULT:
            return StepPlan()
        # rank 2 computes 3.5 s instead of 0.7 s; the others wait inside grad sync
        return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3})
    _, findings = run(SynthJob(seconds=60, progress=progress, step=step))
    assert [(f.cause, f.where) for f in serious(findings)] == [("straggler_compute",
                                                                "node2")]
    f = serious(findings)[0]
    assert f.place["rank"] == "2"
    assert f.victims == [{"rank": "0", "node": "node0", "waited_s": 2.8},
                         {"rank": "1", "node": "node1", "waited_s": 2.8}]
    assert f.step_seconds_added == 2.8 and f.explained_share == 1.0
    assert f.start_ns == at(FAULT)                # its first late step
    assert "rank 2 on node2 computes 3.450 s per step against 0.650 s" in f.summary
    assert f.advice[0].knob == "host of rank 2"
    # the others' long grad sync is the straggler's doing, not the fabric's
    assert all(g.severity == "info" for g in findings if g.cause == "network_bound")


def late_rank_2(i, t):
    """Rank 2 computes 3.5 s per step from FAULT on; the others wait inside grad sync
    for it (3.3 s), then compute 0.5 s."""
    if t < FAULT:
        return StepPlan()
    return StepPlan(seconds=3.8, sync=3.3, sync_of={"2": 0.3})


def test_a_straggler_is_named_from_the_step_it_is_in_before_that_step_ends():
    """With the agents' reports of the steps in progress (gloo_progress), rank 2's
    second late step is late while it still runs: it is named before that step ends,
    and from the steps alone only after; the same finding either way."""
    _, plain = run(SynthJob(seconds=60, step=late_rank_2))
    _, early = run(SynthJob(seconds=60, step=late_rank_2, progress=True))
    (a,) = [f for f in serious(plain) if f.cause == "straggler_compute"]
    (b,) = [f for f in serious(early) if f.cause == "straggler_compute"]
    second_late_step_ends = at(FAULT + 2 * 3.8)
    assert a.first_seen_ns >= second_late_step_ends > b.first_seen_ns
    assert (b.place, b.start_ns, b.severity) == (a.place, a.start_ns, a.severity)


def test_the_step_in_progress_names_it_with_what_it_shows_so_far():
    engine = JobEngine("198.18.0.1:29500")
    ev = build(SynthJob(seconds=60, step=late_rank_2, progress=True))
    # 3.2 s into rank 2's second late step (from FAULT + 3.8): 0.3 s of sync, then
    # computing 2.9 s so far (2.85 s outside its 0.05 s read), against the others'
    # 0.65 s before; they wait for it now
    engine.feed(slice_until(ev, T0 + FAULT + 7))
    engine.evaluate(at(FAULT + 7))
    (f,) = [f for f in serious(engine.findings()) if f.cause == "straggler_compute"]
    (now,) = [e for e in f.evidence if e.measurement == "gloo_progress"]
    assert now.what == ("step in progress of rank 2: computing, 3.200 s so far, while 2 of "
                        "the others are inside a collective")
    assert now.value == 3.2 and now.nodes == ["node2"]
    assert "computes 2.850 s per step against 0.650 s" in f.summary


def test_a_rank_computing_long_while_the_others_compute_too_is_no_straggler():
    """Every rank's compute grows alike (a slow store's reads are inside compute): rank
    2, a little slower, is not late to a collective the others are not waiting in."""
    def step(i, t):
        if t < FAULT:
            return StepPlan()
        return StepPlan(seconds=3.8, sync=0.3, sync_of={"2": 0.1})
    _, findings = run(SynthJob(seconds=60, step=step, progress=True))
    assert not [f for f in findings if f.cause == "straggler_compute"]


def test_one_long_step_in_progress_is_no_straggler():
    """A rank descheduled through one step computes long in it: two late steps are
    still needed, the one in progress counting as one only after a late one."""
    def step(i, t):
        return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3}) if i == 30 else StepPlan()
    _, findings = run(SynthJob(seconds=60, step=step, progress=True))
    assert serious(findings) == []


def test_a_job_done_training_is_no_slowdown_while_its_last_step_stays_open():
    """Node1's port drops until the job ends; the ranks' training loops end, their
    processes live on (saving, tearing down): each rank's agent reports the step
    after the last one in progress, computing, for 60 s. No rank waits for another,
    so that step says nothing of the job's pace: once the lossy link's finding has
    closed (nothing crossed its place for JOB_GONE_S), the slow steps of the fault
    it explained are no slowdown left unexplained."""
    def step(i, t):          # x2.5: a slowdown left unexplained would be a warning
        return StepPlan(seconds=2.5, sync=1.8) if t >= FAULT else StepPlan()
    spec = SynthJob(seconds=60, step=step, hop=lossy_port(1), progress=True)
    ev = build(spec)
    for rank, steps in ev.steps.items():
        last = steps[max(steps)]
        ev.take_progress(Progress(rank, last.node, last.end_ns, 60.0, 0.3, False))
    for table in ev.nodes.values():          # the agents go on with their windows
        table.update({spec.end_s + s: NodeSecond(segs_out=10) for s in range(60)})
    engine = JobEngine(spec.job)
    findings = replay(engine, ev, spec.t0_s, spec.end_s + 60)
    assert [(f.cause, f.where, f.open) for f in serious(findings)] == [
        ("lossy_link", "node1", False)]


def test_a_duty_cycle_that_rises_as_the_steps_slow_unexplained_is_a_warning_after_a_hold():
    def step(i, t):         # every rank's grad sync grows alike, without loss or queueing
        return StepPlan(sync=0.6) if t < FAULT else StepPlan(seconds=1.7, sync=1.3)
    engine, findings = run(SynthJob(seconds=60, step=step))
    bound = [f for f in findings if f.cause == "network_bound"]
    assert bound and max(severity_rank(f.severity) for f in bound) == 1, bound
    warned = [f for f in findings if f.cause == "network_bound" and f.severity == "warning"]
    assert warned and "up from D = 0.60" in warned[0].summary
    # no other cause was named for it
    assert {f.cause for f in serious(findings)} <= {"network_bound", "unexplained_slowdown"}


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_an_unexplained_slowdown_is_taken_over_by_the_straggler_named_later(progress):
    """A rank that grows slow by degrees: at twice the others' compute it explains
    nothing yet (slow, cause unclear); at five times it is the straggler, and the
    unexplained slowdown was that."""
    def step(i, t):
        if t < FAULT:
            return StepPlan()
        if t < FAULT + 20:      # rank 2 computes 1.4 s against 0.7 s: under straggler_ratio
            return StepPlan(seconds=2.2, sync=1.5, sync_of={"2": 0.8})
        return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3})
    _, findings = run(SynthJob(seconds=80, progress=progress, step=step))
    (unclear,) = [f for f in serious(findings) if f.cause == "unexplained_slowdown"]
    (strag,) = [f for f in serious(findings) if f.cause == "straggler_compute"]
    assert strag.where == "node2" and strag.first_seen_ns > unclear.first_seen_ns
    assert unclear.superseded_by == strag.id and unclear.end_ns is not None
    assert primary(findings) is strag


def throttled_rank(throttled: dict[str, float], limit: dict[str, float] | None = None):
    """From FAULT on the steps take 2.0 s, every rank's grad sync 1.3 s and compute
    0.7 s as before: a CPU quota that bites inside the collectives makes no rank late
    to them; only the cgroups' throttled time differs."""
    def step(i, t):
        if t < FAULT:
            return StepPlan(throttled_of={r: 0.0 for r in "012"})
        return StepPlan(seconds=2.0, sync=1.3, throttled_of=throttled,
                        cpu_limit_of=limit or {})
    return step


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_late_rank_its_cpu_limit_throttles_is_named_with_the_limit(progress):
    def step(i, t):
        if t < FAULT:
            return StepPlan(throttled_of={r: 0.0 for r in "012"})
        return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3},
                        throttled_of={"2": 3.0}, cpu_limit_of={"2": 0.1})
    _, findings = run(SynthJob(seconds=70, progress=progress, step=step))
    (f,) = [f for f in serious(findings) if f.cause == "straggler_compute"]
    assert f.where == "node2" and "enters every collective 2.800 s late" in f.summary
    assert {e.what: e.value for e in f.evidence}[
        "CPU throttled per step of rank 2 (its cgroup's CFS quota; cpu.stat)"] == 3.0
    assert [a.knob for a in f.advice[:2]] == ["CPU limit of rank 2",
                                              "OMP_NUM_THREADS / torch.set_num_threads"]
    assert "0.10 CPU now" in f.advice[0].value


def changing_limit(held: bool):
    """Rank 2 throttled 1.4 s of each 2.0 s step from FAULT on, under a quota that
    differs from one step to the next (0.1 and 0.2 CPUs in turn), or (not held) that
    shows 0.1 CPUs at each step's end but changed during each step (a quota set anew
    at every step boundary, read a sample late)."""
    def step(i, t):
        if t < FAULT:
            return StepPlan(throttled_of={r: 0.0 for r in "012"})
        return StepPlan(seconds=2.0, sync=1.3, throttled_of={"2": 1.4},
                        cpu_limit_of={"2": 0.1 if i % 2 or not held else 0.2},
                        limit_held=held)
    return step


@pytest.mark.parametrize("held", [True, False], ids=["by-step", "within-steps"])
@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_throttled_rank_that_is_not_late_under_a_changing_quota_is_no_straggler(
        progress, held):
    """A quota that changes from step to step and bites inside the collectives slows
    the ring without making the rank late to them: the throttling alone names no
    straggler; the slowdown stays unexplained and its ruled-out straggler says which
    cgroup is throttled."""
    _, findings = run(SynthJob(seconds=70, progress=progress, step=changing_limit(held)))
    assert not [f for f in findings if f.cause == "straggler_compute"]
    why = [r["why"] for f in findings for r in f.ruled_out if r["cause"] == "straggler_compute"]
    assert any("rank 2's cgroup is throttled 1.400 s per step" in w for w in why), why


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_rank_a_standing_cpu_limit_throttles_is_a_straggler_though_not_late(progress):
    """Throttled through 1.4 s of each 2.0 s step under one limit (0.1 CPUs) that stays:
    the only throttled rank, and the steps took as much longer, so its limit sets the
    ring's pace though the rank enters the collectives on time (the lab's rank at 10 %
    of a CPU: throttled through 0.5-0.9 of each step, named by nothing before)."""
    _, findings = run(SynthJob(seconds=70, progress=progress,
                               step=throttled_rank({"2": 1.4}, {"2": 0.1})))
    (f,) = [f for f in serious(findings) if f.cause == "straggler_compute"]
    assert f.where == "node2" and f.place["rank"] == "2"
    assert "starved by its CPU limit (0.10 CPUs), throttled 1.400 s of its 2.000 s steps" \
        in f.summary
    assert f.advice[0].knob == "CPU limit of rank 2"
    assert primary(findings) is f


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_rank_its_cpu_limit_starves_is_a_straggler_though_not_late(progress):
    """Throttled through 1.9 s of each 2.0 s step: the quota sets the rank's pace inside
    the collectives too, so it is named though it enters them on time."""
    _, findings = run(SynthJob(seconds=70, progress=progress,
                               step=throttled_rank({"2": 1.9}, {"2": 0.1})))
    (f,) = [f for f in serious(findings) if f.cause == "straggler_compute"]
    assert f.where == "node2" and f.place["rank"] == "2"
    assert "starved by its CPU limit (0.10 CPUs), throttled 1.900 s of its 2.000 s steps" \
        in f.summary and "slow inside the collectives" in f.summary
    assert f.advice[0].knob == "CPU limit of rank 2"
    assert f.explained_share == 1.0 and f.step_seconds_added == 1.0
    assert [v["rank"] for v in f.victims] == ["0", "1"]
    assert primary(findings) is f


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_starved_rank_is_named_during_its_second_starved_step(progress):
    """Throttled through 2.85 s of each 3.0 s step from FAULT on: where the agents report
    the step in progress, the second starved step counts once it has run longer than
    a baseline step and straggler_min_share (its throttled share so far 0.95), a
    second before it ends; without the reports, when it ends. The summary gives the
    rank's throttled time per step as its steps and the one so far show it."""
    def step(i, t):
        if t < FAULT:
            return StepPlan(throttled_of={r: 0.0 for r in "012"})
        return StepPlan(seconds=3.0, sync=2.0, throttled_of={"2": 2.85},
                        cpu_limit_of={"2": 0.1})
    _, findings = run(SynthJob(seconds=70, progress=progress, step=step))
    (f,) = [f for f in serious(findings) if f.cause == "straggler_compute"]
    assert f.where == "node2" and "starved by its CPU limit (0.10 CPUs)" in f.summary
    assert f.first_seen_ns == at(FAULT + (5 if progress else 6))
    assert [v["rank"] for v in f.victims] == ["0", "1"]


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_limit_that_leaves_part_of_a_step_free_starves_no_rank(progress):
    """Throttled through 1.9 s of a 2.0 s step, then 1.3 s of the next (its quota was
    lifted during it): not starved in each of its last steps, so not named."""
    def step(i, t):
        if t < FAULT:
            return StepPlan(throttled_of={r: 0.0 for r in "012"})
        return StepPlan(seconds=2.0, sync=1.3, throttled_of={"2": 1.9 if i % 2 else 1.3})
    _, findings = run(SynthJob(seconds=70, progress=progress, step=step))
    assert not [f for f in findings if f.cause == "straggler_compute"]


def on_and_off(i, t):
    """Rank 2 throttled on every other step (2.0 s), free on the ones between (1.0 s,
    with 0.3 s of its neighbours' throttling spilled into them)."""
    if t < FAULT:
        return StepPlan(throttled_of={r: 0.0 for r in "012"})
    if i % 2:
        return StepPlan(throttled_of={"2": 0.3})
    return StepPlan(seconds=2.0, sync=1.3, throttled_of={"2": 1.4})


@pytest.mark.parametrize("step", [
    throttled_rank({"0": 1.4, "1": 1.4, "2": 1.4}),   # every rank alike: the job is limited
    throttled_rank({"2": 0.1}),                        # 0.1 s a step: under the min share
    on_and_off,                                        # jitter: not every step costs time
], ids=["alike", "little", "on-and-off"])
@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_throttling_that_singles_out_no_rank_names_no_straggler(progress, step):
    _, findings = run(SynthJob(seconds=70, progress=progress, step=step))
    assert not [f for f in findings if f.cause == "straggler_compute"]
    why = [r["why"] for f in findings for r in f.ruled_out if r["cause"] == "straggler_compute"]
    assert why and not any("cgroup is throttled" in w for w in why), why


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_one_slow_step_is_no_straggler(progress):
    def step(i, t):
        return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3}) if i == 30 else StepPlan()
    _, findings = run(SynthJob(seconds=60, progress=progress, step=step))
    assert serious(findings) == []


def test_growing_data_loads_with_steady_grad_sync_are_an_input_stall_at_the_store():
    def step(i, t):
        return StepPlan(data_load=0.1) if t < FAULT else StepPlan(seconds=1.7, data_load=0.8)
    engine, findings = run(SynthJob(seconds=60, step=step))
    assert [(f.cause, f.where) for f in serious(findings)] == [("input_stall",
                                                                f"peer {STORAGE}")]
    f = serious(findings)[0]
    assert f.place["peer"] == STORAGE
    assert engine.baseline.data_load_s == pytest.approx(0.1)
    assert f.step_seconds_added == pytest.approx(0.7, abs=1e-4)
    assert f.share_of_step == pytest.approx(0.7 / 1.7, abs=1e-4) and f.severity == "critical"
    assert [v["waited_s"] for v in f.victims] == [0.7, 0.7, 0.7]
    rate = {e.what: e.value for e in f.evidence}["read rate from the storage"]
    assert rate == round((1 << 20) / 0.8 / 1e6, 2)
    assert f.advice[0].knob == "DataLoader num_workers / prefetch_factor"


def streamed(ev: JobEvidence, piece_s: float) -> JobEvidence:
    """The job's reads as the agent reports a slow one: in pieces of piece_s, each a
    transfer of its own (gloo_phase data_load per piece)."""
    for phases in ev.phases.values():
        for key, p in [(k, p) for k, p in phases.items() if p.phase == "data_load"]:
            del phases[key]
            pieces = max(1, round(p.seconds / piece_s))
            for j in range(pieces):
                at_ns = p.time_ns + int(j * p.seconds / pieces * SECOND)
                phases[(at_ns, "data_load")] = p._replace(
                    time_ns=at_ns, seconds=p.seconds / pieces, bytes=p.bytes // pieces)
    return ev


def test_a_slow_store_is_named_while_the_second_slow_read_still_streams():
    """The store slows at FAULT: each step's read takes 2.0 s instead of 0.05 s, reported
    piece by piece as it streams. The first slow step ends at FAULT + 2.6; what has
    come of the second's read already makes the shorter of the two latest reads
    twice the baseline's, so the store is named before that step ends."""
    def step(i, t):
        return StepPlan() if t < FAULT else StepPlan(seconds=2.6, sync=0.3, data_load=2.0)
    spec = SynthJob(seconds=60, step=step, progress=True)
    engine = JobEngine(spec.job)
    findings = replay(engine, streamed(build(spec), 0.25), spec.t0_s, spec.end_s)
    (f,) = serious(findings)
    assert (f.cause, f.where) == ("input_stall", f"peer {STORAGE}")
    second_slow_step_ends = FAULT + 2 * 2.6
    assert at(FAULT + 2.6) < f.first_seen_ns < at(second_slow_step_ends)


def test_a_rank_computing_longer_while_nobody_waits_longer_is_no_straggler():
    """In two steps rank 2 computes 1.0 s against the others' 0.2 s, but the others'
    grad sync stays at the baseline's 0.8 s and the steps at 1.0 s: nobody waited for
    rank 2 (its time is known late, or spent where the ring does not wait), so it
    holds nobody back."""
    def step(i, t):
        if FAULT <= t < FAULT + 2:
            return StepPlan(seconds=1.0, sync=0.8, sync_of={"2": 0.0})
        return StepPlan(seconds=1.0, sync=0.8)
    _, findings = run(SynthJob(seconds=60, step=step))
    assert serious(findings) == []


@pytest.mark.parametrize("progress", [False, True], ids=["steps", "progress"])
def test_a_rank_that_meets_a_slow_store_first_is_no_straggler(progress):
    """The ranks' reads do not start together: rank 2 reads from the slowed store for
    two steps (1.6 s instead of 0.05 s) while the others still read fast and wait for it
    inside grad sync; then every rank reads slowly. Rank 2 computed three times the
    others' in those steps, all of it reading: the store's stall, not a straggler."""
    def step(i, t):
        if t < FAULT:
            return StepPlan()
        if t < FAULT + 2 * 2.55:
            return StepPlan(seconds=2.55, sync=1.85, sync_of={"2": 0.3},
                            data_load_of={"2": 1.6})
        return StepPlan(seconds=2.55, data_load=1.6)
    _, findings = run(SynthJob(seconds=60, progress=progress, step=step))
    assert [(f.cause, f.where) for f in serious(findings)] == [("input_stall",
                                                                f"peer {STORAGE}")]


def test_a_healthy_job_with_noise_and_checkpoints_raises_no_warning():
    rnd = random.Random(7)

    def step(i, t):
        checkpoint = 0.4 if i % 10 == 9 else 0.0
        return StepPlan(seconds=round(rnd.uniform(0.95, 1.05) + checkpoint, 3),
                        sync=round(rnd.uniform(0.28, 0.32), 3), checkpoint=checkpoint)

    def hop(s, src, dst):       # TCP's own probes resend a little; RTTs wander
        return HopPlan(bytes=rnd.randint(3_000_000, 5_000_000),
                       loss=rnd.choice([0.0, 0.0, 0.0003]), rtt_us=rnd.uniform(150, 400))
    engine, findings = run(SynthJob(seconds=120, step=step, hop=hop))
    assert serious(findings) == []
    assert engine.baseline is not None and engine.jitter.cusum == 0.0


def test_the_baseline_skips_a_stretch_with_a_warning():
    # the job starts with a lossy port (steps 1.5 s), which is cleared after 20 s
    spec = SynthJob(seconds=60, step=slowed_sync(since=0, until=20),
                    hop=lossy_port(1, since=0, until=20))
    engine, findings = run(spec)
    (lossy,) = serious(findings)
    assert lossy.cause == "lossy_link" and lossy.end_ns == at(20)
    b = engine.baseline
    assert (b.step_s, b.sync_s) == (1.0, 0.3)
    assert b.start_ns >= lossy.end_ns


# -- trends and telemetry -------------------------------------------------------------------

def spread_steps(spread_of):
    """Steps alternating 1 -/+ spread_of(t) s: the median stays 1 s, the spread is it."""
    def step(i, t):
        a = spread_of(t)
        return StepPlan(seconds=round(1.0 + (a if i % 2 else -a), 4))
    return step


def cusum_series(spec: SynthJob) -> tuple[JobEngine, list[float]]:
    engine, ev, out = JobEngine(spec.job), build(spec), []
    for t in range(spec.t0_s, spec.end_s + 3):
        engine.ev = JobEvidence(engine.job)
        engine.feed(slice_until(ev, t))
        engine.evaluate(t * SECOND)
        out.append(engine.jitter.cusum)
    return engine, out


def test_jitter_cusum_stays_at_zero_while_the_spread_holds():
    engine, series = cusum_series(SynthJob(seconds=90, step=spread_steps(lambda t: 0.06)))
    assert engine.baseline.spread_s == pytest.approx(0.06)
    assert set(series) == {0.0}
    assert not [f for f in engine.findings() if f.cause == "jitter_accumulation"]


def test_jitter_cusum_rises_on_a_growing_spread_and_raises_a_warning():
    """A spread that grows from 6 % to 40 % of the step: each step adds a window's share
    of its excess, so the sum crosses the alarm some windows after the spread doubled."""
    grow = 40
    engine, series = cusum_series(SynthJob(seconds=130, step=spread_steps(
        lambda t: 0.06 if t < grow else min(0.4, 0.06 + 0.01 * (t - grow)))))
    assert set(series[:grow]) == {0.0}
    rising = series[grow:]
    assert all(b >= a for a, b in zip(rising, rising[1:]))
    assert rising[-1] > DEFAULT.jitter_alarm
    (f,) = [f for f in engine.findings() if f.cause == "jitter_accumulation"]
    assert f.severity == "warning" and f.open
    assert f.start_ns >= at(grow)
    # the hops' RTTs are steady: no hop is named as the one that varies
    assert "hop" not in f.summary
    assert f.advice[0].knob == "the job's hops"


def test_a_silent_node_is_a_telemetry_gap_and_the_jobs_end_is_not():
    _, findings = run(SynthJob(seconds=60, silent_from={2: 30}), after_s=30)
    (gap,) = [f for f in findings if f.cause == "telemetry_gap"]
    assert gap.where == "node2" and gap.severity == "warning"
    assert gap.start_ns == at(29)                       # its last window
    assert gap.first_seen_ns >= at(29 + DEFAULT.silent_seconds)
    assert "No telemetry from node2" in gap.summary
    # every node stops at once when the job ends: that is no gap
    _, findings = run(SynthJob(seconds=60), after_s=30)
    assert [f for f in findings if f.cause == "telemetry_gap"] == []


def test_a_node_whose_steps_come_but_not_yet_its_windows_is_no_gap():
    """Its agent is up and reaches the collector (the steps are its records too): its
    network windows are late, as an agent starting its probes on a loaded host has
    them, and 'its agent is down or cut off' would be false."""
    spec = SynthJob(seconds=60)
    ev = build(spec)
    for key in [k for k in ev.cells if k.node == "node2"]:
        del ev.cells[key]
    del ev.nodes["node2"], ev.last_seen_ns["node2"]
    found = replay(JobEngine(spec.job), ev, spec.t0_s, spec.end_s)
    assert [f for f in found if f.cause == "telemetry_gap"] == []


def test_records_an_agent_dropped_are_an_info_gap():
    ev = build(SynthJob(seconds=20))
    engine = JobEngine(ev.job)
    engine.feed(ev)
    engine.evaluate(at(20))
    ev.lost_records = {"node1": 5}
    engine.feed(ev)
    (f,) = [f for f in engine.evaluate(at(21)) if f.cause == "telemetry_gap"]
    assert f.severity == "info" and f.place["node"] == "node1"
    assert "dropped 5 records" in f.summary


def test_a_read_still_coming_in_pieces_counts_with_what_has_come_of_it():
    """A slow store streams each read in pieces, and the agent reports a piece when
    the next begins: the latest step's read lacks its last piece until the next
    step reads. What has come of it is a lower bound on its length, taken now
    (the shorter of the last two steps' reads), not a step later."""
    from fabricscope.diagnosis.evidence import JobEvidence, Phase, Step
    from fabricscope.diagnosis.snapshot import recent_ranks
    ev = JobEvidence("j")
    table, phases = ev.steps.setdefault("0", {}), ev.phases.setdefault("0", {})
    for i, (length, read) in enumerate([(1.0, 0.05), (1.0, 0.05), (2.0, 1.0), (2.0, 1.0)]):
        start = 10 * SECOND + i * 2 * SECOND
        table[start] = Step("0", "n0", start, length, 0.3, length - 0.3)
        pieces = 10 if i < 3 else 6          # the latest read: 6 of its 10 pieces so far
        for k in range(pieces):
            t = start + int(0.3 * SECOND) + int(k * read / 10 * SECOND)
            phases[(t, "data_load")] = Phase("0", "n0", t, "data_load", read / 20, 1000,
                                             "198.18.0.254:9000")
    recent = recent_ranks(ev, 1 << 62, 3)["0"]
    assert recent.data_load == pytest.approx(0.5 + 0.05)      # 6 pieces: 0.5 s + a piece


def test_a_step_whose_read_has_not_come_is_not_judged_for_lateness():
    """Every rank reads every step; rank 2's reads come to take 0.8 s (a congested way
    in), the others waiting for it, and its last two steps' reads have not reached the
    engine yet (the agent reports a read
    once its flow settles). Those steps' compute is not known, so rank 2 is not a
    straggler on them; once its reads are in, its compute is its own again."""
    from fabricscope.diagnosis.snapshot import recent_ranks
    def step(i, t):     # from 15 s rank 2 reads for 0.8 s a step and the others wait
        if t < 15:
            return StepPlan(seconds=0.5, sync=0.3, data_load=0.02)
        return StepPlan(seconds=1.0, sync=0.9, data_load=0.02, data_load_of={"2": 0.8},
                        sync_of={"2": 0.1})
    spec = SynthJob(nodes=4, seconds=30, step=step)
    ev = build(spec)
    late = sorted(ev.steps["2"])[-2:]
    for k in [k for k in ev.phases["2"] if k[0] >= late[0] and k[1] == "data_load"]:
        del ev.phases["2"][k]
    ranks = recent_ranks(ev, spec.end_s * SECOND, 3)
    assert ranks["2"].step_cpu[-2:] == [None, None]
    engine = JobEngine(spec.job)
    engine.feed(ev)
    engine.evaluate(spec.end_s * SECOND)
    assert not [f for f in engine.findings() if f.cause == "straggler_compute"]


def test_holes_in_reads_alone_name_nothing():
    """The reads of two nodes come with packets out of order while every hop of the job
    is clean: a path that reorders (a veth whose sender changed CPUs) gives as much,
    so holes alone are no lossy link anywhere."""
    spec = SynthJob(nodes=4, seconds=60, reads=lambda s, k: 2_000_000,
                    read_holes=lambda s, k: 300 if s >= FAULT and k in (2, 3) else 0)
    _, findings = run(spec, tor_of=TWO_TORS)
    assert serious(findings) == []


def test_a_node_port_in_series_with_its_rack_uplink_is_said_so_plainly():
    """A ToR with one node: the node's port and the ToR's uplink are crossed by the
    same paths, and the note says so without the two racks' wording."""
    from fabricscope.diagnosis.detect_network import in_series_note
    note = in_series_note(["tor1's uplink"], between_racks=False)
    assert note == (" (tor1's uplink lies in series with it on every path of the job's "
                    "nodes: only traffic leaving or entering the job tells them apart)")
    assert "the other way" in in_series_note(["tor1's uplink"])
    assert in_series_note([], between_racks=False) == ""
