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
