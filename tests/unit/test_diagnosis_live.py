"""The engine inside the collectors (diagnosis/live.py): rendezvous ownership of jobs, and
two replicas with fake clocks ticking against one real InfluxDB that holds the agents'
records of two synthetic jobs."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.live import HEARTBEAT_TTL_S, LiveDiagnosis, owner
from fabricscope.diagnosis.metrics import FINDING_ACTIVE, DiagnosisMetrics
from fabricscope.diagnosis.store import Store
from fabricscope.records import Record
from fabricscope.services import InfluxServer
from tests.support.servers import VictoriaMetricsServer
from tests.unit.test_diagnosis_evidence import (T0, HopPlan, StepPlan, SynthJob, build,
                                                to_records)

FAULT = 25


def test_owner_spreads_jobs_and_moves_only_those_of_a_replica_that_leaves():
    replicas = ["collector-0", "collector-1", "collector-2", "collector-3"]
    jobs = [f"198.18.{i // 250}.{i % 250}:29500" for i in range(400)]
    before = {j: owner(j, replicas) for j in jobs}
    counts = {r: sum(o == r for o in before.values()) for r in replicas}
    assert all(60 <= n <= 140 for n in counts.values()), counts
    assert all(owner(j, list(reversed(replicas))) == before[j] for j in jobs)
    gone = "collector-2"
    after = {j: owner(j, [r for r in replicas if r != gone]) for j in jobs}
    moved = {j for j in jobs if after[j] != before[j]}
    assert moved == {j for j in jobs if before[j] == gone}
    # and they spread over the rest, not onto one replica
    assert len({after[j] for j in moved}) == 3
    assert {j: owner(j, replicas) for j in jobs} == before          # it comes back


class Clock:
    """A wall clock the test moves (both replicas read the same one)."""

    def __init__(self, s: int):
        self.ns = s * SECOND

    def __call__(self) -> int:
        return self.ns


def two_jobs(replicas: list[str]) -> tuple[str, str]:
    """Job ids of which the first is replicas[0]'s and the second replicas[1]'s."""
    names = (f"198.18.0.{i}:29500" for i in itertools.count(1))
    pick = {}
    for name in names:
        pick.setdefault(owner(name, replicas), name)
        if len(pick) == 2:
            return pick[replicas[0]], pick[replicas[1]]
    raise AssertionError("unreachable")


def findings_shown(registry: CollectorRegistry) -> dict[str, float]:
    """finding id -> value of fabricscope_finding_active on this replica's /metrics."""
    return {s.labels["id"]: s.value for m in registry.collect() if m.name == FINDING_ACTIVE
            for s in m.samples}


def job_step_gauge(registry: CollectorRegistry, job: str) -> float | None:
    return registry.get_sample_value("fabricscope_job_step_seconds", {"job": job})


def points_of(store: Store, finding_id: str) -> int:
    rows = store.query(f"SELECT count(summary) FROM finding WHERE id = '{finding_id}'")
    return rows[0]["count"] if rows else 0


def write_holding_back(store: Store, records: list, held_if) -> list:
    """Write the records but those held_if picks (an agent that ships them late);
    return those."""
    held = [r for r in records if held_if(r)]
    assert held
    store.write([r for r in records if not held_if(r)])
    return held


@pytest.fixture
def store():
    with InfluxServer() as influx:
        influx.query('CREATE DATABASE "fabricscope"')
        yield Store(influx.url, "fabricscope")


