"""diagnosis-cost: what the diagnosis engine adds to the CPU of a collector that ingests a
fleet in real time, and how fast it names the fault.

    fabricscope bench diagnosis-cost [--steps NODES] [--repeats N] [--json]

A fleet of NODES simulated nodes (1,000 unless `--steps` says otherwise; one job,
one rank per node, in a ring: bench/fleet.py says what each node ships and where
that mix was measured) streams in real time (timestamps = now, each node's batch
0.2 s after its window, the nodes' polls spread over the second) over one gRPC
stream per node (bench/loadgen.py PacedStream: messages built just in time from
per-node templates, gzip level 1, little CPU of its own) into one real
`fabricscope collector` process writing to a real influxd. Each round gets a fresh
database and collector; first the job's steps and phases of the HISTORY_S seconds
before (what the engine keeps in memory of a job that has run a while) are written
straight into influxd, then the fleet streams WARM_S seconds (the engine takes the
job over), then MEASURE_S seconds in which the CPU (utime + stime, /proc/PID/stat)
of the collector and of influxd is read; ONSET_AFTER_S seconds into those, one
node's port starts losing 2 % of its segments (its cells out and the ring's cell
into it) and the steps slow down.

Baseline: the collector with `--no-diagnosis`. Subject: the engine on (the default,
one replica that owns the job). The figure is the collector's CPU-µs per
node-second of the measured span; the ratio subject / baseline - 1 is what the
engine adds to ingest (goal: <= 0.20). Beside it, per round: influxd's CPU per
node-second in both modes (the engine's queries are its other cost), the engine's
mean tick time and ticks per second (fabricscope_diagnosis_tick_seconds on the
collector's /metrics), onset -> first_seen of the lossy_link finding at the lossy
node (read back from the `finding` measurement; NaN when it never came), the
batches' ack latency (p99; how far the collector falls behind) and the sender's
lateness against its schedule, the generator's CPU and the load average.

On a machine where the fleet does not fit in real time (2 cores shared by the
generator, the collector and influxd), a round says so (`kept up` 0: the sender
ran late or acks lagged by more than a second); then measure at a node count that
fits (`--steps`) and scale per node: every figure is per node-second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import math
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fabricscope.bench.fleet import SECOND, Fleet
from fabricscope.bench.harness import Benchmark, percentile
from fabricscope.bench.loadgen import PacedStream, grpc_message
from fabricscope.diagnosis.causes import Cause
from fabricscope.services import InfluxServer
from fabricscope.wire import make_batch
from fabricscope.lab.stack import await_condition, http_get, metric_value, start_proc

NODES = 1000
HISTORY_S = 120        # steps written before the round: the engine's horizon (engine.py)
WARM_S = 20            # streams open, series created, the engine owns the job
MEASURE_S = 30         # the steady part whose CPU counts
ONSET_AFTER_S = 10     # the fault starts this far into the measured span
TAIL_S = 2             # streamed after the measured span (a late finding still counts)
FINISH_S = 60          # then the acks have this long to come
DETECT_GOAL_S = 5.0
KEPT_UP_S = 1.0        # sender lateness and ack p99 below this: the round kept up
TICK = "fabricscope_diagnosis_tick_seconds"
ERRORS = "fabricscope_diagnosis_errors_total"
ENGINE_CPU = "fabricscope_diagnosis_cpu_seconds_total"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Sample:
    """What the counters said at one moment of a round."""

    wall_s: float
    collector_cpu_s: float
    influx_cpu_s: float
    generator_cpu_s: float
    tick_sum_s: float
    ticks: float
    errors: float = 0.0           # engine ticks that failed (store or engine), so far
    engine_cpu_s: float = 0.0     # the engine's own thread CPU (its ticks), so far


@dataclass
class Round:
    diagnosis: bool
    nodes: int
    start: Sample
    end: Sample
    latencies_s: list[float]          # acks of the batches sent in the measured span
    late_s: float                     # the sender's worst lateness in the span
    first_seen_s: float | None        # onset -> first_seen of the expected finding
    findings: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)    # of the findings above info
    load1: float = 0.0
    log_tail: str = ""

    def per_node_s(self, attr: str) -> float:
        """CPU-µs per node-second of the measured span."""
        used = getattr(self.end, attr) - getattr(self.start, attr)
        return used / (self.nodes * (self.end.wall_s - self.start.wall_s)) * 1e6

    @property
    def tick_s(self) -> float:
        n = self.end.ticks - self.start.ticks
        return (self.end.tick_sum_s - self.start.tick_sum_s) / n if n else float("nan")

    @property
    def ticks_per_s(self) -> float:
        return (self.end.ticks - self.start.ticks) / (self.end.wall_s - self.start.wall_s)

    @property
    def ack_p99_s(self) -> float:
        p99 = percentile(self.latencies_s, 99)
        return float("nan") if p99 is None else p99

    @property
    def kept_up(self) -> bool:
        return self.late_s < KEPT_UP_S and self.ack_p99_s < KEPT_UP_S


def expected_latency_s(rows: list[dict], fleet: Fleet) -> float | None:
    """Onset -> first_seen of the lossy_link finding at the lossy node (None: absent)."""
    seen = [int(r["first_seen_ns"]) for r in rows
            if r.get("cause") == Cause.LOSSY_LINK and r.get("node") == fleet.node(fleet.lossy)
            and r.get("first_seen_ns") is not None]
    return (min(seen) - fleet.onset_ns()) / SECOND if seen else None


def finding_names(rows: list[dict]) -> list[str]:
    return sorted({f"{r.get('severity')} {r.get('cause')} at "
                   f"{r.get('node') or r.get('tor') or r.get('peer') or 'job'}" for r in rows})


class _Stream:
    """One round's fleet on the wire: every node's batch at its time, counters read at
    the start and end of the measured span."""

    def __init__(self, fleet: Fleet, address: str, first_s: int, sample):
        self.fleet, self.address, self.first_s, self.sample = fleet, address, first_s, sample
        self.streams: list[PacedStream] = []
        self.late_s = 0.0

    async def run(self) -> tuple[Sample, Sample, list[float]]:
        host, _, port = self.address.rpartition(":")
        self.streams = [PacedStream(host, int(port)) for _ in range(self.fleet.nodes)]
        try:
            for k in range(0, len(self.streams), 100):     # not a thousand SYNs at once
                await asyncio.gather(*(s.open() for s in self.streams[k:k + 100]))
            await self._send(self.first_s, WARM_S, measure=False)
            start = self.sample()
            await self._send(self.first_s + WARM_S, MEASURE_S, measure=True)
            end = self.sample()
            await self._send(self.first_s + WARM_S + MEASURE_S, TAIL_S, measure=False)
            unacked = sum(await asyncio.gather(*(s.finish(FINISH_S) for s in self.streams)))
        finally:
            for s in self.streams:
                s.close()
        span = range(WARM_S, WARM_S + MEASURE_S)
        # a batch never acknowledged counts as infinitely late: the round did not keep up
        latencies = [s.latencies_s[k] if k < len(s.latencies_s) else math.inf
                     for s in self.streams for k in span]
        if unacked:
            print(f"  {unacked} batches unacknowledged {FINISH_S} s after the last one went",
                  file=sys.stderr)
        return start, end, latencies

    async def _send(self, first_s: int, seconds: int, measure: bool) -> None:
        fleet = self.fleet
        for second in range(first_s, first_s + seconds):
            for i, stream in enumerate(self.streams):
                delay = fleet.sends_at_s(i, second) - time.time()
                if delay > 0.005:
                    await asyncio.sleep(delay)
                elif measure:
                    self.late_s = max(self.late_s, -delay)
                batch = make_batch(node=fleet.node(i), agent_id=f"sim-{i}",
                                   seq=second - self.first_s + 1, lines=fleet.lines(i, second))
                stream.send(grpc_message(batch.SerializeToString(), level=1))


class _Sides:
    def __init__(self, influx, workdir: Path, nodes: int,
                 log=lambda msg: print(msg, file=sys.stderr, flush=True)):
        self.influx, self.workdir, self.log = influx, workdir, log
        self.fleet = Fleet(nodes, lossy=nodes // 3)
        self.rounds: list[Round] = []

    def baseline(self) -> float:
        return self._measure(diagnosis=False)

    def subject(self) -> float:
        return self._measure(diagnosis=True)

    def _measure(self, diagnosis: bool) -> float:
        r = self._round(diagnosis)
        self.rounds.append(r)
        self.log(f"  engine {'on ' if diagnosis else 'off'}: collector "
                 f"{r.per_node_s('collector_cpu_s'):.1f} us/node-s, influxd "
                 f"{r.per_node_s('influx_cpu_s'):.1f}, generator "
                 f"{r.per_node_s('generator_cpu_s'):.1f}; ack p99 {r.ack_p99_s:.3f} s, "
                 f"sender late <= {r.late_s:.3f} s"
                 + (f"; tick {r.tick_s:.3f} s, {r.ticks_per_s:.2f}/s, onset -> first_seen "
                    f"{r.first_seen_s if r.first_seen_s is None else round(r.first_seen_s, 2)}"
                    f" s; findings: {', '.join(r.findings) or 'none'}" if diagnosis else "")
                 + ("" if r.kept_up else "  (DID NOT KEEP UP in real time)"))
        for summary in r.summaries:
            self.log(f"    {summary}")
        if r.end.errors:
            self.log(f"    {r.end.errors:.0f} engine ticks failed; the collector's log: "
                     f"{r.log_tail}")
        return r.per_node_s("collector_cpu_s")

    def _round(self, diagnosis: bool) -> Round:
        fleet, influx = self.fleet, self.influx
        db = f"round{len(self.rounds)}"
        first_s = int(time.time()) + 1
        fleet.start_s = first_s - HISTORY_S - 1
        fleet.onset_s = first_s + WARM_S + ONSET_AFTER_S
        influx.query(f'CREATE DATABASE "{db}"')
        try:
            write_history(influx, db, fleet, first_s)
            first_s = max(first_s, int(time.time()) + 1)   # the history took its time
            with running_collector(influx, db, diagnosis, self.workdir) as (proc, metrics):
                def sample() -> Sample:
                    text = http_get(metrics)[1]
                    return Sample(time.time(), cpu_seconds(proc.popen.pid),
                                  cpu_seconds(influx.pid), time.process_time(),
                                  metric_value(text, f"{TICK}_sum"),
                                  metric_value(text, f"{TICK}_count"),
                                  metric_value(text, ERRORS),
                                  metric_value(text, ENGINE_CPU) if diagnosis else 0.0)

                fleet.onset_s = first_s + WARM_S + ONSET_AFTER_S
                stream = _Stream(fleet, proc.urls["grpc"], first_s, sample)
                start, end, latencies = asyncio.run(stream.run())
                rows = [{**r, **r.get("_tags", {})}
                        for r in influx.query("SELECT * FROM finding", db=db)] \
                    if diagnosis else []
                log_tail = proc.log_tail(8)
        finally:
            influx.query(f'DROP DATABASE "{db}"')
        return Round(diagnosis, fleet.nodes, start, end, latencies, stream.late_s,
                     expected_latency_s(rows, fleet), finding_names(rows),
                     sorted({r.get("summary", "") for r in rows if r.get("severity") != "info"}),
                     os.getloadavg()[0], log_tail)

    def extra(self) -> dict[str, float]:
        off, on = self.rounds[-2], self.rounds[-1]
        return {
            "influxd CPU-us/node-s, engine off": off.per_node_s("influx_cpu_s"),
            "influxd CPU-us/node-s, engine on": on.per_node_s("influx_cpu_s"),
            "influxd ratio on/off": on.per_node_s("influx_cpu_s") /
            off.per_node_s("influx_cpu_s"),
            "engine thread CPU-us/node-s": on.per_node_s("engine_cpu_s"),
            "engine tick s (mean)": on.tick_s,
            "engine ticks per s": on.ticks_per_s,
            "onset -> first_seen s": float("nan") if on.first_seen_s is None
            else on.first_seen_s,
            "right finding within 5 s": float(on.first_seen_s is not None
                                              and on.first_seen_s <= DETECT_GOAL_S),
            "ack p99 s, engine off": off.ack_p99_s,
            "ack p99 s, engine on": on.ack_p99_s,
            "kept up (both sides)": float(off.kept_up and on.kept_up),
            "generator CPU-us/node-s": statistics.mean(
                [off.per_node_s("generator_cpu_s"), on.per_node_s("generator_cpu_s")]),
            "records per node-s": self.fleet.records_per_second(0, False),
            "load average (1 min)": on.load1,
        }


def write_history(influx, db: str, fleet: Fleet, first_s: int) -> None:
    """The job's steps of the HISTORY_S seconds before the round, straight into influxd:
    what a job that has run for a while shows the engine that takes it over (it keeps
    that much of the steps and phases in memory, and its evaluations go over them)."""
    write_lines(influx, db, [line for second in range(first_s - HISTORY_S, first_s)
                             for i in range(fleet.nodes)
                             for line in fleet.step_lines(i, second - 1,
                                                          ("gloo_step,", "gloo_phase,"))])


def write_lines(influx, db: str, lines: list[str]) -> None:
    url = f"{influx.url}/write?db={db}&precision=ns"
    for k in range(0, len(lines), 20_000):
        body = gzip.compress("\n".join(lines[k:k + 20_000]).encode(), 1)
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Encoding": "gzip"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            answer.read()


@contextlib.contextmanager
def running_collector(influx, db: str, diagnosis: bool, workdir: Path):
    """A `fabricscope collector` process on loopback writing to `db`: (its Proc, the URL
    of its /metrics); stopped on leaving."""
    proc = start_proc(f"collector-{db}", [
        sys.executable, "-m", "fabricscope", "collector", "--listen", "127.0.0.1:0",
        "--influx-url", influx.url, "--influx-db", db, "--metrics-host", "127.0.0.1",
        "--metrics-port", "0", "--replica-id", "bench",
        "--diagnosis" if diagnosis else "--no-diagnosis"], workdir)
    try:
        def logged(pattern: str):
            def found():
                if not proc.alive():
                    raise RuntimeError(f"the collector exited: {proc.log_tail(5)}")
                m = re.search(pattern, proc.log_path.read_text(errors="replace"))
                return m.group(1) if m else None
            return found
        proc.urls["grpc"] = await_condition(logged(r"collector listening on (\S+:\d+)"), 60,
                                            "the collector to listen")
        metrics = await_condition(logged(r"collector metrics on (http://\S+/metrics)"), 60,
                                  "the collector's /metrics")
        yield proc, metrics
        if not proc.alive():
            raise RuntimeError(f"the collector exited: {proc.log_tail(5)}")
    finally:
        proc.stop()


@contextlib.contextmanager
def environment(args):
    with tempfile.TemporaryDirectory(prefix="fabricscope-bench-") as tmp, \
            InfluxServer() as influx:
        yield _Sides(influx, Path(tmp), getattr(args, "steps", None) or NODES)


BENCH = Benchmark(
    name="diagnosis-cost",
    description="collector CPU per node-second, engine on / off, 1,000 nodes in real time",
    unit="CPU-us/node-s",
    baseline_label="ingest only (--no-diagnosis)",
    subject_label="ingest + diagnosis engine",
    environment=environment,
    repeats=3,
    goal="ratio <= 1.20",
)
