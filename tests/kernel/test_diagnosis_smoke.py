"""The diagnosis end to end, live: an unmistakable fault is named, a healthy job is not.

One real lab (4 nodes on 2 ToRs, two collector replicas: the agents split between
them), real DDP over gloo, real agents, InfluxDB and the collectors' live engines
(bench/scenarios.py runs the jobs and judges what the engine wrote). Two jobs:
nothing wrong, then 3 % random loss on one node's port from step 14. Only
unmistakable cases are asserted here, so that only a defect fails this test: the
healthy job raises no warning, and the loss is the primary finding, at its port.
Then a MoE job whose hot experts sit on one rank (bench/class_matrix.py): the skew
is named at that rank, and nothing else is.
How often the engine is right on drawn faults, how many other warnings it raises
and how fast, is measured by `fabricscope bench diagnosis-matrix`, and the
engine's findings on recorded runs of every cause are held exact by
tests/unit/test_diagnosis_corpus.py.
"""

from __future__ import annotations

import pytest

from fabricscope.bench.class_matrix import ClassRun, run_class
from fabricscope.bench.scenario_space import Drawn, Element, Fault, FaultKind, LabShape
from fabricscope.bench.scenarios import run_scenario, running_bench

pytestmark = pytest.mark.root

LAB = LabShape(nodes=4, tors=2, model_mb=8)


@pytest.fixture(scope="module")
def bench():
    with running_bench(LAB, replicas=2) as b:
        yield b


def describe(out) -> str:
    return (f"{out.params}: cost {out.cost}, primary {out.primary}, found "
            f"{[(f['cause'], f['where'], f['severity'], f['first_seen_s']) for f in out.found]}"
            f", false alarms {out.false_alarms}, moved {out.moved}, error {out.error!r}")


def test_a_healthy_job_gets_no_warning(bench):
    out = run_scenario(bench, Drawn(0, "healthy", LAB, onset_step=14, fault_steps=12))
    assert not out.error, describe(out)
    assert [f for f in out.found if f["severity"] != "info"] == [], describe(out)


def test_random_loss_on_a_port_is_named_a_lossy_link_there(bench):
    loss = Fault(FaultKind.LOSS, Element.PORT, "node2", 3.0)
    out = run_scenario(bench, Drawn(0, "loss", LAB, (loss,), onset_step=14, fault_steps=16))
    print(describe(out))
    assert not out.error, describe(out)
    assert out.cost is not None and out.cost >= 0.1, describe(out)   # it is a fault to find
    # named, with its cause and place, and as the primary finding; a warning elsewhere
    # (a straggler named after the loss cleared, in one fresh-clone run) is a matter of
    # the engine's precision, which the diagnosis matrix measures, not of this test
    assert out.primary_ok and out.all_found, describe(out)


def test_a_moe_jobs_hot_experts_are_an_all_to_all_skew_at_their_rank(bench):
    """Routing skew 1.5 over 8 experts, the hottest two on rank 3: rank 3 receives about
    half of the all-to-all bytes, 1.9x the mean, which costs a quarter of the step."""
    run = ClassRun(0, "moe", LabShape(4, 2, 2), False, {"layers": 2, "skew": 1.5,
                                                        "hot_rank": 3}, 3)
    out = run_class(bench, run)
    print(out)
    assert out.ok, out
