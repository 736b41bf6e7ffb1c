"""`fabricscope bench`: a round that fails ends in one line naming the cause, no traceback."""

from __future__ import annotations

import contextlib
import sys
import types

from fabricscope.bench import REGISTRY
from fabricscope.bench.harness import Benchmark
from fabricscope import cli


class _Failing:
    def baseline(self) -> float:
        return 1.0

    def subject(self) -> float:
        raise RuntimeError("the training ended after 12 steps: rank 1 exited 1")


@contextlib.contextmanager
def _environment(_args):
    yield _Failing()


def test_a_failing_round_is_one_line(monkeypatch, capsys):
    module = types.ModuleType("bench_failing_for_test")
    module.BENCH = Benchmark("failing", "fails in its first subject round", "s", "a", "b",
                             _environment, repeats=2)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(REGISTRY, "failing", module.__name__)
    assert cli.main(["bench", "failing"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("failing: round")]
    assert lines == ["fabricscope: error: benchmark failing failed: the training ended after 12 steps: "
                     "rank 1 exited 1; fix: rerun it; what it needs is in docs/PERFORMANCE.md"]
    assert "Traceback" not in err


def test_a_reader_that_goes_away_ends_output_quietly():
    # `fabricscope bench --list | head -1`: stdout's reader is gone before the write
    import os
    import subprocess
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "fabricscope", "bench", "--list"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


def test_the_paired_ratio_cancels_a_drift_the_medians_do_not():
    """A machine slowing down 2 % a round under a subject that costs exactly 5 %: the
    ratio of the medians is off by the drift, the paired ratio is not."""
    from fabricscope.bench import harness

    class Drifting:
        def __init__(self):
            self.t = 0

        def _tick(self, cost):
            self.t += 1
            return 1.0 * 1.02 ** self.t * cost

        def baseline(self):
            return self._tick(1.0)

        def subject(self):
            return self._tick(1.05)

    import contextlib
    bench = harness.Benchmark("drift", "", "s", "b", "s",
                              lambda _a: contextlib.nullcontext(Drifting()), repeats=8)
    result = harness.run(bench)
    assert abs(result.ratio - 1.05 * 1.02) < 1e-9            # one step of drift in it
    assert abs(result.paired_ratio - 1.05) < 1e-3
    lo, hi = result.paired_quartiles
    assert lo <= result.paired_ratio <= hi and hi - lo < 1e-3
    assert "paired ratio" in result.to_text()
    assert harness.paired_ratios([1.0, 3.0], [2.0, 4.0]) == [1.0, 4.0 / 3.0]


def test_every_registered_benchmark_loads_under_its_own_name():
    """`fabricscope bench NAME` runs the Benchmark the registry names, and that one says
    NAME (a renamed benchmark left under its old key would print another name)."""
    from fabricscope.bench.cli import _load
    for name in REGISTRY:
        bench = _load(name)
        # a ratio against a baseline, or a report of its own (diagnosis-matrix)
        assert isinstance(bench, Benchmark) or callable(getattr(bench, "report", None)), name
        assert bench.name == name
    assert _load("iperf3-overhead").subject_label == "agents, every probe"


def test_nic_parts_refuses_an_unknown_variant_in_one_line(capsys):
    from fabricscope.bench import nic_parts
    assert nic_parts.main(["--parts", "none,9,7"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--parts 9" in err and "Traceback" not in err
