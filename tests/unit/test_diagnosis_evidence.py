"""Synthetic training jobs for the diagnosis tests, and the tests of the evidence
tables themselves (diagnosis/evidence.py, diagnosis/replay.py's slices).

`SynthJob` describes a job as its agents would report it: a ring of nodes (rank
k on node k sends its gradient share to rank k-1, as gloo's ring does), each
second every hop's bytes, loss and RTT (`hop`), each step its length, grad-sync
time, data loading and checkpoint (`step`), and with `progress` each step's last
report while it ran (gloo_progress, REPORT_LEAD_S before its end). `build()` gives
the JobEvidence the engine reads; `to_records()` the agents' records (tcp_flow,
tcp_node, gloo_step, gloo_progress, gloo_phase) of the same job, for the tests
that go through InfluxDB. Other
diagnosis test modules import these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from fabricscope.diagnosis.evidence import (SECOND, CellKey, CellSecond, JobEvidence, NodeSecond, Phase,
                                Progress,
                                Step, weighted_median)
from fabricscope.diagnosis.replay import slice_until
from fabricscope.records import Record
from fabricscope.schema import validate

T0 = 1_700_000_000                    # the UNIX second synthetic jobs start at
STORAGE = "198.18.0.254:9000"         # the data server the ranks read from
SEGMENT = 1448                        # payload bytes per segment
GRADIENT_PORT = "29500"
REPORT_LEAD_S = 0.1                   # a step's last gloo_progress report, before its end


def node(k: int) -> str:
    return f"node{k}"


def addr(k: int) -> str:
    return f"198.18.0.{k + 1}"


@dataclass
class StepPlan:
    """One training step of every rank."""

    seconds: float = 1.0
    sync: float = 0.3                                   # every rank's grad sync ...
    sync_of: dict[str, float] = field(default_factory=dict)    # ... unless named here
    data_load: float = 0.05                             # a read at the step's start ...
    data_load_of: dict[str, float] = field(default_factory=dict)   # ... unless named here
    checkpoint: float = 0.0                             # a write at its end (0: none)
    throttled_of: dict[str, float] = field(default_factory=dict)   # CPU throttled, per rank
    cpu_limit_of: dict[str, float] = field(default_factory=dict)   # its quota in CPUs
    limit_held: bool = True                             # ... the same all through the step


@dataclass
class HopPlan:
    """One ring hop (a node's flows to its ring neighbour) in one second."""

    bytes: int = 4_000_000            # payload acknowledged
    loss: float = 0.0                 # share of the payload sent that was resent
    rtt_us: float = 200.0             # median RTT


@dataclass
class SynthJob:
    nodes: int = 3
    seconds: int = 60
    #: (step index, seconds since the job's start) -> the step
    step: Callable[[int, float], StepPlan] = lambda i, t: StepPlan()
    #: (second since the start, sender index, receiver index) -> the hop in that second
    hop: Callable[[int, int, int], HopPlan] = lambda s, src, dst: HopPlan()
    silent_from: dict[int, int] = field(default_factory=dict)   # node -> second it goes quiet
    #: (second since the start, node index) -> its busiest 100 us bin received (of line
    #: rate; 0: no NIC windows, as the records of `records()` have none)
    rx_peak: Callable[[int, int], float] = lambda s, k: 0.0
    #: (second since the start, node index) -> bytes it read from STORAGE in that second
    #: (its flow to the store: a peer outside the job; 0: no such flow)
    reads: Callable[[int, int], int] = lambda s, k: 0
    #: (second since the start, node index) -> how many times longer its ranks' reads
    #: (data_load phases) take than the step's plan says: a narrowed way into the node
    read_slow: Callable[[int, int], float] = lambda s, k: 1.0
    #: (second since the start, node index) -> packets its reads from STORAGE received
    #: out of order in that second (after frames lost on their way in)
    read_holes: Callable[[int, int], int] = lambda s, k: 0
    job: str = "198.18.0.1:29500"
    t0_s: int = T0
    first_node: int = 0               # the job's rank k runs on node(first_node + k)
    progress: bool = False            # the agents report the steps in progress
    all_to_all: bool = False          # every node sends to every other, not to its ring peer

    @property
    def end_s(self) -> int:
        return self.t0_s + self.seconds

    def ring(self) -> list[tuple[int, int]]:
        """(sender, receiver) of every ring hop."""
        return [(k, (k - 1) % self.nodes) for k in range(self.nodes)]

    def pairs(self) -> list[tuple[int, int]]:
        """(sender, receiver) of every hop that carries the job's exchanges."""
        if not self.all_to_all:
            return self.ring()
        return [(a, b) for a in range(self.nodes) for b in range(self.nodes) if a != b]

    def node(self, k: int) -> str:
        return node(self.first_node + k)

    def addr(self, k: int) -> str:
        return addr(self.first_node + k)

    def reports(self, k: int, second: int) -> bool:
        """Whether node k's agent reports for this second since the start."""
        return second < self.silent_from.get(k, self.seconds)


def cell_second(h: HopPlan) -> CellSecond:
    resent = round(h.bytes * h.loss / (1 - h.loss)) if h.loss else 0
    return CellSecond(bytes_acked=h.bytes, bytes_received=h.bytes // 50,
                      retrans_segs=math.ceil(resent / SEGMENT), retrans_bytes=resent,
                      rtt_p50_us=h.rtt_us, rtt_p90_us=h.rtt_us * 1.5,
                      rtt_samples=h.bytes // SEGMENT // 2)


def build(spec: SynthJob) -> JobEvidence:
    ev = JobEvidence(spec.job, node_of_rank={str(k): spec.node(k) for k in range(spec.nodes)},
                     addr_node={spec.addr(k): spec.node(k) for k in range(spec.nodes)})
    for s in range(spec.seconds):
        second = spec.t0_s + s
        for src, dst in spec.pairs():
            if not spec.reports(src, s):
                continue
            c = cell_second(spec.hop(s, src, dst))
            key = CellKey(spec.node(src), spec.addr(src), spec.addr(dst), str(src))
            ev.cells.setdefault(key, {})[second] = c
            ev.nodes.setdefault(spec.node(src), {})[second] = NodeSecond(
                segs_out=c.bytes_acked // SEGMENT + c.retrans_segs + 500,
                retrans_segs=c.retrans_segs, bytes_out=c.bytes_acked + c.retrans_bytes,
                rx_peak_util=spec.rx_peak(s, src), rx_peak_bps=spec.rx_peak(s, src) * 1e9)
            ev.last_seen_ns[spec.node(src)] = second * SECOND
            if spec.reads(s, src):
                ev.cells.setdefault(CellKey(spec.node(src), spec.addr(src), STORAGE, str(src)),
                                    {})[second] = CellSecond(
                    bytes_acked=20_000, bytes_received=spec.reads(s, src), rtt_p50_us=300.0,
                    rtt_p90_us=450.0, rtt_samples=10,
                    rx_data_segs=spec.reads(s, src) // SEGMENT,
                    rx_ooo_pkts=spec.read_holes(s, src))
    i, t = 0, 0.0
    while True:
        plan = spec.step(i, t)
        if t + plan.seconds > spec.seconds:
            break
        for k in range(spec.nodes):
            if spec.reports(k, int(t)):
                _add_step(ev, spec, k, spec.t0_s * SECOND + int(t * SECOND), plan)
        i, t = i + 1, t + plan.seconds
    return ev


def _add_step(ev: JobEvidence, spec: SynthJob, k: int, t_ns: int, plan: StepPlan) -> None:
    rank, where = str(k), spec.node(k)
    sync = plan.sync_of.get(rank, plan.sync)
    ev.steps.setdefault(rank, {})[t_ns] = Step(
        rank, where, t_ns, plan.seconds, sync, plan.seconds - sync,
        throttled_seconds=plan.throttled_of.get(rank, 0.0 if plan.throttled_of else None),
        cpu_limit=plan.cpu_limit_of.get(rank), cpu_limit_held=plan.limit_held and rank in plan.cpu_limit_of)
    if spec.progress:
        # the step's last report: its grad sync first, then computing (DDP's AllReduce
        # opens the step; the optimizer and the next forward follow)
        so_far = plan.seconds - REPORT_LEAD_S
        throttled = plan.throttled_of.get(rank)
        ev.take_progress(Progress(rank, where, t_ns, so_far, min(sync, so_far), so_far <= sync,
                                  None if throttled is None
                                  else throttled * so_far / plan.seconds))
    phases = ev.phases.setdefault(rank, {})
    read = plan.data_load_of.get(rank, plan.data_load) * spec.read_slow(
        t_ns // SECOND - spec.t0_s, k)
    if read:
        at = t_ns + SECOND // 100
        phases[(at, "data_load")] = Phase(rank, where, at, "data_load", read, 1 << 20, STORAGE)
    if plan.checkpoint:
        at = t_ns + int((plan.seconds - plan.checkpoint - 0.01) * SECOND)
        phases[(at, "checkpoint")] = Phase(rank, where, at, "checkpoint", plan.checkpoint,
                                           8 << 20, STORAGE)


def to_records(ev: JobEvidence) -> list[Record]:
    """The agents' records of the job, each valid against fabricscope.schema."""
    out = []
    for key, table in ev.cells.items():
        for second, c in table.items():
            fields = {"seconds": 1.0, "bytes_acked": c.bytes_acked,
                      "bytes_received": c.bytes_received, "retrans_segs": c.retrans_segs,
                      "retrans_bytes": c.retrans_bytes, "timeouts": c.timeouts,
                      "rtt_samples": c.rtt_samples}
            if c.rtt_p50_us is not None:
                fields |= {"rtt_p50_us": c.rtt_p50_us, "rtt_p90_us": c.rtt_p90_us}
            out.append(Record("tcp_flow", second * SECOND, {
                "node": key.node, "saddr": key.addr, "daddr": key.peer, "sport": "41000",
                "dport": GRADIENT_PORT, "job": ev.job, "rank": key.rank}, fields))
    for name, table in ev.nodes.items():
        for second, n in table.items():
            out.append(Record("tcp_node", second * SECOND, {"node": name}, {
                "seconds": 1.0, "segs_out": n.segs_out, "retrans_segs": n.retrans_segs,
                "timeouts": n.timeouts, "bytes_out": n.bytes_out}))
    for rank, steps in ev.steps.items():
        for i, s in enumerate(sorted(steps.values(), key=lambda s: s.time_ns)):
            out.append(Record("gloo_step", s.time_ns, {"node": s.node, "job": ev.job,
                                                       "rank": rank}, {
                "step": i, "seconds": s.seconds, "sync_seconds": s.sync_seconds,
                "compute_seconds": s.compute_seconds, "retrans_segs": s.retrans_segs,
                "sync_retrans_segs": s.sync_retrans_segs}
                | ({"throttled_seconds": s.throttled_seconds}
                   if s.throttled_seconds is not None else {})
                | ({"cpu_limit": s.cpu_limit, "cpu_limit_held": s.cpu_limit_held}
                   if s.cpu_limit is not None else {})))
    for rank, table in ev.progress.items():
        for i, p in enumerate(sorted(table.values(), key=lambda p: p.time_ns)):
            out.append(Record("gloo_progress", p.time_ns, {"node": p.node, "job": ev.job,
                                                           "rank": rank}, {
                "step": i, "seconds": p.seconds, "sync_seconds": p.sync_seconds,
                "compute_seconds": p.seconds - p.sync_seconds, "waiting": p.waiting}
                | ({"throttled_seconds": p.throttled_seconds}
                   if p.throttled_seconds is not None else {})))
    for rank, phases in ev.phases.items():
        for p in phases.values():
            out.append(Record("gloo_phase", p.time_ns, {"node": p.node, "job": ev.job,
                                                        "rank": rank, "phase": p.phase},
                              {"seconds": p.seconds, "bytes": p.bytes, "peer": p.peer}))
    for r in out:
        validate(r)
    return out


# -- the evidence tables ---------------------------------------------------------------------

def test_weighted_median_follows_the_weights_not_the_count():
    assert weighted_median([(100.0, 1), (200.0, 1), (300.0, 1)]) == 200.0
    # one second of thousands of samples outvotes two quiet ones
    assert weighted_median([(100.0, 5000), (900.0, 3), (950.0, 2)]) == 100.0
    assert weighted_median([(100.0, 1), (200.0, 1)]) == 100.0     # half the weight at or below
    assert weighted_median([(5.0, 0)]) is None
    assert weighted_median([]) is None


def test_window_sums_a_cells_seconds_and_weights_its_rtt_by_samples():
    spec = SynthJob(seconds=10, hop=lambda s, src, dst: HopPlan(
        loss=0.01 if src == 1 else 0.0, rtt_us=5000.0 if s >= 3 else 200.0))
    ev = build(spec)
    for s in (T0 + 3, T0 + 4):          # node1's slow seconds carried few RTT samples
        table = ev.cells[CellKey(node(1), addr(1), addr(0), "1")]
        table[s] = table[s]._replace(rtt_samples=2)
    cells = {c.key.node: c for c in ev.window(T0 + 2, T0 + 5).cells()}
    lossy = cells[node(1)]
    one = cell_second(HopPlan(loss=0.01))
    assert lossy.seconds == 3 and lossy.peer_node == node(0)
    assert lossy.bytes_acked == 3 * 4_000_000
    assert lossy.retrans_bytes == 3 * one.retrans_bytes
    assert lossy.retrans_segs == 3 * one.retrans_segs
    assert lossy.loss_ratio == 3 * one.retrans_bytes / (3 * (4_000_000 + one.retrans_bytes))
    assert abs(lossy.loss_ratio - 0.01) < 1e-6
    assert lossy.rtt_p50_us == 200.0           # two quiet seconds of 5 ms are outvoted
    assert cells[node(2)].rtt_p50_us == 5000.0    # two busy ones are not
    assert cells[node(0)].loss_ratio == 0.0


def test_window_node_totals_sum_counts_and_keep_peaks():
    ev = JobEvidence("j")
    ev.nodes["a"] = {T0: NodeSecond(segs_out=100, retrans_segs=2, tx_peak_util=0.4, bursts=3,
                                    qdisc_backlog_bytes=10),
                     T0 + 1: NodeSecond(segs_out=300, retrans_segs=6, tx_peak_util=0.9,
                                        bursts=1, qdisc_backlog_bytes=5),
                     T0 + 2: NodeSecond(segs_out=1000, retrans_segs=1000)}
    t = ev.window(T0, T0 + 2).nodes()["a"]
    assert (t.segs_out, t.retrans_segs, t.bursts, t.seconds) == (400, 8, 4, 2)
    assert t.tx_peak_util == 0.9 and t.qdisc_backlog_bytes == 10
    assert t.retrans_ratio == 8 / 400


def test_window_steps_are_those_that_ended_inside_it():
    ev = build(SynthJob(seconds=10))
    steps = ev.window(T0 + 3, T0 + 6).steps()
    # steps of 1 s starting at T0+0..9: those ending at T0+3, +4, +5 (start 2, 3, 4)
    assert [(s.time_ns // SECOND) - T0 for s in steps["0"]] == [2, 3, 4]
    assert sorted(steps) == ["0", "1", "2"]


def test_merge_prefers_newer_reads_and_prune_forgets_old_seconds():
    old = build(SynthJob(seconds=10))
    newer = build(SynthJob(seconds=10, hop=lambda s, src, dst: HopPlan(bytes=1_000)))
    old.merge(newer)
    key = CellKey(node(0), addr(0), addr(2), "0")
    assert old.cells[key][T0 + 5].bytes_acked == 1_000
    old.prune(T0 + 4, (T0 + 4) * SECOND)
    assert min(old.cells[key]) == T0 + 4 and min(old.nodes[node(0)]) == T0 + 4
    assert min(old.steps["0"]) == (T0 + 4) * SECOND
    assert min(k[0] for k in old.phases["0"]) >= (T0 + 4) * SECOND
    assert old.latest_second() == T0 + 9


def test_slice_until_holds_what_existed_then():
    ev = build(SynthJob(seconds=10, step=lambda i, t: StepPlan(data_load=0.5)))
    cut = slice_until(ev, T0 + 4)
    assert max(cut.nodes[node(1)]) == T0 + 3
    assert cut.last_seen_ns[node(1)] == (T0 + 3) * SECOND
    # steps ended by then (those starting at T0+0..3), and phases ended by then
    assert sorted(t // SECOND - T0 for t in cut.steps["1"]) == [0, 1, 2, 3]
    assert all(p.time_ns + p.seconds * SECOND <= (T0 + 4) * SECOND
               for p in cut.phases["1"].values())
    assert len(cut.phases["1"]) == 4


def test_synthetic_records_are_valid_agent_records():
    records = to_records(build(SynthJob(nodes=3, seconds=5)))
    kinds = {r.measurement for r in records}
    assert kinds == {"tcp_flow", "tcp_node", "gloo_step", "gloo_phase"}
    assert sum(r.measurement == "tcp_flow" for r in records) == 3 * 5
    assert sum(r.measurement == "gloo_step" for r in records) == 3 * 5


def _step(rank: str, t: int) -> Step:
    return Step(rank, node(int(rank)), t, 1.0, 0.5, 0.5, 0, 0)


def _phase(rank: str, t: int, kind: str) -> Phase:
    return Phase(rank, node(int(rank)), t, kind, 0.1, 100, STORAGE)


def test_step_and_phase_order_follows_merges_out_of_order_and_prunes():
    ev = JobEvidence("j")
    assert ev.step_times("0") == [] and ev.latest_phase_ns("0") == 0
    times = [5, 1, 9, 3, 7, 2, 8]
    for t in times:                        # each merge a tick's read, some of them late
        other = JobEvidence("j")
        other.steps["0"] = {t * SECOND: _step("0", t * SECOND)}
        other.phases["0"] = {(t * SECOND, "data_load"): _phase("0", t * SECOND, "data_load"),
                             (t * SECOND + 1, "checkpoint"): _phase("0", t * SECOND + 1,
                                                                     "checkpoint")}
        ev.merge(other)
        assert ev.step_times("0") == sorted(ev.steps["0"])
        assert [p.time_ns for p in ev.phases_between("0", "data_load", 0, 10 * SECOND)] == \
            sorted(k[0] for k in ev.phases["0"] if k[1] == "data_load")
    assert [p.time_ns // SECOND for p in ev.phases_between("0", "checkpoint", 3 * SECOND,
                                                           7 * SECOND)] == [3, 5]
    assert ev.latest_phase_ns("0") == 9 * SECOND + 1
    ev.merge(ev)                           # a reread of what is known changes nothing
    assert ev.step_times("0") == [t * SECOND for t in sorted(times)]
    ev.prune(0, 4 * SECOND)
    assert ev.step_times("0") == [t * SECOND for t in (5, 7, 8, 9)]
    assert [p.time_ns // SECOND for p in ev.phases_between("0", "data_load", 0, 10**12)] == \
        [5, 7, 8, 9]
    ev.steps["0"] = {SECOND: _step("0", SECOND)}          # a table replaced wholesale
    assert ev.step_times("0") == [SECOND]
