"""250 agents' streams at once against one collector process: zero loss, zero doubles; and
the benchmarks' pre-built generator delivers the same."""

from __future__ import annotations

import asyncio

from fabricscope.bench.loadgen import LoadSpec, run_load, run_prebuilt
from fabricscope.services import InfluxServer, free_port
from tests.unit.transport_procs import Procs, complete, synthetic_counts

AGENTS, BATCHES, RECORDS = 250, 8, 50


def test_250_concurrent_agent_streams_lose_nothing(tmp_path):
    procs = Procs(tmp_path)
    with InfluxServer() as influx:
        try:
            port = free_port()
            collector = procs.collector("collector", port, influx.url).start()
            spec = LoadSpec(f"127.0.0.1:{port}", agents=AGENTS, batches=BATCHES,
                            records=RECORDS, timeout_s=240)
            result = asyncio.run(run_load(spec))
            print(f"{AGENTS} streams: {result.records} records in {result.seconds:.1f} s = "
                  f"{result.records_per_s:.0f} records/s, {result.retries} retries")
            assert (result.acked_records, result.dropped) == (spec.total_records, 0)
            assert result.batches_ok == AGENTS * BATCHES
            counts = synthetic_counts(influx)
            assert counts == {spec.node(i): complete(BATCHES * RECORDS) for i in range(AGENTS)}
            assert collector.metric("fabricscope_collector_records_acked_total") == \
                spec.total_records
            assert collector.metric("fabricscope_collector_records_rejected_total") == 0
            assert collector.metric("fabricscope_collector_agent_last_seen_timestamp_seconds",
                                    node="load249") > 0
        finally:
            procs.stop_all()


def test_prebuilt_messages_reach_influxdb_exactly_once(tmp_path):
    procs = Procs(tmp_path)
    with InfluxServer() as influx:
        try:
            port = free_port()
            collector = procs.collector("collector", port, influx.url).start()
            spec = LoadSpec(f"127.0.0.1:{port}", agents=5, batches=6, records=300,
                            max_in_flight=2, timeout_s=120)
            result = asyncio.run(run_prebuilt(spec))
            assert (result.acked_records, result.dropped, result.retries) == \
                (spec.total_records, 0, 0)
            assert result.batches_ok == 5 * 6 and result.generator_cpu_s > 0
            assert synthetic_counts(influx) == {spec.node(i): complete(6 * 300) for i in range(5)}
            assert collector.metric("fabricscope_collector_records_acked_total") == \
                spec.total_records
        finally:
            procs.stop_all()
