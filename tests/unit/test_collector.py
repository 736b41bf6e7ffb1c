"""The collector end to end: a real gRPC client, the collector in-process, a real influxd."""

from __future__ import annotations

import queue
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from fabricscope.collector.config import CollectorConfig
from fabricscope.collector.server import CollectorThread
from fabricscope.records import Record
from fabricscope.services import InfluxServer, http_get
from fabricscope.wire import make_batch, pb, pb_grpc

DB = "fs_test"
OK, REJECTED, RETRY = pb.Ack.OK, pb.Ack.REJECTED, pb.Ack.RETRY
T0 = time.time_ns() - 60 * 10**9          # a minute ago: inside the accepted window
FLOW = {"saddr": "198.18.0.1", "daddr": "198.18.0.2", "sport": "40000", "dport": "5201",
        "state": "ESTABLISHED"}


def retrans(i: int, **tags) -> Record:
    return Record("tcp_retransmit", T0 + i, {**FLOW, **tags}, {"segs": i + 1})


def step(i: int, seconds) -> Record:
    return Record("train_step", T0 + 1000 + i, {"job": "j1", "rank": str(i % 2)},
                  {"step": i, "seconds": seconds})


@pytest.fixture
def influx():
    with InfluxServer() as server:
        yield server


@pytest.fixture
def collector(influx):
    started: list[CollectorThread] = []

    def start(**overrides) -> CollectorThread:
        cfg = CollectorConfig(listen="127.0.0.1:0", influx_url=influx.url, influx_db=DB,
                              metrics_host="127.0.0.1", metrics_port=0, **overrides)
        started.append(CollectorThread(cfg).start())
        return started[-1]

    try:
        yield start
    finally:
        for c in started:
            c.stop()


def stream(address: str, batches) -> list:
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.CollectorStub(channel).Stream(iter(batches), timeout=60))


def metric(c: CollectorThread, name: str, **labels) -> float:
    value = c.collector.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def wait_for(predicate, timeout_s: float = 20.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.02)


def http_post(url: str, body: bytes) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def count(influx, measurement: str, field: str) -> int:
    rows = influx.query(f'SELECT count("{field}") FROM "{measurement}"', DB)
    return rows[0]["count"] if rows else 0


def test_three_batches_are_acked_and_queryable_exactly(influx, collector):
    c = collector()
    batches = [make_batch(node="n1", agent_id="boot-a", seq=1, records=[retrans(0), retrans(1)]),
               make_batch(node="n1", agent_id="boot-a", seq=2, records=[step(0, 0.5), step(1, 2)]),
               make_batch(node="n1", agent_id="boot-a", seq=3,
                          records=[retrans(2, node="n1", dport="443")])]
    acks = stream(c.address, batches)
    assert [(a.seq, a.status, a.reason) for a in acks] == [(1, OK, ""), (2, OK, ""), (3, OK, "")]

    rows = influx.query('SELECT * FROM "tcp_retransmit"', DB)
    assert [(r["time"], r["segs"], r["node"], r["saddr"], r["daddr"], r["sport"], r["dport"],
             r["state"]) for r in rows] == [
        (T0 + i, i + 1, "n1", "198.18.0.1", "198.18.0.2", "40000", dport, "ESTABLISHED")
        for i, dport in ((0, "5201"), (1, "5201"), (2, "443"))]
    rows = influx.query('SELECT * FROM "train_step"', DB)
    assert [(r["time"], r["step"], r["seconds"], r["job"], r["rank"], r["node"]) for r in rows] \
        == [(T0 + 1000, 0, 0.5, "j1", "0", "n1"), (T0 + 1001, 1, 2.0, "j1", "1", "n1")]
    assert influx.field_types("tcp_retransmit", DB) == {"segs": "integer"}
    # seconds=2 arrived as an int and was stored as float: one type per field, always.
    assert influx.field_types("train_step", DB) == {"step": "integer", "seconds": "float"}

    assert metric(c, "fabricscope_collector_batches_received_total") == 3
    assert metric(c, "fabricscope_collector_records_received_total") == 5
    assert metric(c, "fabricscope_collector_records_written_total") == 5
    assert metric(c, "fabricscope_collector_batches_acked_total", status="ok") == 3
    assert metric(c, "fabricscope_collector_sink_write_seconds_count") == 3
    assert metric(c, "fabricscope_collector_agent_last_seen_timestamp_seconds", node="n1") > 0
    base = f"http://127.0.0.1:{c.collector.metrics_port}"
    assert http_get(base + "/readyz") == (200, b"ready\n")
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    assert "fabricscope_collector_records_written_total 5.0" in text


def test_resent_batch_is_written_again_without_double_counting(influx, collector):
    c = collector()
    batch = make_batch(node="n1", agent_id="boot-a", seq=1, records=[retrans(i) for i in range(4)])
    assert [a.status for a in stream(c.address, [batch, batch])] == [OK, OK]
    assert [a.status for a in stream(c.address, [batch])] == [OK]   # after a reconnect
    assert count(influx, "tcp_retransmit", "segs") == 4
    # Seen as a duplicate within one stream; a new stream (or replica) cannot tell.
    assert metric(c, "fabricscope_collector_batches_duplicate_total") == 1
    assert metric(c, "fabricscope_collector_records_written_total") == 12


