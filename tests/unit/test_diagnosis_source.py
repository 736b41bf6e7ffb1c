"""Reading a job's evidence back from a real InfluxDB (diagnosis/source.py): the agents'
records of a synthetic job go in as line protocol, the same tables come out."""

from __future__ import annotations

import random
import urllib.parse

import pytest

from fabricscope.diagnosis.evidence import SECOND
from fabricscope.diagnosis.source import Members, StoreSource
from fabricscope.diagnosis.store import Store, StoreError, form_encode
from fabricscope.records import Record
from fabricscope.services import InfluxServer, free_port
from tests.unit.test_diagnosis_evidence import (T0, HopPlan, StepPlan, SynthJob, build,
                                                to_records)

DB = "fabricscope"
SPEC = SynthJob(seconds=20, step=lambda i, t: StepPlan(checkpoint=0.3 if i % 10 == 9 else 0.0),
                hop=lambda s, src, dst: HopPlan(loss=0.01 if src == 1 else 0.0,
                                                rtt_us=200.0 + 10 * s), progress=True)


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
    assert back.progress == ev.progress and back.progress
    assert back.phases == ev.phases
    assert back.addr_node == ev.addr_node
    assert back.last_seen_ns == ev.last_seen_ns
    assert back.node_of_rank == ev.node_of_rank


def test_a_read_holds_only_its_span(stored):
    store, ev = stored
    source = StoreSource(store)
    members = Members(SPEC.job, dict(ev.node_of_rank))
    back = source.read(members, (T0 + 5) * SECOND, (T0 + 8) * SECOND,
                       steps_from=(T0 + 2) * SECOND)
    assert {s for table in back.cells.values() for s in table} == {T0 + 5, T0 + 6, T0 + 7}
    assert sorted(t // SECOND - T0 for t in back.steps["1"]) == [2, 3, 4, 5, 6, 7]


def test_a_read_from_starts_takes_each_rank_from_its_own(stored):
    from fabricscope.diagnosis.source import Starts
    store, ev = stored
    members = Members(SPEC.job, dict(ev.node_of_rank))
    t1 = (T0 + 10) * SECOND
    back = StoreSource(store).read(
        members, (T0 + 5) * SECOND, t1,
        steps_from=Starts((T0 + 2) * SECOND, {"1": (T0 + 6) * SECOND}))
    for key, table in back.cells.items():                 # cells and nodes: from t0
        assert min(table) == T0 + 5, key
    assert min(back.nodes["node1"]) == T0 + 5 and min(back.nodes["node0"]) == T0 + 5
    assert min(back.steps["1"]) == (T0 + 6) * SECOND
    assert min(back.steps["0"]) == (T0 + 2) * SECOND
    # phases follow the steps' starts unless given their own
    assert all(k[0] >= (T0 + 6) * SECOND for k in back.phases.get("1", {}))


def test_an_unreachable_store_is_one_line_error():
    store = Store(f"http://127.0.0.1:{free_port()}", DB, timeout_s=2)
    with pytest.raises(StoreError) as err:
        StoreSource(store).jobs(T0 * SECOND, (T0 + 20) * SECOND)
    line = err.value.one_line()
    assert line.startswith("fabricscope: error: InfluxDB at http://127.0.0.1:")
    assert "unreachable" in line and "; fix: " in line and "\n" not in line


def test_per_second_tables_equal_influxql_group_by_time(stored):
    """The per-second sums, maxima and medians the source computes from raw points are
    what InfluxQL's GROUP BY time(1s) answers for the same points: several rows a second
    (flows to one peer, both directions of a NIC), fields left out (nulls), even and
    odd counts for the medians; the first second has two complete rows (the source's
    shortest path for them)."""
    store, _ev = stored
    rng = random.Random(7)
    job, t0 = "groupby-check", T0 + 1000
    tags = {"job": job, "rank": "0", "node": "nodeG", "saddr": "198.18.9.1",
            "daddr": "198.18.9.2"}
    records = [Record("gloo_step", t0 * SECOND, {"job": job, "rank": "0", "node": "nodeG"},
                      {"seconds": 0.5, "sync_seconds": 0.2})]
    for second in range(t0, t0 + 6):
        for k in range(2 if second == t0 else rng.randint(1, 4)):
            fields = {f: rng.randint(0, 10_000) for f in
                      ("bytes_acked", "bytes_received", "retrans_segs", "retrans_bytes",
                       "timeouts", "rtt_samples")}
            fields |= {"rtt_p50_us": rng.uniform(50, 900), "rtt_p90_us": rng.uniform(900, 2000)}
            for name in rng.sample(sorted(fields), 0 if second == t0 else rng.randint(0, 3)):
                del fields[name]
            records.append(Record("tcp_flow", second * SECOND + k * 1000,
                                  {**tags, "sport": str(40000 + k), "dport": "29500"}, fields))
        records.append(Record("tcp_node", second * SECOND, {"node": "nodeG"},
                              {"segs_out": rng.randint(1, 99), "retrans_segs": 1,
                               "timeouts": 0, "bytes_out": 5}))
        for direction in ("rx", "tx"):
            for k in range(rng.randint(1, 2)):
                records.append(Record("nic_window", second * SECOND + k * 1000,
                                      {"node": "nodeG", "direction": direction,
                                       "interface": f"eth{k}"},
                                      {"peak_util": rng.random(), "hot_bins": rng.randint(0, 9),
                                       "bursts": rng.randint(0, 3),
                                       "peak_bps": rng.random() * 1e9}))
        records.append(Record("nic_qdisc", second * SECOND, {"node": "nodeG", "qdisc": "tbf"},
                              {"drops": rng.randint(0, 5), "backlog_bytes": rng.randint(0, 9)}))
    store.write(records)
    span = f"time >= {t0 * SECOND} AND time < {(t0 + 6) * SECOND}"
    back = StoreSource(store).read(Members(job, {"0": "nodeG"}), t0 * SECOND,
                                   (t0 + 6) * SECOND)

    def grouped(select: str, measurement: str, where: str) -> dict[int, dict]:
        return {r["time"] // SECOND: r for r in store.query(
            f"SELECT {select} FROM {measurement} WHERE {where} AND {span} "
            "GROUP BY time(1s) fill(none)")}

    sums = ("bytes_acked", "bytes_received", "retrans_segs", "retrans_bytes", "timeouts",
            "rtt_samples")
    flows = grouped(", ".join([f"sum({f}) AS {f}" for f in sums] +
                              ["median(rtt_p50_us) AS rtt_p50_us",
                               "median(rtt_p90_us) AS rtt_p90_us"]), "tcp_flow",
                    f"job = '{job}'")
    [(key, cells)] = back.cells.items()
    assert (key.node, key.addr, key.peer, key.rank) == ("nodeG", "198.18.9.1", "198.18.9.2", "0")
    assert sorted(cells) == sorted(flows) == list(range(t0, t0 + 6))
    for second, cell in cells.items():
        for name in sums:
            assert getattr(cell, name) == (flows[second][name] or 0), (second, name)
        for name in ("rtt_p50_us", "rtt_p90_us"):
            assert getattr(cell, name) == pytest.approx(flows[second][name]), (second, name)
    nics = {d: grouped("max(peak_util) AS peak, sum(hot_bins) AS hot, sum(bursts) AS bursts, "
                       "max(peak_bps) AS bps",
                       "nic_window", f"node = 'nodeG' AND direction = '{d}'")
            for d in ("rx", "tx")}
    qdisc = grouped("sum(drops) AS drops, max(backlog_bytes) AS backlog", "nic_qdisc",
                    "node = 'nodeG'")
    tcp = grouped("sum(segs_out) AS segs_out", "tcp_node", "node = 'nodeG'")
    for second, node in back.nodes["nodeG"].items():
        assert node.segs_out == tcp[second]["segs_out"]
        assert node.tx_peak_util == pytest.approx(nics["tx"][second]["peak"])
        assert node.rx_peak_util == pytest.approx(nics["rx"][second]["peak"])
        assert node.rx_peak_bps == pytest.approx(nics["rx"][second]["bps"])
        assert node.hot_bins == nics["rx"][second]["hot"] + nics["tx"][second]["hot"]
        assert node.bursts == nics["rx"][second]["bursts"] + nics["tx"][second]["bursts"]
        assert (node.qdisc_drops, node.qdisc_backlog_bytes) == \
            (qdisc[second]["drops"], qdisc[second]["backlog"])


