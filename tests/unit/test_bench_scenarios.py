"""The matrix's null comparison of a healthy job (bench/scenarios._null_compare), on a
synthetic job in a real InfluxDB."""

from __future__ import annotations

import pytest

from fabricscope.bench.scenarios import _after_startup, _compare, _null_compare
from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.store import Store
from fabricscope.services import InfluxServer
from tests.unit.test_diagnosis_evidence import T0, StepPlan, SynthJob, build, to_records

# a healthy job on a machine whose pace changes once, halfway: steps 1.0 s, then 1.3 s
SHIFTED = SynthJob(seconds=60, step=lambda i, t: StepPlan(seconds=1.0 if t < 30 else 1.3))


@pytest.fixture(scope="module")
def store():
    with InfluxServer() as server:
        server.query('CREATE DATABASE "fabricscope"')
        s = Store(server.url)
        s.write(to_records(build(SHIFTED)))
        yield s


def test_the_job_after_its_start_up_begins_at_its_third_step(store):
    assert _after_startup(store, SHIFTED.job, T0 * SECOND, SHIFTED.end_s * SECOND) == \
        (T0 + 2) * SECOND


def test_a_change_of_pace_shows_between_halves_but_not_in_the_null_comparison(store):
    start, end = (T0 + 2) * SECOND, SHIFTED.end_s * SECOND
    halves = _compare(store, SHIFTED.job, start, (T0 + 30) * SECOND, end)
    assert halves["step_time"]["verdict"] == "worse"
    null = _null_compare(store, SHIFTED.job, start, end)
    assert null["step_time"]["verdict"] == "no change", null["step_time"]
    assert null["step_time"]["change_pct"] is not None       # both windows got samples


def test_a_finding_found_twice_counts_from_its_first_and_ends_with_its_last():
    """A gray-zone straggler named, closed between its late steps, then named again:
    how fast the fault was found is the first finding's, its end the last one's, and
    neither is a false alarm."""
    from fabricscope.bench.scenario_space import Fault, FaultKind
    from fabricscope.bench.scenarios import Expect, Outcome, Scenario, judge
    from fabricscope.diagnosis.finding import Finding
    onset = 1000 * SECOND

    def straggler(first_s, end_s, fid):
        return Finding("straggler_compute", "warning", "j", {"node": "node3", "rank": "3"},
                       onset, "late", first_seen_ns=onset + int(first_s * SECOND),
                       end_ns=onset + int(end_s * SECOND), id=fid)
    out = Outcome("cpu", "", "j", onset_ns=onset, clear_ns=onset + 30 * SECOND)
    sc = Scenario("cpu", [Fault(FaultKind.CPU, None, "node3", 8)], [Expect("straggler_compute", {"node": "node3"})],
                  cleared=True)
    judge(out, sc, [straggler(22.5, 33.0, "b"), straggler(3.5, 10.0, "a")])
    assert out.ok and out.false_alarms == [] and out.moved == []
    assert out.latency_s == [3.5] and out.end_after_clear_s == 3.0


def test_a_place_in_series_with_the_fault_on_every_path_names_it():
    """A ToR with one node: its uplink and that node's port carry the same transfers
    (every path of the node leaves its rack), so either names a fault at the other;
    with a second node on the ToR, a transfer inside the rack tells them apart."""
    from fabricscope.bench.scenarios import same_ways
    from fabricscope.diagnosis.localize import Place
    alone = {"nodes": 4, "tors": 3}                      # racks [0, 1], [2], [3]
    assert same_ways(Place("node", "node2"), Place("tor", "tor1"), alone)
    assert same_ways(Place("tor", "tor2"), Place("node", "node3"), alone)
    assert not same_ways(Place("node", "node1"), Place("tor", "tor0"), alone)
    assert not same_ways(Place("node", "node2"), Place("tor", "tor2"), alone)
    assert not same_ways(Place("node", "node2"), Place("tor", "tor1"), {"nodes": 6, "tors": 3})
    # two ToRs: tor0's uplink and tor1's downlink lie in series between the racks,
    # but a node's way to storage behind the spine crosses one uplink only
    assert not same_ways(Place("tor", "tor0"), Place("tor", "tor1"), {"nodes": 4, "tors": 2})


def test_a_finding_at_a_place_in_series_with_the_fault_is_right():
    from fabricscope.bench.scenarios import Expect, Outcome, Scenario, judge
    from fabricscope.bench.scenario_space import Element, Fault, FaultKind
    from fabricscope.diagnosis.finding import Finding
    onset = 1000 * SECOND
    found = Finding("lossy_link", "critical", "j", {"node": "node2"}, onset, "lossy",
                    first_seen_ns=onset + 2 * SECOND, id="a")
    fault = Fault(FaultKind.LOSS, Element.UPLINK, "tor1", 2)
    for lab, right in (({"nodes": 4, "tors": 3}, True), ({"nodes": 6, "tors": 3}, False)):
        out = Outcome("loss", "", "j", onset_ns=onset, lab=lab)
        judge(out, Scenario("loss", [fault], [Expect("lossy_link", {"tor": "tor1"})]), [found])
        assert out.ok is right and (out.false_alarms == []) is right
        assert out.in_series == (["lossy_link at node2 (critical)"] if right else [])