def test_invalid_records_are_counted_and_valid_ones_written(influx, collector):
    c = collector()
    bad = [Record("no_such", T0, {}, {"x": 1}), retrans(7, node="elsewhere"),
           retrans(8, state=""), Record("tcp_retransmit", time.time_ns() + 2 * 3600 * 10**9,
                                        FLOW, {"segs": 1})]
    batch = make_batch(node="n1", agent_id="a", seq=1, records=[retrans(0), *bad, retrans(1)])
    (ack,) = stream(c.address, [batch])
    assert (ack.seq, ack.status) == (1, REJECTED)
    assert ack.reason.startswith("4 of 6 records refused (2 written); first: record 1: ")
    assert "unknown measurement 'no_such'" in ack.reason
    assert count(influx, "tcp_retransmit", "segs") == 2
    for reason in ("unknown_measurement", "node_mismatch", "unencodable", "time_future"):
        assert metric(c, "fabricscope_collector_records_rejected_total", reason=reason) == 1
    assert metric(c, "fabricscope_collector_records_written_total") == 2
    assert metric(c, "fabricscope_collector_batches_acked_total", status="rejected") == 1


def test_wrong_schema_version_is_rejected_and_nothing_written(influx, collector):
    c = collector()
    batches = [make_batch(node="n1", agent_id="a", seq=1, records=[retrans(0)], schema_version=99),
               make_batch(node="", agent_id="a", seq=2, records=[retrans(1)]),
               make_batch(node="n1", agent_id="a", seq=3, records=[retrans(2)])]
    acks = stream(c.address, batches)
    assert [(a.seq, a.status) for a in acks] == [(1, REJECTED), (2, REJECTED), (3, OK)]
    assert "schema_version 99 is not the collector's 1" in acks[0].reason
    assert acks[1].reason == "batch has no node"
    assert count(influx, "tcp_retransmit", "segs") == 1
    assert metric(c, "fabricscope_collector_records_rejected_total", reason="schema_version") == 1
    assert metric(c, "fabricscope_collector_records_rejected_total", reason="bad_batch") == 1


def test_oversized_message_is_rejected_resource_exhausted_and_the_stream_goes_on(influx,
                                                                                 collector):
    c = collector(max_message_bytes=4096)
    big = make_batch(node="n1", agent_id="a", seq=1,
                     records=[retrans(i, state="X" * 100) for i in range(25)])
    assert 4096 < big.ByteSize() <= 2 * 4096
    after = make_batch(node="n1", agent_id="a", seq=2, records=[retrans(0)])
    acks = stream(c.address, [big, after])
    assert [(a.seq, a.status, a.code) for a in acks] == [
        (1, REJECTED, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]), (2, OK, 0)]
    assert acks[0].reason.startswith(f"message of {big.ByteSize()} bytes exceeds the "
                                     "collector's max_message_bytes 4096")
    assert metric(c, "fabricscope_collector_messages_oversized_total") == 1
    assert metric(c, "fabricscope_collector_records_rejected_total", reason="oversized") == 25
    # Beyond twice the limit gRPC refuses it itself, ending the stream with the same code.
    huge = make_batch(node="n1", agent_id="a", seq=1,
                      records=[retrans(i, state="X" * 100) for i in range(100)])
    with pytest.raises(grpc.RpcError) as err:
        stream(c.address, [huge])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # Another agent is still served.
    small = make_batch(node="n2", agent_id="b", seq=1, records=[retrans(1)])
    assert [a.status for a in stream(c.address, [small])] == [OK]
    assert count(influx, "tcp_retransmit", "segs") == 2


def test_influxd_down_answers_retry_then_the_resent_batch_lands(influx, collector):
    c = collector()
    base = f"http://127.0.0.1:{c.collector.metrics_port}"
    batch = make_batch(node="n1", agent_id="a", seq=1, records=[retrans(0), retrans(1)])
    influx.stop_process()
    (ack,) = stream(c.address, [batch])
    assert (ack.status, ack.reason) == (RETRY, "sink unavailable: Connection refused")
    assert (ack.code, ack.retry_after_ms) == (grpc.StatusCode.UNAVAILABLE.value[0], 2000)
    assert metric(c, "fabricscope_collector_sink_errors_total", kind="temporary") == 1
    assert metric(c, "fabricscope_collector_batches_acked_total", status="retry") == 1
    assert metric(c, "fabricscope_collector_records_written_total") == 0
    status, body = http_get(base + "/readyz")
    assert status == 503 and body.startswith(b"sink failing: Connection refused")

    influx.start_process()
    assert [a.status for a in stream(c.address, [batch])] == [OK]
    assert count(influx, "tcp_retransmit", "segs") == 2
    assert http_get(base + "/readyz")[0] == 200


