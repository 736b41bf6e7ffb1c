"""What one engine tick costs at a given job size, in this process, without real time.

    python -m fabricscope.bench.diagnosis_tick [--nodes 1000] [--ticks 4]

`fabricscope bench diagnosis-cost` measures the engine inside a collector fed in
real time, which this 2-core machine manages only up to a few hundred nodes. This
measures the tick alone at any size: a fresh influxd gets a job of NODES ranks as
bench/fleet.py streams it (the steps and phases of the engine's 120 s horizon, then
LIVE_S seconds of everything, one node lossy for the last 8), and a LiveDiagnosis
(diagnosis/live.py, one replica) takes the job over and ticks TICKS times, a
second apart on its clock. Before each tick the store gets the second that a
running job's agents would have shipped by then, so each tick reads what a tick of
a running job reads (cells and nodes from the last window's start, steps and
phases of the last READ_BACK_S) and evaluates the job. Per tick it prints the CPU
of this process in the tick (the part in StoreSource.read: queries, JSON, tables;
the rest: evaluation, merging, writes; and how much of it was the garbage
collector), the rows read, and influxd's CPU (utime + stime from /proc) for the
queries.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass

from fabricscope.bench.diagnosis_cost import cpu_seconds, write_history, write_lines
from fabricscope.bench.fleet import SECOND, Fleet

LIVE_S = 15


@dataclass
class TickCost:
    cpu_s: float
    read_s: float
    gc_s: float
    rows: int
    influx_s: float
    findings: list[str]

    def line(self, nodes: int) -> str:
        return (f"tick: cpu {self.cpu_s:.3f} s (reads {self.read_s:.3f}, rest "
                f"{self.cpu_s - self.read_s:.3f}; gc {self.gc_s:.3f}), {self.rows} rows, "
                f"influxd {self.influx_s:.2f} s; per node {self.cpu_s / nodes * 1e3:.2f} ms, "
                f"influxd {self.influx_s / nodes * 1e3:.2f} ms; {', '.join(self.findings)}")


class _Meter:
    """CPU of this process in StoreSource.read and in the garbage collector, and the
    rows the store answered (Store.query reads through Store.series)."""

    def __init__(self):
        self.read_s = self.gc_s = 0.0
        self.rows = 0
        self._gc_start = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, _info) -> None:
        if phase == "start":
            self._gc_start = time.process_time()
        else:
            self.gc_s += time.process_time() - self._gc_start

    def reset(self) -> None:
        self.read_s = self.gc_s = 0.0
        self.rows = 0

    def wrap(self, live) -> None:
        source, store, meter = live.source, live.store, self

        def read(*args, **kwargs):
            started = time.process_time()
            try:
                return type(source).read(source, *args, **kwargs)
            finally:
                meter.read_s += time.process_time() - started

        def series(influxql: str):
            answer = type(store).series(store, influxql)
            meter.rows += sum(len(values) for _tags, _columns, values in answer)
            return answer
        source.read = read
        object.__setattr__(store, "series", series)    # Store is a frozen dataclass


def measure(nodes: int, ticks: int, log=print) -> list[TickCost]:
    from fabricscope.diagnosis.live import TICK_OFFSET_S, LiveDiagnosis
    from fabricscope.diagnosis.metrics import DiagnosisMetrics
    from fabricscope.diagnosis.store import Store
    from fabricscope.services import InfluxServer
    from prometheus_client import CollectorRegistry

    with InfluxServer() as influx:
        end = int(time.time())
        first, live_from = end - LIVE_S, end - ticks
        fleet = Fleet(nodes, lossy=nodes // 3, onset_s=end - 8, start_s=first - 121)
        influx.query('CREATE DATABASE "fabricscope"')
        write_history(influx, "fabricscope", fleet, first)

        def ship(seconds: range) -> None:
            write_lines(influx, "fabricscope", [x for s in seconds for i in range(nodes)
                                                for x in fleet.lines(i, s)])
        ship(range(first, live_from))
        offset = int(TICK_OFFSET_S * SECOND)        # where the live engine ticks
        clock = [live_from * SECOND + offset]
        live = LiveDiagnosis(Store(influx.url), DiagnosisMetrics(CollectorRegistry()), "bench",
                             clock=lambda: clock[0])
        meter = _Meter()
        meter.wrap(live)
        out = []
        for k in range(ticks + 1):
            # the tick at second S + TICK_OFFSET_S finds the seconds before S in the store
            clock[0] = (live_from + k) * SECOND + offset
            if k:
                ship(range(live_from + k - 1, live_from + k))
            meter.reset()
            cpu, influx_cpu = time.process_time(), cpu_seconds(influx.pid)
            found = live.tick()
            cost = TickCost(time.process_time() - cpu, meter.read_s, meter.gc_s, meter.rows,
                            cpu_seconds(influx.pid) - influx_cpu,
                            sorted({f"{f.cause} at {f.where}" for f in found}))
            log(("takeover " if k == 0 else "") + cost.line(nodes))
            if k:
                out.append(cost)
        return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fabricscope.bench.diagnosis_tick",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--ticks", type=int, default=4)
    args = p.parse_args(argv)
    if args.nodes < 3 or args.ticks < 1:
        print("fabricscope: error: --nodes must be at least 3 and --ticks at least 1; "
              "fix: e.g. --nodes 1000 --ticks 4", file=sys.stderr)
        return 2
    costs = measure(args.nodes, args.ticks)
    print(f"median of {len(costs)} ticks at {args.nodes} nodes: cpu "
          f"{statistics.median(c.cpu_s for c in costs):.3f} s, reads "
          f"{statistics.median(c.read_s for c in costs):.3f} s, gc "
          f"{statistics.median(c.gc_s for c in costs):.3f} s, influxd "
          f"{statistics.median(c.influx_s for c in costs):.2f} s, rows "
          f"{statistics.median(c.rows for c in costs):.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
