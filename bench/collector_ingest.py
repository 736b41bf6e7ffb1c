"""collector-ingest: records one collector ingests per CPU-second / decoding them only.

Subject: 50 agents of the load generator (bench/loadgen.py: the real shipper, one
gRPC stream each, gzip) send 500k synthetic records (`--steps` x 1000 per agent
when given) to a `fabricscope collector` process that validates them and writes
them to a real influxd (v1 API, gzip, 5000-line requests). The figure is
records / collector CPU seconds (user + system, from /proc by pid): how many
records one core ingests end to end (gRPC, gunzip, protobuf, validation, merging,
line protocol to InfluxDB, acks).

Baseline: the same serialized batches decoded only (protobuf parse and touching
every line), in this process: the floor no collector can go below. The ratio is
the share of a core's decode-only speed that the whole ingest path keeps.

Extras: MB/s per core (serialized batch bytes / CPU second), CPU seconds per
million records, and the wall-clock records/s of the run (on this shared 2-core
machine the load generator and influxd compete for the same CPUs).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fabricscope.bench.harness import Benchmark
from fabricscope.bench.loadgen import LoadSpec, run_load
from fabricscope.bench.transport_env import running_collector, serialized_batches

AGENTS, BATCHES = 50, 10


class _Sides:
    def __init__(self, env, per_agent: int):
        self.env, self.per_agent, self.round = env, per_agent, 0
        self._extra: dict[str, float] = {}
        spec = self._spec()
        self.payloads = serialized_batches(spec)
        self.total = spec.total_records
        self.mb = sum(len(p) for p in self.payloads) / 1e6

    def _spec(self) -> LoadSpec:
        self.round += 1
        return LoadSpec(self.env.address, agents=AGENTS, batches=BATCHES,
                        records=self.per_agent // BATCHES, node_prefix=f"r{self.round}-")

    def baseline(self) -> float:
        from fabricscope.wire import pb
        start = time.process_time()
        count = 0
        for data in self.payloads:
            for _line in pb.Batch.FromString(data).lines:
                count += 1
        assert count == self.total
        return count / (time.process_time() - start)

    def subject(self) -> float:
        spec = self._spec()
        cpu = self.env.cpu_seconds()
        result = asyncio.run(run_load(spec))
        used = self.env.cpu_seconds() - cpu
        if result.dropped or result.acked_records != spec.total_records:
            raise RuntimeError(f"lost records: {result}")
        self._extra = {"MB/s per core": result.bytes_sent / 1e6 / used,
                       "CPU s per 1M records": used / spec.total_records * 1e6,
                       "wall records/s": result.records_per_s}
        return spec.total_records / used

    def extra(self) -> dict[str, float]:
        return self._extra


@contextlib.contextmanager
def environment(args):
    per_agent = (getattr(args, "steps", None) or 10) * 1000
    with running_collector() as env:
        yield _Sides(env, per_agent)


BENCH = Benchmark(
    name="collector-ingest",
    description="records per collector CPU-second, 50 agent streams into influxd / decode only",
    unit="records/CPU-s",
    baseline_label="decode only",
    subject_label="collector end to end",
    environment=environment,
    repeats=3,
)
