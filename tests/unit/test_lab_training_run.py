"""fabricscope.lab.training.TrainingRun: how it judges the ranks' exits (no root, no torch)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from fabricscope.lab.train_worker import TRAINED
from fabricscope.lab.training import TrainingRun


def _run(tmp_path, bodies: list[str]) -> TrainingRun:
    nodes = [SimpleNamespace(dir=str(tmp_path / f"node{i}"), name=f"node{i}")
             for i in range(len(bodies))]
    argv = [[sys.executable, "-c", body] for body in bodies]
    run = TrainingRun(SimpleNamespace(nodes=nodes), argv, [None] * len(bodies), timeout_s=60)
    run.wait(60)
    return run


TRAINED_THEN_ABORT = (f"import os, sys; print({TRAINED!r}, file=sys.stderr, flush=True); "
                      "os.abort()")


def test_an_abort_in_teardown_after_every_rank_trained_is_a_finished_run(tmp_path):
    run = _run(tmp_path, ['print(\'{"step": 0, "seconds": 0.1}\', flush=True)',
                          TRAINED_THEN_ABORT])
    assert (run.returncode, run.error) == (0, None)
    assert [r["step"] for r in run.records] == [0]
    (abort,) = run.teardown_aborts
    assert "rank 1 (node1) was killed by SIGABRT" in abort


def test_an_abort_before_the_ranks_trained_is_a_failure(tmp_path):
    run = _run(tmp_path, ["import time; time.sleep(30)", "import os; os.abort()"])
    assert run.returncode != 0
    assert run.error and "rank 1 (node1) was killed by SIGABRT" in run.error
    assert run.teardown_aborts == []
