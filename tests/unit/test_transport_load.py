"""250 agents' streams at once against one collector process: zero loss, zero doubles."""

from __future__ import annotations

import asyncio

from bench.loadgen import LoadSpec, run_load
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
