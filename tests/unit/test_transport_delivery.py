"""fabricscope.collector.delivery and fabricscope.collector.coalesce: spool when InfluxDB fails, slow agents down when
the spool is full, replay, and merged writes (collector in-process, real influxd)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from fabricscope.collector.coalesce import Coalescer
from fabricscope.collector.config import CollectorConfig
from fabricscope.collector.server import CollectorThread
from fabricscope.collector.sinks.base import SinkError, SinkRejected
from fabricscope.services import InfluxServer, http_get
from fabricscope.wire import make_batch, pb, pb_grpc
from tests.unit.transport_procs import complete, synthetic_counts, wait_for

T0 = time.time_ns() - 60 * 10**9
OK, RETRY = pb.Ack.OK, pb.Ack.RETRY


def batch(seq: int, n: int = 10, node: str = "n1"):
    first = (seq - 1) * n
    return make_batch(node=node, agent_id="a", seq=seq, lines=[
        f"synthetic,node={node},stream=0 n={i}i,value=0.5 {T0 + i}" for i in range(first, first + n)])


def stream(address: str, batches) -> list:
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.CollectorStub(channel).Stream(iter(batches), timeout=60))


@pytest.fixture
def influx():
    with InfluxServer() as server:
        yield server


@pytest.fixture
def collectors(influx, tmp_path):
    started: list[CollectorThread] = []

    def start(**overrides) -> CollectorThread:
        cfg = CollectorConfig(**{"listen": "127.0.0.1:0", "influx_url": influx.url,
                                 "influx_db": "fs", "metrics_host": "127.0.0.1",
                                 "metrics_port": 0, "spool_dir": str(tmp_path / "spool"),
                                 "retry_after_s": 0.5, **overrides})
        started.append(CollectorThread(cfg).start())
        return started[-1]

    try:
        yield start
    finally:
        for c in started:
            c.stop()


def metric(c: CollectorThread, name: str, **labels) -> float:
    return c.collector.metrics.registry.get_sample_value(name, labels) or 0.0


def readyz(c: CollectorThread) -> tuple[int, bytes]:
    return http_get(f"http://127.0.0.1:{c.collector.metrics_port}/readyz")


def test_influxdb_down_batches_are_spooled_acked_and_replayed(influx, collectors):
    c = collectors()
    influx.stop_process()
    acks = stream(c.address, [batch(s) for s in (1, 2, 3)])
    assert [(a.seq, a.status, a.code) for a in acks] == [(1, OK, 0), (2, OK, 0), (3, OK, 0)]
    assert metric(c, "fabricscope_collector_records_spooled_total") == 30
    assert metric(c, "fabricscope_collector_spool_entries") == 3
    assert metric(c, "fabricscope_collector_spool_oldest_age_seconds") > 0
    assert readyz(c)[0] == 200                # still taking batches
    influx.start_process()
    wait_for(lambda: metric(c, "fabricscope_collector_spool_entries") == 0, 30, "the replay")
    assert synthetic_counts(influx) == {"n1": complete(30)}
    assert metric(c, "fabricscope_collector_records_replayed_total") == 30
    assert metric(c, "fabricscope_collector_records_written_total") == 30
    assert metric(c, "fabricscope_collector_spool_oldest_age_seconds") == 0
    # Healthy again: the next batch is written directly.
    assert [a.status for a in stream(c.address, [batch(4)])] == [OK]
    assert metric(c, "fabricscope_collector_records_spooled_total") == 30


def test_full_spool_tells_agents_to_slow_down(influx, collectors):
    c = collectors(spool_max_bytes=400)
    influx.stop_process()
    acks = stream(c.address, [batch(1), batch(2, n=200)])
    assert acks[0].status == OK
    assert (acks[1].status, acks[1].code, acks[1].retry_after_ms) == (
        RETRY, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], 500)
    assert acks[1].reason.startswith("collector spool full (")
    assert metric(c, "fabricscope_collector_batches_throttled_total", reason="spool_full") == 1
    assert readyz(c) == (503, b"spool full\n")
    influx.start_process()
    wait_for(lambda: metric(c, "fabricscope_collector_spool_entries") == 0, 30, "the replay")
    # readiness follows the spool's state on the replay's next turn, not with the metric
    wait_for(lambda: readyz(c)[0] == 200, 30, "ready again once the spool drained")
    assert [a.status for a in stream(c.address, [batch(2, n=200)])] == [OK]   # the resend
    assert synthetic_counts(influx) == {"n1": (10 + 200, sum(range(10)) + sum(range(200, 400)))}


def test_without_a_spool_influxdb_down_is_answered_retry(influx, collectors):
    c = collectors(spool_dir="")
    influx.stop_process()
    (ack,) = stream(c.address, [batch(1)])
    assert (ack.status, ack.code, ack.retry_after_ms) == (
        RETRY, grpc.StatusCode.UNAVAILABLE.value[0], 500)
    assert metric(c, "fabricscope_collector_batches_throttled_total", reason="sink_down") == 1


def test_a_spool_left_behind_is_replayed_by_the_next_collector(influx, collectors, tmp_path):
    first = collectors()
    influx.stop_process()
    assert [a.status for a in stream(first.address, [batch(1), batch(2)])] == [OK, OK]
    first.stop()
    # Damage one entry: its records are lost and counted, the other is replayed.
    entries = sorted((tmp_path / "spool").glob("*.spool"))
    assert len(entries) == 2
    entries[0].write_bytes(entries[0].read_bytes()[:-3])
    influx.start_process()
    second = collectors()
    wait_for(lambda: metric(second, "fabricscope_collector_spool_entries") == 0, 30, "replay")
    assert metric(second, "fabricscope_collector_records_dropped_total",
                  reason="spool_corrupt") == 10
    assert synthetic_counts(influx) == {"n1": (10, sum(range(10, 20)))}


def test_collector_with_a_spool_starts_while_influxdb_is_down(influx, collectors):
    influx.stop_process()
    c = collectors()
    assert [a.status for a in stream(c.address, [batch(1)])] == [OK]
    influx.start_process()
    wait_for(lambda: synthetic_counts(influx) == {"n1": complete(10)}, 30, "the replay")


def test_concurrent_writes_are_merged_and_a_refusal_reaches_only_its_batch():
    calls: list[list[str]] = []

    async def main():
        gate = asyncio.Event()

        async def write(lines):
            calls.append(list(lines))
            if len(calls) == 1:
                await gate.wait()               # the first request is slow...
            if "bad" in lines and len(lines) > 1:
                raise SinkRejected("partial write", 1)
            if lines == ["bad"]:
                raise SinkRejected("field type conflict", 1)

        co = Coalescer(write, max_lines=5, writers=1)
        co.start()
        first = asyncio.create_task(co.write(["a"]))
        await asyncio.sleep(0)
        rest = [asyncio.create_task(co.write(lines))         # ...so these accumulate
                for lines in (["b", "c"], ["bad"], ["d"], ["e", "f", "g"])]
        gate.set()
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        await co.close()
        return results
    results = asyncio.run(main())
    assert [type(r).__name__ for r in results] == ["NoneType", "NoneType", "SinkRejected",
                                                   "NoneType", "NoneType"]
    # a alone; b,c,bad,d merged (5 lines max) and refused, then one by one; e,f,g.
    assert calls == [["a"], ["b", "c", "bad", "d"], ["b", "c"], ["bad"], ["d"], ["e", "f", "g"]]


def test_a_temporary_failure_fails_every_merged_request():
    async def main():
        async def write(lines):
            raise SinkError("Connection refused")
        co = Coalescer(write, max_lines=100, writers=1)
        co.start()
        results = await asyncio.gather(co.write(["a"]), co.write(["b"]), return_exceptions=True)
        await co.close()
        return results
    assert [str(r) for r in asyncio.run(main())] == ["Connection refused"] * 2
