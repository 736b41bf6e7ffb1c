"""marker-cost: what one fabricscope.markers call costs a training loop.

Subject: ns per `markers.step(n)` (a clock read and a 64-byte struct write into the
process's mmap ring, see fabricscope/markers.py). Baseline: ns per call of an
empty Python function taking the same argument, in the same loop: the floor any
Python-level API pays. Extra figures: ns per `with markers.phase(...)` block (two
ring entries) and the marker's own cost above the baseline. Goal: <= 2 us per call.

Runs in the benchmark's process with FABRICSCOPE_MARKERS_DIR pointed at a
temporary directory (removed afterwards), unless this process already writes a
ring (then that one is used: the cost is the same). `--steps N` sets the calls
per round (default 200000).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time

from fabricscope.bench.harness import Benchmark

DEFAULT_CALLS = 200_000


def _noop(n):   # the baseline: an empty call with one argument
    return None


class _Sides:
    def __init__(self, calls: int):
        from fabricscope import markers
        self.markers = markers
        self.calls = calls

    def _per_call_ns(self, fn) -> float:
        calls = self.calls
        start = time.perf_counter_ns()
        for i in range(calls):
            fn(i)
        return (time.perf_counter_ns() - start) / calls

    def baseline(self) -> float:
        return self._per_call_ns(_noop)

    def subject(self) -> float:
        return self._per_call_ns(self.markers.step)

    def extra(self) -> dict[str, float]:
        phase = self.markers.phase
        calls = max(1, self.calls // 4)
        start = time.perf_counter_ns()
        for _ in range(calls):
            with phase("bench"):
                pass
        phase_ns = (time.perf_counter_ns() - start) / calls
        return {"phase_block_ns": phase_ns,
                "step_above_call_ns": self.subject() - self.baseline()}


@contextlib.contextmanager
def environment(args):
    calls = getattr(args, "steps", None) or DEFAULT_CALLS
    directory = tempfile.mkdtemp(prefix="fabricscope-marker-cost-")
    previous = os.environ.get("FABRICSCOPE_MARKERS_DIR")
    os.environ["FABRICSCOPE_MARKERS_DIR"] = directory
    try:
        yield _Sides(calls)
    finally:
        if previous is None:
            os.environ.pop("FABRICSCOPE_MARKERS_DIR", None)
        else:
            os.environ["FABRICSCOPE_MARKERS_DIR"] = previous
        shutil.rmtree(directory, ignore_errors=True)


BENCH = Benchmark(
    name="marker-cost",
    description="ns per fabricscope.markers.step() call / per empty Python call",
    unit="ns/call",
    baseline_label="empty function call",
    subject_label="markers.step(n)",
    environment=environment,
    repeats=5,
    goal="subject median <= 2000 ns",
)