def test_dropped_before_is_written_as_agent_loss_and_exported(influx, collector):
    c = collector()
    batches = [make_batch(node="n1", agent_id="boot-a", seq=1, records=[retrans(0)],
                          dropped_before=0),
               make_batch(node="n1", agent_id="boot-a", seq=2, records=[retrans(5), retrans(3)],
                          dropped_before=17),
               make_batch(node="n1", agent_id="boot-a", seq=3, records=[retrans(6)],
                          dropped_before=17)]
    assert [a.status for a in stream(c.address, batches)] == [OK, OK, OK]
    rows = influx.query('SELECT * FROM "agent_loss"', DB)
    # One point, at the batch's latest record, only when the count changed.
    assert [(r["time"], r["records"], r["node"], r["agent_id"], r["reason"]) for r in rows] == \
        [(T0 + 5, 17, "n1", "boot-a", "dropped_before")]
    assert metric(c, "fabricscope_collector_agent_dropped_records", node="n1") == 17


def test_many_agents_stream_at_once(influx, collector):
    c = collector()
    agents, per_agent = 6, 4
    results: dict[int, list] = {}

    def agent(n: int) -> None:
        batches = [make_batch(node=f"node{n}", agent_id=f"a{n}", seq=s + 1,
                              records=[retrans(s * 10 + i) for i in range(10)])
                   for s in range(per_agent)]
        results[n] = [(a.seq, a.status) for a in stream(c.address, batches)]

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: [(s + 1, OK) for s in range(per_agent)] for n in range(agents)}
    rows = influx.query('SELECT count("segs") FROM "tcp_retransmit" GROUP BY "node"', DB)
    assert {r["_tags"]["node"]: r["count"] for r in rows} == \
        {f"node{n}": per_agent * 10 for n in range(agents)}
    wait_for(lambda: metric(c, "fabricscope_collector_agents_connected") == 0)


def test_long_lived_stream_acks_each_batch_in_order(influx, collector):
    c = collector()
    outbox: queue.Queue = queue.Queue()

    def requests():
        while (batch := outbox.get()) is not None:
            yield batch

    with grpc.insecure_channel(c.address) as channel:
        acks = pb_grpc.CollectorStub(channel).Stream(requests(), timeout=60)
        for seq in (1, 2, 3):
            outbox.put(make_batch(node="n1", agent_id="a", seq=seq, records=[retrans(seq)]))
            ack = next(acks)
            assert (ack.seq, ack.status) == (seq, OK)
            assert count(influx, "tcp_retransmit", "segs") == seq   # written before the ack
            assert metric(c, "fabricscope_collector_agents_connected") == 1
        outbox.put(None)
        assert list(acks) == []
    wait_for(lambda: metric(c, "fabricscope_collector_agents_connected") == 0)


def test_registries_are_per_instance(collector):
    a, b = collector(), collector()
    stream(a.address, [make_batch(node="n", agent_id="x", seq=1, records=[retrans(0)])])
    assert metric(a, "fabricscope_collector_batches_received_total") == 1
    assert metric(b, "fabricscope_collector_batches_received_total") == 0


def test_message_that_is_not_a_batch_gets_invalid_argument(collector):
    c = collector()
    with grpc.insecure_channel(c.address) as channel:
        call = channel.stream_stream("/fabricscope.v1.Collector/Stream",
                                     request_serializer=lambda raw: raw,
                                     response_deserializer=pb.Ack.FromString)
        with pytest.raises(grpc.RpcError) as err:
            list(call(iter([b"\xff\xff\xff\xff"]), timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("message is not a Batch: ")
    assert metric(c, "fabricscope_collector_messages_undecodable_total") == 1


def test_points_influxdb_refuses_are_rejected_and_counted(influx, collector):
    c = collector()
    # Someone wrote segs as a string first (same shard: type checks are per shard), so
    # InfluxDB refuses integer segs for good.
    influx.query(f'CREATE DATABASE "{DB}"')
    line = f'tcp_retransmit,node=x segs="s" {T0 - 1}'.encode()
    status, _ = http_post(f"{influx.url}/write?db={DB}", line)
    assert status == 204
    batch = make_batch(node="n1", agent_id="a", seq=1,
                       records=[retrans(0), Record("train_step", T0, {"job": "j", "rank": "0"},
                                                   {"step": 1, "seconds": 0.5})])
    (ack,) = stream(c.address, [batch])
    assert ack.status == REJECTED
    assert ack.reason.startswith("1 of 2 records refused (1 written); first: InfluxDB refused "
                                 "points: partial write: field type conflict")
    assert metric(c, "fabricscope_collector_records_rejected_total", reason="sink_rejected") == 1
    assert metric(c, "fabricscope_collector_sink_errors_total", kind="rejected") == 1
    assert metric(c, "fabricscope_collector_records_written_total") == 1
    assert count(influx, "train_step", "step") == 1
