"""Every kind of lab job, run for real and seen by the gloo probe, is named by
fabricscope.jobclass from the gloo_collective records alone.

One 3-node lab and one agent (`fabricscope agent --probes gloo --output jsonl` with
the buffer hooks, in node 0's namespace) for the module; the kinds run one after
another under it, each a few steps of a tiny model (DDP, MoE, FSDP, pipeline, then
MoE serving at 10 requests/s). Each test classifies the records inside one run's
time window. The gloo probe hooks gloo's collectives only: a pipeline's send/recv
reach it as nothing but a counter (agent/probes/gloo/layout.py has no Send/Recv
entry), so the pipeline run leaves no exchange to classify.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabricscope.jobclass import JobClass, classify, classify_windows, observation_from_record

pytestmark = pytest.mark.root

NODES = 3
RUNS = (  # name, kind, steps (requests for serve), knobs
    ("ddp", "ddp", 12, None),
    ("moe", "moe", 12, {"layers": 2, "skew": 1.2}),
    ("fsdp", "fsdp", 10, {"layers": 3}),
    ("pipeline", "pipeline", 8, {"layers": 1, "slow_stage": 1, "stage_skew": 2.0}),
    # one MoE layer: its calls repeat once per request, so their rate is the requests'
    ("serve", "serve", 25, {"layers": 1, "rate": 10.0, "serve_mode": "moe"}),
)


@dataclass
class Runs:
    windows: dict[str, tuple[int, int]]     # name -> (first ns, last ns) of the run
    records: list
    agent_log: str

    def observations(self, name: str):
        lo, hi = self.windows[name]
        return [observation_from_record(r) for r in self.records
                if r.measurement == "gloo_collective" and lo <= r.time_ns <= hi]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import start_training
    from tests.kernel.jsonl_agent import jsonl_agent, records
    tmp: Path = tmp_path_factory.mktemp("kinds")
    windows = {}
    with running_lab(nodes=NODES) as lab:
        with jsonl_agent(lab, lab.nodes[0], tmp, "--probes", "gloo", "--gloo-buffer-hooks",
                         attached="running probes: gloo") as agent:
            for name, kind, steps, knobs in RUNS:
                began = time.time_ns()
                port = 29400 + (os.getpid() + len(windows)) % 500
                with start_training(lab, steps, model_mb=2, master_port=port, timeout_s=60,
                                    kind=kind, knobs=knobs) as run:
                    lines = list(run.steps())
                    assert run.wait() == 0, run.error
                assert len(lines) == steps, (name, lines)
                windows[name] = (began, time.time_ns())
    return Runs(windows, records(agent.out_path), agent.err_path.read_text())


@pytest.mark.parametrize("name, expected", [
    ("ddp", JobClass.DATA_PARALLEL), ("moe", JobClass.MOE_ALLTOALL),
    ("fsdp", JobClass.SHARDED), ("serve", JobClass.INFERENCE)])
def test_each_kind_is_named_from_its_gloo_collectives(runs, name, expected):
    obs = runs.observations(name)
    assert obs, runs.agent_log[-2000:]
    result = classify(obs)
    print(f"{name}: {result.job_class.value}: {result.reason}")
    assert result.job_class is expected, result.to_dict()
    assert not result.dropped


def test_training_kinds_report_a_period_and_collectives_per_step(runs):
    for name in ("ddp", "moe", "fsdp"):
        result = classify(runs.observations(name))
        assert result.period_s and result.period_s > 0, (name, result.to_dict())
        assert result.collectives_per_step >= 1, (name, result.to_dict())


def test_serving_reports_the_arrival_rate_of_its_schedule(runs):
    """The rate the seeded Poisson schedule realised over these few requests (not the
    asked 10/s, which 25 draws only approach)."""
    from fabricscope.lab.workloads.serve import arrivals
    _, _, requests, knobs = RUNS[-1]
    due = arrivals(knobs["rate"], requests)
    realised = (requests - 1) / (due[-1] - due[0])
    result = classify(runs.observations("serve"))
    assert result.arrival_rate_per_s == pytest.approx(realised, rel=0.15), result.to_dict()


def test_fsdp_shows_its_reduce_scatter_as_gloos_allreduce(runs):
    ops = {o.op for o in runs.observations("fsdp")}
    assert {"AllGather", "AllReduce"} <= ops and "ReduceScatter" not in ops


def test_the_pipelines_send_and_recv_are_not_seen_by_the_gloo_probe(runs):
    obs = runs.observations("pipeline")
    assert {o.op for o in obs} <= {"Barrier", "Broadcast"}
    assert classify(obs).job_class is JobClass.UNKNOWN


def test_a_job_that_changes_kind_is_reclassified_in_the_next_window(runs):
    """The DDP run, then the MoE run straight after it, as one stream: windows as long
    as from DDP's first collective to MoE's (so the second starts where the kind
    changes) name data parallel first and MoE after."""
    ddp, moe = runs.observations("ddp"), runs.observations("moe")
    first, switch = min(o.start_ns for o in ddp), min(o.start_ns for o in moe)
    windows = classify_windows(ddp + moe, window_s=(switch - first) / 1e9)
    assert [c.job_class for _, c in windows] == [JobClass.DATA_PARALLEL,
                                                  JobClass.MOE_ALLTOALL]