def test_a_read_into_evidence_equals_merging_a_fresh_read(stored):
    """The live tick reads into its engine's evidence; what it ends with is what
    merging a separate read would give, including the kept order of steps and phases."""
    store, ev = stored
    source = StoreSource(store)
    members = Members(SPEC.job, dict(ev.node_of_rank))
    merged = source.read(members, T0 * SECOND, (T0 + 8) * SECOND)
    direct = source.read(members, T0 * SECOND, (T0 + 8) * SECOND)
    for evidence in (merged, direct):      # orders kept from before the second read
        for rank in evidence.steps:
            evidence.step_times(rank)
            evidence.phases_between(rank, "checkpoint", 0, 1 << 62)
    later = dict(t0_ns=(T0 + 5) * SECOND, t1_ns=(T0 + 20) * SECOND,
                 steps_from=(T0 + 4) * SECOND)
    merged.merge(source.read(members, **later))
    assert source.read(members, **later, into=direct) is direct
    assert direct == merged
    for rank in merged.steps:
        assert direct.step_times(rank) == merged.step_times(rank) == sorted(ev.steps[rank])
        assert direct.phases_between(rank, "checkpoint", 0, 1 << 62) == \
            merged.phases_between(rank, "checkpoint", 0, 1 << 62)
    assert direct.cells == ev.cells and direct.steps == ev.steps


@pytest.mark.parametrize("params", [
    {"q": "SELECT a FROM b WHERE node =~ /^(n\\.1|n2)$/ AND x = 'é ü'; y", "db": "my db",
     "epoch": "ns"},
    {"q": "".join(map(chr, range(128))), "db": "fabricscope"},
])
def test_query_parameters_are_encoded_as_urlencode_does(params):
    """The store's own form encoding (str.translate for ASCII) says what urlencode
    says, for every ASCII character and for text that is not ASCII."""
    assert form_encode(params) == urllib.parse.urlencode(params)
