"""`fabricscope bench`: a round that fails ends in one line naming the cause, no traceback."""

from __future__ import annotations

import contextlib
import sys
import types

from bench import REGISTRY
from bench.harness import Benchmark
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
