"""The sinks against real servers: influxd (v1 API) and VictoriaMetrics (v2 API)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from fabricscope.collector.config import CollectorConfig
from fabricscope.collector.server import CollectorThread
from fabricscope.collector.sinks import SinkError, SinkRejected, make_sink
from fabricscope.collector.sinks.http import on_loopback
from fabricscope.collector.sinks.influx_v1 import InfluxV1Sink
from fabricscope.errors import UserError
from fabricscope.records import Record
from fabricscope.selfmetrics import Readiness, SelfMetricsServer
from fabricscope.services import InfluxServer, free_port
from tests.support.servers import VictoriaMetricsServer
from fabricscope.wire import make_batch, pb, pb_grpc

DB = "fs_sink"
T0 = (time.time_ns() // 10**6 - 60_000) * 10**6     # whole ms: VictoriaMetrics keeps ms


def config(url: str, **kw) -> CollectorConfig:
    return CollectorConfig(influx_url=url, influx_db=DB, influx_timeout_s=5, **kw)


def run(coro):
    return asyncio.run(coro)


async def with_sink(cfg, action):
    sink = make_sink(cfg)
    try:
        await sink.start()
        return await action(sink)
    finally:
        await sink.close()


@pytest.fixture
def influx():
    with InfluxServer() as server:
        yield server


def test_v1_escaped_names_and_values_round_trip_through_influxd(influx):
    records = [Record("odd measure,x", T0, {"tag key": "a,b=c d", "t=2": "é中"},
                      {"field,k y": 1, "s": 'q"u\\o\nte', "b": True, "f": 1.5})]
    run(with_sink(config(influx.url), lambda s: s.write(records)))
    rows = influx.query('SELECT * FROM "odd measure,x"', DB)
    assert len(rows) == 1
    row = rows[0]
    assert (row["time"], row["tag key"], row["t=2"], row["field,k y"], row["s"], row["b"],
            row["f"]) == (T0, "a,b=c d", "é中", 1, 'q"u\\o\nte', True, 1.5)
    assert influx.field_types("odd measure,x", DB) == \
        {"field,k y": "integer", "s": "string", "b": "boolean", "f": "float"}


@pytest.mark.parametrize("url, local", [
    ("http://127.0.0.1:8086", True), ("http://127.0.0.2:8086", True), ("http://localhost", True),
    ("http://[::1]:8086/", True), ("http://198.18.0.1:8086", False),
    ("https://influx.example:8086", False), ("http://[2001:db8::1]:8086", False)])
def test_bodies_to_a_server_on_this_host_travel_uncompressed(url, local):
    assert on_loopback(url) is local
    assert InfluxV1Sink(config(url)).gzip is not local


@pytest.mark.parametrize("gzip", [False, True])
def test_v1_writes_plain_and_gzipped_bodies(influx, gzip):
    async def scenario(sink):
        sink.gzip = gzip                  # 127.0.0.1: plain unless told otherwise
        await sink.write([Record("m", T0 + i, {"k": "a b"}, {"v": i}) for i in range(7)])

    run(with_sink(config(influx.url), scenario))
    assert influx.query('SELECT sum("v") FROM "m"', DB)[0]["sum"] == 21


def test_v1_writes_in_chunks_of_batch_lines(influx):
    records = [Record("m", T0 + i, {"k": str(i % 3)}, {"v": i}) for i in range(23)]
    run(with_sink(config(influx.url, influx_batch_lines=5), lambda s: s.write(records)))
    assert influx.query('SELECT count("v") FROM "m"', DB)[0]["count"] == 23


def test_v1_points_refused_by_influxd_are_permanent_and_counted(influx):
    async def conflict(sink):
        await sink.write([Record("m", T0, {}, {"v": 1})])
        with pytest.raises(SinkRejected) as err:
            await sink.write([Record("m", T0 + 1, {}, {"v": "text"}),
                              Record("m", T0 + 2, {}, {"v": 2})])
        return err.value

    err = run(with_sink(config(influx.url), conflict))
    assert "field type conflict" in str(err) and err.records == 1
    assert influx.query('SELECT count("v") FROM "m"', DB)[0]["count"] == 2


def test_v1_recreates_a_dropped_database(influx):
    async def scenario(sink):
        await sink.write([Record("m", T0, {}, {"v": 1})])
        influx.query(f'DROP DATABASE "{DB}"')
        with pytest.raises(SinkError, match="database not found"):
            await sink.write([Record("m", T0 + 1, {}, {"v": 2})])
        await sink.write([Record("m", T0 + 2, {}, {"v": 3})])   # the agent's resend

    run(with_sink(config(influx.url, influx_retries=0), scenario))
    assert influx.query('SELECT "v" FROM "m"', DB)[0]["v"] == 3


def test_v1_retries_recreate_a_dropped_database_within_one_write(influx):
    async def scenario(sink):
        await sink.write([Record("m", T0, {}, {"v": 1})])
        influx.query(f'DROP DATABASE "{DB}"')
        await sink.write([Record("m", T0 + 1, {}, {"v": 2})])   # 404, recreate, retry

    run(with_sink(config(influx.url), scenario))
    assert influx.query('SELECT "v" FROM "m"', DB)[0]["v"] == 2


@pytest.mark.parametrize("api", ["v1", "v2"])
def test_unreachable_influxdb_at_start_is_a_one_line_user_error(api):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError) as err:
        run(with_sink(config(url, influx_api=api), lambda s: s.write([])))
    assert err.value.one_line() == (
        f"fabricscope: error: cannot reach InfluxDB at {url}: Connection refused; fix: start "
        "InfluxDB or point --influx-url (FABRICSCOPE_COLLECTOR_INFLUX_URL) at it")


def test_v1_start_refuses_a_server_that_is_not_influxdb():
    # Any HTTP server that is not InfluxDB: here fabricscope's own /metrics server.
    other = SelfMetricsServer("127.0.0.1", 0, Readiness()).start()
    try:
        url = f"http://127.0.0.1:{other.port}"
        with pytest.raises(UserError) as err:
            run(with_sink(config(url), lambda s: s.write([])))
        assert err.value.cause == f"cannot reach InfluxDB at {url}: /ping answered HTTP 404 " \
            "(is it InfluxDB 1.x?)"
    finally:
        other.stop()


def test_v2_sink_writes_to_victoriametrics_through_the_collector():
    with VictoriaMetricsServer() as vm:
        cfg = config(vm.url, influx_api="v2", listen="127.0.0.1:0", metrics_host="127.0.0.1",
                     metrics_port=0)
        records = [Record("tcp_retransmit", T0 + i * 10**6,
                          {"saddr": "198.18.0.1", "daddr": "198.18.0.2", "sport": "40000",
                           "dport": "5201", "state": "ESTABLISHED"}, {"segs": i + 1})
                   for i in range(3)]
        with CollectorThread(cfg) as c, grpc.insecure_channel(c.address) as channel:
            batch = make_batch(node="n1", agent_id="a", seq=1, records=records)
            acks = list(pb_grpc.CollectorStub(channel).Stream(iter([batch]), timeout=60))
            assert [(a.seq, a.status) for a in acks] == [(1, pb.Ack.OK)]
        (series,) = vm.wait_export('{__name__="tcp_retransmit_segs"}')
        assert {k: v for k, v in series["metric"].items() if k != "db"} == {
            "__name__": "tcp_retransmit_segs", "node": "n1", "saddr": "198.18.0.1",
            "daddr": "198.18.0.2", "sport": "40000", "dport": "5201", "state": "ESTABLISHED"}
        assert series["values"] == [1, 2, 3]
        assert series["timestamps"] == [T0 // 10**6 + i for i in range(3)]


def test_v2_sink_temporary_failure_when_server_goes_away():
    with VictoriaMetricsServer() as vm:
        async def scenario(sink):
            vm.stop_process()
            with pytest.raises(SinkError, match="Connection refused"):
                await sink.write([Record("m", T0, {}, {"v": 1})])

        run(with_sink(config(vm.url, influx_api="v2"), scenario))