def test_two_replicas_share_the_jobs_and_one_takes_over_when_the_other_stops(store):
    names = ["replica-a", "replica-b"]
    faulty, healthy = two_jobs(names)            # replica-a's and replica-b's
    slow = SynthJob(seconds=70, job=faulty,
                    step=lambda i, t: StepPlan(seconds=1.5, sync=0.8) if t >= FAULT
                    else StepPlan(),
                    hop=lambda s, src, dst: HopPlan(loss=0.01 if s >= FAULT and 1 in (src, dst)
                                                    else 0.0))
    fine = SynthJob(seconds=70, job=healthy, first_node=3)
    store.write(to_records(build(slow)) + to_records(build(fine)))
    clock = Clock(T0 + 12)
    regs = {n: CollectorRegistry() for n in names}
    live = {n: LiveDiagnosis(store, DiagnosisMetrics(regs[n]), n, clock=clock) for n in names}

    def tick(*which):
        for n in which:
            live[n].tick()
        clock.ns += SECOND

    for _ in range(FAULT + 10 - 12):             # until 10 s into the fault
        tick(*names)
    a, b = live["replica-a"], live["replica-b"]
    assert set(a.engines) == {faulty} and set(b.engines) == {healthy}
    (f,) = [f for f in a.engines[faulty].open.values() if f.cause == "lossy_link"]
    assert f.place["node"] == "node1" and f.start_ns == (T0 + FAULT) * SECOND
    assert b.engines[healthy].open == {} or all(
        g.severity == "info" for g in b.engines[healthy].open.values())
    # written by its owner only, as one point however often it was rewritten
    assert points_of(store, f.id) == 1
    assert findings_shown(regs["replica-a"]).get(f.id) == 1.0
    assert f.id not in findings_shown(regs["replica-b"])
    assert job_step_gauge(regs["replica-a"], faulty) == 1.5
    assert job_step_gauge(regs["replica-b"], faulty) is None
    assert job_step_gauge(regs["replica-b"], healthy) == 1.0
    assert job_step_gauge(regs["replica-a"], healthy) is None
    last_seen_by_a = f.last_seen_ns

    # replica-a stops: once its heartbeat is older than the TTL, replica-b owns both jobs
    for _ in range(HEARTBEAT_TTL_S + 5):
        tick("replica-b")
    assert set(b.engines) == {faulty, healthy}
    (g,) = [g for g in b.engines[faulty].open.values() if g.cause == "lossy_link"]
    assert g.id == f.id and g.start_ns == f.start_ns and g.first_seen_ns == f.first_seen_ns
    assert g.last_seen_ns > last_seen_by_a
    assert points_of(store, f.id) == 1
    (row,) = store.query(f"SELECT last_seen_ns, \"open\" FROM finding WHERE id = '{f.id}'")
    assert row["last_seen_ns"] == g.last_seen_ns and row["open"] is True
    assert findings_shown(regs["replica-b"]).get(f.id) == 1.0
    assert job_step_gauge(regs["replica-b"], faulty) == 1.5


