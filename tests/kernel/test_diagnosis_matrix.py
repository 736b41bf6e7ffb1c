"""Acceptance of the diagnosis: every scenario of the matrix once, in one real lab.

bench/scenarios.py runs each scenario as a training job of its own in a 4-node,
2-ToR lab with two collector replicas (the agents split between them), switches
its faults on after the job's baseline, and judges only what the live engine
wrote to InfluxDB: the primary finding (highest severity, ties by impact) must
be the fault's cause at the fault's place, every fault of the scenario must be
found, no warning may name anything else (one that the right finding took over,
`superseded_by`: the fault localized again, or a slowdown explained since, is
counted as moved), and a healthy job gets no warning at all. How fast (onset to
first_seen) is measured by `fabricscope bench diagnosis-matrix`, not asserted here.
"""

from __future__ import annotations

import random

import pytest

from bench.scenarios import NAMES, draw, run_scenario, running_bench

pytestmark = pytest.mark.root

SEED = 20261201


@pytest.fixture(scope="module")
def outcomes():
    rng = random.Random(SEED)
    with running_bench(replicas=2) as bench:
        yield {name: run_scenario(bench, draw(name, rng)) for name in NAMES}


def describe(out) -> str:
    return (f"{out.scenario} ({out.params}): expected {out.expected}, found "
            f"{[(f['cause'], f['where'], f['severity']) for f in out.found]}, false alarms "
            f"{out.false_alarms}, moved {out.moved}, latency_s {out.latency_s}, "
            f"step-time compare {out.compare.get('step_time')}, error {out.error!r}"
            # what each warning said, and when: a failure's only trace in a CI log
            + "".join(f"\n  {f['cause']} at {f['where']}: first seen {f['first_seen_s']} s, "
                      f"end {f['end_s']} s, superseded by {f['superseded_by']}: {f['summary']}"
                      for f in out.found if f["severity"] != "info"))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "healthy"])
def test_the_fault_is_named_with_its_cause_and_place(outcomes, name):
    out = outcomes[name]
    print(describe(out))     # with -rA the log keeps each run's figures
    assert not out.error, describe(out)
    assert out.all_found and out.primary_ok, describe(out)
    assert out.false_alarms == [], describe(out)


def test_a_healthy_job_gets_no_warning_and_compare_sees_no_change(outcomes):
    out = outcomes["healthy"]
    print(describe(out))
    assert not out.error, describe(out)
    assert [f for f in out.found if f["severity"] != "info"] == [], describe(out)
    # the job against itself (bench/scenarios._null_compare): both windows span the
    # run, so a change of the shared machine's pace cannot make a verdict here
    verdicts = {m: v["verdict"] for m, v in out.compare.items()}
    assert set(verdicts.values()) <= {"no change", "insufficient"}, out.compare
    assert verdicts["step_time"] == "no change", out.compare["step_time"]


def test_a_cleared_fault_ends_and_compare_around_the_clearing_says_better(outcomes):
    out = outcomes["cleared"]
    print(describe(out))
    assert out.end_after_clear_s is not None, describe(out)
    step = out.compare["step_time"]
    assert step["verdict"] == "better" and step["p_holm"] < 0.05, out.compare
