"""Reading a job's evidence back from a real InfluxDB (diagnosis/source.py): the agents'
records of a synthetic job go in as line protocol, the same tables come out."""

from __future__ import annotations

import pytest

from diagnosis.evidence import SECOND
from diagnosis.source import Members, StoreSource
from diagnosis.store import Store, StoreError
from fabricscope.records import Record
from fabricscope.services import InfluxServer, free_port
from tests.unit.test_diagnosis_evidence import (T0, HopPlan, StepPlan, SynthJob, build,
                                                to_records)

DB = "fabricscope"
SPEC = SynthJob(seconds=20, step=lambda i, t: StepPlan(checkpoint=0.3 if i % 10 == 9 else 0.0),
                hop=lambda s, src, dst: HopPlan(loss=0.01 if src == 1 else 0.0,
                                                rtt_us=200.0 + 10 * s))


@pytest.fixture(scope="module")
def stored():
    with InfluxServer() as influx:
        influx.query(f'CREATE DATABASE "{DB}"')
        store = Store(influx.url, DB)
        ev = build(SPEC)
        # a flow of no training process on the same node: not the job's
        stray = Record("tcp_flow", (T0 + 3) * SECOND, {
            "node": "node0", "saddr": "198.18.0.1", "daddr": "198.18.0.200", "sport": "22",
            "dport": "50000"}, {"bytes_acked": 9_000_000, "retrans_segs": 500})
        store.write(to_records(ev) + [stray])
        yield store, ev


def test_jobs_are_found_by_their_steps(stored):
    store, ev = stored
    jobs = StoreSource(store).jobs(T0 * SECOND, (T0 + 20) * SECOND)
    assert jobs == {SPEC.job: Members(SPEC.job, {"0": "node0", "1": "node1", "2": "node2"})}
    assert jobs[SPEC.job].nodes == ["node0", "node1", "node2"]
    assert StoreSource(store).jobs((T0 + 100) * SECOND, (T0 + 200) * SECOND) == {}


def test_the_evidence_reads_back_as_the_agents_reported_it(stored):
    store, ev = stored
    source = StoreSource(store)
    members = source.jobs(T0 * SECOND, (T0 + 20) * SECOND)[SPEC.job]
    back = source.read(members, T0 * SECOND, (T0 + 20) * SECOND)
    assert back.cells == ev.cells
    assert back.nodes == ev.nodes
    assert back.steps == ev.steps
    assert back.phases == ev.phases
    assert back.addr_node == ev.addr_node
    assert back.last_seen_ns == ev.last_seen_ns
    assert back.node_of_rank == ev.node_of_rank


def test_a_read_holds_only_its_span(stored):
    store, ev = stored
    source = StoreSource(store)
    members = Members(SPEC.job, dict(ev.node_of_rank))
    back = source.read(members, (T0 + 5) * SECOND, (T0 + 8) * SECOND,
                       steps_from_ns=(T0 + 2) * SECOND)
    assert {s for table in back.cells.values() for s in table} == {T0 + 5, T0 + 6, T0 + 7}
    assert sorted(t // SECOND - T0 for t in back.steps["1"]) == [2, 3, 4, 5, 6, 7]


def test_an_unreachable_store_is_one_line_error():
    store = Store(f"http://127.0.0.1:{free_port()}", DB, timeout_s=2)
    with pytest.raises(StoreError) as err:
        StoreSource(store).jobs(T0 * SECOND, (T0 + 20) * SECOND)
    line = err.value.one_line()
    assert line.startswith("fabricscope: error: InfluxDB at http://127.0.0.1:")
    assert "unreachable" in line and "; fix: " in line and "\n" not in line
