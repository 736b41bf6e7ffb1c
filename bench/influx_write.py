"""influx-write: points/s into InfluxDB through the collector / posting the same lines with curl.

Both sides write the same 400k synthetic points (`--steps` x 20k when given: 20
agents x 10 batches of 2000) into one real influxd (1.x, v1 /write API), each round
under fresh tags so that both create the same number of new series.

Baseline: the lines, already encoded and gzipped in 5000-line files, POSTed by
curl processes, 4 at a time (`curl --data-binary @file`, Content-Encoding:
gzip). Points/s = points / wall time until the last 204.

Subject: a `fabricscope collector` process receives the same lines from 20 agents
and writes them (influx_batch_lines 5000, influx_writers 4: the defaults). The
agents are stand-ins for remote nodes that cost this machine almost nothing
(bench/loadgen.py run_prebuilt): each agent's Batches are serialized and gzipped
as gRPC's gzip compresses them before the clock starts, and sent as they are on
one gRPC stream per agent (HTTP/2 by h2, connections open before the clock), at
most 4 unacknowledged, as a shipper does. So what is timed is the collector's own
work: gRPC receive and decompression, protobuf decoding, validation of every line,
merging streams into requests, the writes to influxd and the acks after them.
Points/s = points / wall time from the first send to the last ack; every batch
must be acknowledged OK. The generator's CPU time within it is reported beside the
ratio (`generator CPU-s per round`; about 0.1 s for 400k points, where the real
shippers in one process spend about 1.1 s, mostly on gzip).
`FABRICSCOPE_BENCH_LOADGEN=shipper` sends with those shippers instead
(bench/loadgen.py run_load: fabricscope.agent.shipper.Shipper, batches built within the clock).

influxd shares this machine's two CPUs with the collector (the baseline has them
almost to itself), so the ratio is a lower bound of what a collector host of its
own achieves.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fabricscope.bench.harness import Benchmark
from fabricscope.bench.loadgen import LoadSpec, build_batches, run_load, run_prebuilt
from fabricscope.bench.transport_env import DB, running_collector

AGENTS, BATCHES, CHUNK, CURLS = 20, 10, 5000, 4


class _Sides:
    def __init__(self, env, workdir: Path, per_agent: int):
        self.env, self.workdir, self.per_agent, self.round = env, workdir, per_agent, 0
        self._generator_cpu_s = 0.0

    def _spec(self, prefix: str) -> LoadSpec:
        self.round += 1
        return LoadSpec(self.env.address, agents=AGENTS, batches=BATCHES,
                        records=self.per_agent // BATCHES, node_prefix=f"{prefix}{self.round}-")

    def baseline(self) -> float:
        spec = self._spec("curl")
        lines = [line for i in range(spec.agents) for batch in build_batches(spec, i)
                 for line in batch]
        files = []
        for k in range(0, len(lines), CHUNK):
            path = self.workdir / f"chunk{k}.lp.gz"
            path.write_bytes(gzip.compress("\n".join(lines[k:k + CHUNK]).encode(), 1))
            files.append(path)
        url = f"{self.env.influx.url}/write?db={DB}&precision=ns"
        start = time.perf_counter()
        with ThreadPoolExecutor(CURLS) as pool:
            codes = list(pool.map(lambda f: _curl(url, f), files))
        seconds = time.perf_counter() - start
        if set(codes) != {"204"}:
            raise RuntimeError(f"curl got HTTP {sorted(set(codes))}")
        for path in files:
            path.unlink()
        return len(lines) / seconds

    def subject(self) -> float:
        spec = self._spec("coll")
        shippers = os.environ.get("FABRICSCOPE_BENCH_LOADGEN", "prebuilt") == "shipper"
        result = asyncio.run(run_load(spec) if shippers else run_prebuilt(spec))
        if result.dropped or result.acked_records != spec.total_records:
            raise RuntimeError(f"lost records: {result}")
        self._generator_cpu_s = result.generator_cpu_s
        return result.records_per_s

    def extra(self) -> dict[str, float]:
        return {"generator CPU-s per round": self._generator_cpu_s}


def _curl(url: str, path: Path) -> str:
    return subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-XPOST",
                           "-H", "Content-Encoding: gzip", "--data-binary", f"@{path}", url],
                          capture_output=True, text=True).stdout


@contextlib.contextmanager
def environment(args):
    per_agent = (getattr(args, "steps", None) or 20) * 1000
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-") as tmp, \
            running_collector() as env:
        subprocess.run(["curl", "-s", "-XPOST", f"{env.influx.url}/query", "--data-urlencode",
                        f'q=CREATE DATABASE "{DB}"'], check=True, capture_output=True)
        yield _Sides(env, Path(tmp), per_agent)


BENCH = Benchmark(
    name="influx-write",
    description="points/s into influxd through the collector / curl posting the same lines",
    unit="points/s",
    baseline_label="curl direct (4 parallel)",
    subject_label="through the collector",
    environment=environment,
    repeats=3,
    goal="ratio >= 0.8",
)