def test_a_step_that_reaches_the_store_late_is_read_by_the_next_catch_up(store):
    """Steps feed the baselines and trends, so a lagging agent's steps are read when
    they come (seconds of cells and nodes are read while an evaluation can use them:
    diagnosis/live.py's _still_evaluated_ns)."""
    from fabricscope.diagnosis.live import CATCH_UP_S
    (job, _) = two_jobs(["only", "other"])
    records = to_records(build(SynthJob(seconds=60, job=job)))
    # catch-ups at T0+12 (the first tick), +22, +32, +42: a step of T0+26 that comes
    # just after the one at +32, 7 s late, is older than +42's READ_BACK_S alone
    late_second, comes = T0 + 26, T0 + 33

    def is_late(r) -> bool:
        return (r.measurement == "gloo_step" and r.tags["node"] == "node2"
                and r.time_ns // SECOND == late_second)
    held = write_holding_back(store, records, is_late)
    clock = Clock(T0 + 12)
    live = LiveDiagnosis(store, DiagnosisMetrics(CollectorRegistry()), "only", clock=clock)
    while clock.ns < comes * SECOND:
        live.tick()
        clock.ns += SECOND
    steps = live.engines[job].ev.steps
    assert late_second * SECOND not in steps["2"] and late_second * SECOND in steps["1"]
    store.write(held)                     # the agent of node2 lagged, then caught up
    for _ in range(CATCH_UP_S):
        live.tick()
        clock.ns += SECOND
    assert steps["2"][late_second * SECOND].seconds == 1.0


def test_a_store_that_does_not_answer_influxql_leaves_the_engine_idle_not_failing():
    """VictoriaMetrics takes the InfluxDB 2 writes (the v2 sink's stand-in) and answers
    any /query with a list of databases: no replica, no job, and no tick that fails."""
    with VictoriaMetricsServer() as vm:
        reg = CollectorRegistry()
        live = LiveDiagnosis(Store(vm.url, "fabricscope"), DiagnosisMetrics(reg), "replica-a",
                             clock=Clock(T0 + 12))
        assert live.tick() == []
        assert live.engines == {}
        assert reg.get_sample_value("fabricscope_diagnosis_replicas_live") == 1.0


def test_a_tick_reads_each_rank_from_what_it_had_reported_a_catch_up_from_back():
    from fabricscope.diagnosis.engine import JobEngine
    from fabricscope.diagnosis.evidence import NodeSecond, Phase, Step
    from fabricscope.diagnosis.live import ReadSpan, _read_span
    from fabricscope.diagnosis.source import Members, Starts

    engine = JobEngine("j")
    ev = engine.ev
    ev.steps = {"0": {t * SECOND: Step("0", "node0", t * SECOND, 1.0, 0.5, 0.5)
                      for t in (100, 101, 102)},
                "1": {t * SECOND: Step("1", "node1", t * SECOND, 1.0, 0.5, 0.5)
                      for t in (100, 101)}}
    ev.phases = {"0": {(t * SECOND, "data_load"): Phase("0", "node0", t * SECOND,
                                                         "data_load", 0.1, 10, "s:1")
                       for t in (100, 102)},
                 "1": {(101 * SECOND, "data_load"): Phase("1", "node1", 101 * SECOND,
                                                          "data_load", 0.1, 10, "s:1")}}
    ev.nodes = {"node0": {103: NodeSecond()}, "node1": {102: NodeSecond()}}
    ev.last_seen_ns = {"node0": 103 * SECOND + 400, "node1": 102 * SECOND + 900}
    members = Members("j", {"0": "node0", "1": "node1", "2": "node2"})
    lag = 2 * SECOND
    span = _read_span(engine, members, 95 * SECOND, lag, catch_up=False)
    # cells from back, but not before the last evaluation's window (its latest
    # second 103, less eval_seconds - 1): a node's seconds do not come whole
    assert span.cells_ns == 101 * SECOND
    # each rank from its latest step, and from a step lag before its latest phase;
    # rank 2 (nothing reported yet) from back
    assert span.steps == Starts(93 * SECOND, {"0": 102 * SECOND, "1": 101 * SECOND})
    assert span.phases == Starts(93 * SECOND, {"0": 100 * SECOND, "1": 99 * SECOND})
    # when every one has reported, nothing is read from before the earliest of them
    both = Members("j", {"0": "node0", "1": "node1"})
    span = _read_span(engine, both, 95 * SECOND, lag, catch_up=False)
    assert span.steps.all_ns == 101 * SECOND
    assert span.steps.wheres("rank", 200 * SECOND, 0) == [
        f"rank !~ /^(0)$/ AND time >= {101 * SECOND} AND time < {200 * SECOND}",
        f"rank =~ /^(0)$/ AND time >= {102 * SECOND} AND time < {200 * SECOND}"]
    # a catch-up rereads everyone from back
    assert _read_span(engine, members, 95 * SECOND, lag, catch_up=True) == \
        ReadSpan(101 * SECOND, Starts(93 * SECOND), Starts(93 * SECOND))


def test_starts_read_each_group_from_its_own_time_and_the_rest_from_the_first():
    from fabricscope.diagnosis.source import MAX_GROUPS, Starts
    t1 = 200 * SECOND
    assert Starts(100 * SECOND).wheres("node", t1, 0) == [
        f"time >= {100 * SECOND} AND time < {t1}"]
    wheres = Starts(100 * SECOND, {"a": 103 * SECOND, "b": 103 * SECOND,
                                   "c": 104 * SECOND, "d": 90 * SECOND}).wheres("node", t1, 0)
    assert wheres == [f"node !~ /^(a|b|c)$/ AND time >= {100 * SECOND} AND time < {t1}",
                      f"node =~ /^(a|b)$/ AND time >= {103 * SECOND} AND time < {t1}",
                      f"node =~ /^(c)$/ AND time >= {104 * SECOND} AND time < {t1}"]
    # many distinct starts: grouped within a growing slack, each group from its first
    many = Starts(0, {str(i): SECOND + i * SECOND // 20 for i in range(40)})
    groups = many.wheres("rank", t1, 0)
    assert 1 < len(groups) - 1 <= MAX_GROUPS
    for where in groups[1:]:
        names = where.split("/^(")[1].split(")$/")[0].split("|")
        start = int(where.split("time >= ")[1].split()[0])
        assert start == min(many.own_ns[n] for n in names)


def test_a_read_that_begins_inside_a_second_takes_the_whole_second(store):
    """A node's NIC windows run on the kernel's monotonic clock, stamped at a phase of
    their own within the wall-clock second; its TCP windows at the second's start. A
    tick whose reread would begin between the two reads the whole second, and never
    replaces a node's second with the part of its rows after that point."""
    (job, _) = two_jobs(["only", "other"])
    records = to_records(build(SynthJob(seconds=30, job=job)))
    tcp = {(r.tags["node"], r.time_ns // SECOND): r.fields["segs_out"]
           for r in records if r.measurement == "tcp_node"}
    records += [Record("nic_window", second * SECOND + 900_000_000,
                       {"node": node, "interface": "eth0", "direction": "rx"},
                       {"peak_util": 0.4, "hot_bins": 2, "bursts": 1})
                for node, second in tcp]
    first = T0 + 12
    store.write([r for r in records if r.time_ns < (first - 1) * SECOND])
    clock = Clock(first)
    live = LiveDiagnosis(store, DiagnosisMetrics(CollectorRegistry()), "only", clock=clock)
    for second in range(first, T0 + 26):
        # a tick 0.3 s into each second finds the seconds before it in the store
        store.write([r for r in records if (second - 2) * SECOND <= r.time_ns
                     < (second - 1) * SECOND])
        clock.ns = second * SECOND + 300_000_000
        live.tick()
    nodes = live.engines[job].ev.nodes
    read = [(node, s) for node, table in nodes.items() for s in table]
    assert len(read) > 20
    assert [(node, s) for node, s in read if nodes[node][s].segs_out != tcp[(node, s)]] == []
    assert all(nodes[node][s].rx_peak_util == 0.4 for node, s in read)


def test_a_flow_record_that_comes_after_its_nodes_next_second_is_read_by_the_next_tick(
        store):
    """A node's seconds do not reach the store whole (a new flow's records wait for
    its owner): cells and nodes are reread from LATE_S back, whatever the node
    reported since."""
    (job, _) = two_jobs(["only", "other"])
    records = to_records(build(SynthJob(seconds=30, job=job)))
    second = T0 + 15                 # catch-ups at T0+12 and +22: +16's tick is not one

    def is_held(r) -> bool:
        return (r.measurement == "tcp_flow" and r.tags["node"] == "node1"
                and r.time_ns // SECOND == second)
    held = write_holding_back(store, records, is_held)
    clock = Clock(T0 + 12)
    live = LiveDiagnosis(store, DiagnosisMetrics(CollectorRegistry()), "only", clock=clock)
    while clock.ns <= (second + 1) * SECOND:     # node1 has reported second + 1
        live.tick()
        clock.ns += SECOND
    ev = live.engines[job].ev
    keys = [k for k in ev.cells if k.node == "node1"]
    assert keys and all(second not in ev.cells[k] for k in keys)
    assert all(second in ev.cells[k] for k in ev.cells if k.node == "node0")
    store.write(held)
    live.tick()                                   # at second + 2, not a catch-up
    assert all(second in ev.cells[k] for k in keys)
