"""Every kind of lab job, run for real and seen by the gloo probe, is named by
fabricscope.jobclass from the gloo_collective records alone.

One 3-node lab and an agent per node (`fabricscope agent --probes gloo --output
jsonl` with the buffer hooks, in the node's namespace) for the module; the kinds run one after
another under it, each a few steps of a tiny model (DDP, MoE, FSDP, pipeline, then
MoE serving at 10 requests/s). Each test classifies the records inside one run's
time window. The pipeline's transfers reach the probe through ProcessGroupGloo's
send/recv hooks (agent/probes/gloo/layout.py P2P): its class and its slow stage
come from them (fabricscope.stagemodel).
"""

from __future__ import annotations

import contextlib
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
    # stage 1 holds 8x the layers: its imbalance costs far over a tenth of the step
    ("pipeline", "pipeline", 8, {"layers": 2, "slow_stage": 1, "stage_skew": 8.0}),
    # one MoE layer: its calls repeat once per request, so their rate is the requests'
    ("serve", "serve", 25, {"layers": 1, "rate": 10.0, "serve_mode": "moe"}),
)


@dataclass
class Runs:
    windows: dict[str, tuple[int, int]]     # name -> (first ns, last ns) of the run
    records: list
    agent_log: str
    stops: list[str]      # each agent's exit code and last log line: what it lost, if anything

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
    with running_lab(nodes=NODES) as lab, contextlib.ExitStack() as agents_up:
        agents = []
        for node in lab.nodes:
            out = tmp / node.name
            out.mkdir()
            agents.append(agents_up.enter_context(jsonl_agent(
                lab, node, out, "--probes", "gloo", "--gloo-buffer-hooks",
                attached="running probes: gloo")))
        for name, kind, steps, knobs in RUNS:
            began = time.time_ns()
            port = 29400 + (os.getpid() + len(windows)) % 500
            with start_training(lab, steps, model_mb=2, master_port=port, timeout_s=60,
                                kind=kind, knobs=knobs) as run:
                lines = list(run.steps())
                assert run.wait() == 0, run.error
            assert len(lines) == steps, (name, lines)
            windows[name] = (began, time.time_ns())
    logs = [agent.err_path.read_text() for agent in agents]
    return Runs(windows, [r for agent in agents for r in records(agent.out_path)],
                "\n".join(logs),
                [f"{node.name}: exit {agent.stopped_rc}: "
                 + (log.strip().splitlines() or ["(no log)"])[-1]
                 for node, agent, log in zip(lab.nodes, agents, logs)])


def test_every_agent_stops_cleanly_having_seen_its_rank_of_every_run(runs):
    """Each node hosts one rank of every run; its agent sees that rank's calls (the
    others' are foreign to it) and drains them at stop. A rank missing from a run's
    records is lost telemetry, whatever a test of the classes would make of it."""
    assert all(": exit 0: " in stop and "stopped;" in stop for stop in runs.stops), runs.stops
    seen = {name: {o.rank for o in runs.observations(name)} for name, *_ in RUNS}
    # on failure: every run's ranks, and what each agent counted (filtered, foreign, ...)
    said = "\n".join(line for line in runs.agent_log.splitlines()
                     if " counters: " in line or "another network namespace" in line)
    assert all(ranks == set(range(NODES)) for ranks in seen.values()), \
        f"ranks seen in each run: {seen}; the agents said:\n{said}"


@pytest.mark.parametrize("name, expected", [
    ("ddp", JobClass.DATA_PARALLEL), ("moe", JobClass.MOE_ALLTOALL),
    ("fsdp", JobClass.SHARDED), ("pipeline", JobClass.PIPELINE),
    ("serve", JobClass.INFERENCE)])
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


def test_the_pipeline_is_seen_by_its_sends_and_recvs_and_its_slow_stage_named(runs):
    """Stage 1 holds eight times the layers of the others (stage_skew 8.0): it
    computes the most, and the others wait for it in their transfers."""
    obs = runs.observations("pipeline")
    p2p = [o for o in obs if o.op in ("Send", "Recv")]
    assert p2p and all(o.bytes and o.peer is not None for o in p2p), runs.agent_log[-2000:]
    # stage r sends to r + 1 forward and r - 1 backward: its peers are its neighbours
    assert all(abs(o.peer - o.rank) == 1 for o in p2p)
    result = classify(obs)
    print(f"pipeline: {result.job_class.value}: {result.reason}")
    assert result.job_class is JobClass.PIPELINE, result.to_dict()
    assert result.stages is not None and result.stages.slow_stage == 1, \
        (result.to_dict(), runs.stops)


def test_a_job_that_changes_kind_is_reclassified_in_the_next_window(runs):
    """The DDP run, then the MoE run straight after it, as one stream: windows as long
    as from DDP's first collective to MoE's (so the second starts where the kind
    changes) name data parallel first and MoE after."""
    ddp, moe = runs.observations("ddp"), runs.observations("moe")
    first, switch = min(o.start_ns for o in ddp), min(o.start_ns for o in moe)
    windows = classify_windows(ddp + moe, window_s=(switch - first) / 1e9)
    assert [c.job_class for _, c in windows] == [JobClass.DATA_PARALLEL,
                                                  JobClass.MOE_ALLTOALL]



def test_moe_routing_skew_shows_as_a_hot_destination_in_the_all_to_all_bytes(runs):
    """skew 1.2 over 6 experts, two per rank: rank 0's experts draw two thirds of the
    tokens. An AlltoAll's size is what its rank receives, so in the exchanges that carry
    tokens to their experts (dispatch, and the combine's gradients) rank 0 receives two
    thirds, and in those that return them (combine, dispatch's gradients) each rank its
    own third: rank 0 receives about half of all, 1.5x the mean."""
    result = classify(runs.observations("moe"))
    m = result.alltoall
    print(f"moe: {m.reason if m else None}")
    assert m is not None and m.hot_rank == 0, result.to_dict()
    assert m.imbalance == pytest.approx(1.5, rel=0.2), m.to_dict()


def test_each_served_request_is_timed_from_its_collectives(runs):
    """25 requests, the first and last cut off by the window's ends at most."""
    result = classify(runs.observations("serve"))
    print(f"serve: {result.reason}")
    m = result.requests
    assert m is not None and 20 <= len(m.requests) <= 25, result.to_dict()
    assert 0 < m.p50_s <= m.p99_s < 1.0
