"""The gloo probe in the lab: a real 3-rank DDP run over gloo, one agent on node 0.

One lab and one training run for the module (they cost ~20 s of this 2-core box);
each test asserts one property of what the agent of node 0 reported. The step
time the traffic model's period must match (5 %) is the mean of the training's
own step markers over the same steps: on a machine oversubscribed several times
over, step times jitter by +-50 % with a long tail, and medians of the same steps
timed at different points (marker, first AllReduce, burst onset) drifted apart by
up to 8 %, while means over a span differ only by the jitter at its two ends. The
agent is
the real `fabricscope agent --probes gloo --output jsonl`, started in node 0's
network namespace, so the other two ranks (same kernel, same libtorch file, other
namespaces) must not appear in its records.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from fabricscope import schema, trafficmodel
from fabricscope.lab.stack import await_condition
from fabricscope.records import Record

STEPS = 60
MODEL_MB = 8
NODES = 3
# Each poll reports the step in progress (gloo_progress). 60 steps of this model take
# 2-3 s here, so at the default 1 s a run held as few as two reports; at 0.1 s even a
# run ten times faster holds enough to test.
POLL_S = 0.1


@dataclass
class Run:
    records: list[Record]
    step_lines: list[dict]
    param_bytes: int
    job: str
    agent_stderr: str

    def of(self, measurement: str, **tags) -> list[Record]:
        """This run's records of a measurement: the agent traces every process on the
        host that maps libtorch, so another lab's training at the same time is in
        its output too, under its own job."""
        return [r for r in self.records if r.measurement == measurement
                and r.tags.get("job", self.job) == self.job
                and all(r.tags.get(k) == v for k, v in tags.items())]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    # every gloo hook, the UnboundBuffer ones too (off by default): all the fields
    return collect(tmp_path_factory.mktemp("gloo"), extra_agent_args=("--gloo-buffer-hooks",))


def collect(tmp: Path, steps: int = STEPS, extra_agent_args: tuple = (),
            cpu_pct: float | None = None) -> Run:
    """Lab up, agent on node 0, DDP for `steps` steps, agent stopped, lab down; with
    cpu_pct, node 0's ranks get that share of a CPU from the start (lab fault cpu)."""
    from fabricscope.lab.running import running_lab
    from fabricscope.lab.training import mlp_shape, param_bytes, start_training
    from tests.kernel.jsonl_agent import jsonl_agent, records

    with running_lab(nodes=NODES) as lab:
        node = lab.nodes[0]
        if cpu_pct is not None:
            from fabricscope.lab import faults
            if not node.cgroup:
                pytest.skip("the host has no cgroup hierarchy with the cpu controller")
            faults.cpu(lab, 0, cpu_pct)
        with jsonl_agent(lab, node, tmp, "--probes", "gloo,markers", "--poll-interval-s",
                         str(POLL_S), "--gloo-model-interval-s", "1", "--gloo-model-window-s", "60",
                         *extra_agent_args, attached="running probes: gloo, markers") as agent:
            job = f"{node.address}:{29400 + os.getpid() % 500}"
            with start_training(lab, steps, model_mb=MODEL_MB,
                                master_port=int(job.rsplit(":", 1)[1])) as training:
                lines = list(training.steps())
                assert training.wait() == 0, training.error
            # the last step is flushed when the agent sees rank 0's process gone
            await_condition(lambda: any(r.measurement == "gloo_step" and "seconds" not in r.fields
                               for r in records(agent.out_path)), 60, "the last step")
    width, layers = mlp_shape(MODEL_MB)
    return Run(records(agent.out_path), lines, param_bytes(width, layers), job,
               agent.err_path.read_text())


def test_every_record_matches_the_schema(run):
    assert run.records, run.agent_stderr[-2000:]
    for r in run.records:
        schema.validate(r)
    assert {r.measurement for r in run.records} >= {"gloo_collective", "gloo_step",
                                                    "gloo_phase", "traffic_model", "train_step"}


def test_only_the_local_rank_is_reported(run):
    colls = run.of("gloo_collective")
    assert {r.tags["rank"] for r in colls} == {"0"}
    assert {r.tags["job"] for r in colls} == {run.job}
    assert len({r.fields["pid"] for r in colls}) == 1
    assert {r.fields["comm_rank"] for r in colls} == {0}
    assert {r.fields["nranks"] for r in colls} == {NODES}


def test_initial_parameter_broadcast(run):
    (phase,) = run.of("gloo_phase", phase="param_broadcast")
    assert phase.fields["step"] == -1
    broadcasts = [r for r in run.of("gloo_collective", op="Broadcast")
                  if r.time_ns <= phase.time_ns + int(phase.fields["seconds"] * 1e9)]
    # DDP broadcasts all parameters from rank 0 at construction (one coalesced bucket)
    assert run.param_bytes in [r.fields["bytes"] for r in broadcasts]
    big = next(r for r in broadcasts if r.fields["bytes"] == run.param_bytes)
    assert big.fields["bytes_source"] == "options"
    # rank 0 is the root: it sends, in gloo's tree, the whole buffer to each child
    assert big.fields["sent_bytes"] > 0 and big.fields["sent_bytes"] % run.param_bytes == 0


def test_allreduce_sizes_come_from_the_options_and_match_the_ring(run):
    allreduces = run.of("gloo_collective", op="AllReduce")
    assert len(allreduces) >= STEPS
    for r in allreduces:
        assert r.fields["bytes_source"] == "options"
        assert r.fields["bytes"] % 4 == 0                  # float32 gradients
        assert r.fields["busbw_gbs"] == pytest.approx(
            r.fields["algbw_gbs"] * 2 * (NODES - 1) / NODES)
        # gloo's ring sends 2(n-1) chunks of S/n (rounded to segments): the ring model
        assert r.fields["wire_efficiency"] == pytest.approx(1.0, rel=0.01)


def ddp_buckets(param_bytes: list[int], caps: list[int]) -> list[int]:
    """DDP's bucketing rule (reducer.cpp compute_bucket_assignment_by_size): parameters
    in reverse order fill a bucket until it reaches its cap; the first bucket's cap is
    caps[0], later ones the last cap."""
    out, cur = [], 0
    for size in reversed(param_bytes):
        cur += size
        if cur >= caps[min(len(out), len(caps) - 1)]:
            out.append(cur)
            cur = 0
    return out + ([cur] if cur else [])


def test_gradient_buckets_follow_ddp_bucketing(run):
    from fabricscope.lab.training import mlp_shape
    width, layers = mlp_shape(MODEL_MB)
    params = [n for _ in range(layers) for n in (width * width * 4, width * 4)]  # W, b
    # step 0: construction-time buckets (25 MiB cap); from step 1: rebuilt with the
    # 1 MiB first bucket (torch.distributed _DEFAULT_FIRST_BUCKET_BYTES)
    initial = ddp_buckets(params, [25 * 2**20])
    rebuilt = ddp_buckets(params, [2**20, 25 * 2**20])
    sizes = [r.fields["bytes"] for r in sorted(run.of("gloo_collective", op="AllReduce"),
                                               key=lambda r: r.time_ns)]
    assert sorted(sizes[:len(initial)]) == sorted(initial)
    rest = sizes[len(initial):]
    assert len(rest) == len(rebuilt) * (STEPS - 1)
    assert sorted(set(rest)) == sorted(set(rebuilt))
    steps = sorted(run.of("gloo_step"), key=lambda r: r.fields["step"])
    assert steps[0].fields["buckets"] == len(initial)
    assert {r.fields["buckets"] for r in steps[1:]} == {len(rebuilt)}


def test_each_step_allreduces_the_gradient_bytes_once(run):
    steps = sorted(run.of("gloo_step"), key=lambda r: r.fields["step"])
    assert len(steps) >= STEPS - 1
    assert [r.fields["step"] for r in steps] == list(range(len(steps)))
    for r in steps:
        assert r.fields["bytes"] == run.param_bytes      # every parameter has a gradient
        assert 0 < r.fields["sync_seconds"]
    allreduce_bytes = sum(r.fields["bytes"] for r in run.of("gloo_collective", op="AllReduce"))
    assert allreduce_bytes == run.param_bytes * STEPS


def test_grad_sync_and_compute_phases_split_each_step(run):
    steps = {r.fields["step"]: r for r in run.of("gloo_step") if "seconds" in r.fields}
    sync = {r.fields["step"]: r for r in run.of("gloo_phase", phase="grad_sync")}
    compute = {r.fields["step"]: r for r in run.of("gloo_phase", phase="compute")}
    assert steps and set(steps) <= set(sync) and set(steps) == set(compute)
    for i, s in steps.items():
        assert sync[i].fields["seconds"] + compute[i].fields["seconds"] == \
            pytest.approx(s.fields["seconds"])


def test_the_step_in_progress_is_reported_as_its_step_is_later(run):
    """gloo_progress: each report stands at the start of a step reported afterwards
    (the step it was in), with that step's index, and what it says so far is no more
    than the step's own; but for the step a rank was in when the run's records were
    taken (after its last step: no gloo_step closes it while the process lives on)."""
    steps = {r.time_ns: r for r in run.of("gloo_step")}
    last = {}
    for r in run.of("gloo_step"):
        last[r.tags["rank"]] = max(last.get(r.tags["rank"], -1), r.fields["step"])
    reports = run.of("gloo_progress")
    assert len(reports) >= 3, run.agent_stderr[-2000:]
    for r in reports:
        s = steps.get(r.time_ns)
        if s is None and r.fields["step"] > last.get(r.tags["rank"], -1):
            continue                    # the step it is in, never closed in this run
        assert s is not None and s.fields["step"] == r.fields["step"], r
        if "seconds" in s.fields:
            assert r.fields["seconds"] <= s.fields["seconds"] + 1e-9, (r, s)
            assert r.fields["sync_seconds"] <= s.fields["sync_seconds"] + 1e-9, (r, s)
        assert r.fields["seconds"] == pytest.approx(r.fields["sync_seconds"]
                                                    + r.fields["compute_seconds"])
        assert r.fields.get("throttled_seconds", 0.0) >= 0


def test_inferred_step_time_matches_the_markers(run):
    # the same steps timed at different points (first AllReduce / step marker): over
    # a span, their sums differ only by the jitter at its two ends
    inferred = {r.fields["step"]: r.fields["seconds"] for r in run.of("gloo_step")
                if "seconds" in r.fields}
    marked = {r.fields["step"]: r.fields["seconds"] for r in run.of("train_step", rank="0")}
    span = range(2, STEPS - 1)
    assert sum(inferred[i] for i in span) == pytest.approx(sum(marked[i] for i in span),
                                                           rel=0.05)
    # the trainer times less than a whole step (not its print, marker, loop): shorter
    trainer = statistics.median(line["seconds"] for line in run.step_lines[2:])
    assert trainer <= marker_step_time(run) * 1.02


def marker_step_time(run: Run) -> float:
    """Median step time as the training marks it (train_step: marker to next marker),
    after DDP's first two steps (bucket rebuild)."""
    steps = sorted(run.of("train_step", rank="0"), key=lambda r: r.fields["step"])
    assert [r.fields["step"] for r in steps] == list(range(STEPS))
    return statistics.median(r.fields["seconds"] for r in steps[2:])


def test_sync_period_from_traffic_agrees_with_the_mean_step_time(run):
    # The series runs from step 2's marker (DDP rebuilds its buckets in steps 0 and 1) to
    # the last step's end: it starts in the silence before step 2's first burst, so its
    # onsets are those of steps 2 .. STEPS-1, and T is their mean interval; the markers'
    # mean over the same intervals is that of steps 2 .. STEPS-2. Timed at different
    # points of each step, the two differ only by how far each end's burst lies from its
    # marker, over STEPS-3 steps, however much the steps themselves jitter.
    marks = sorted(run.of("train_step", rank="0"), key=lambda r: r.fields["step"])
    assert [r.fields["step"] for r in marks] == list(range(STEPS))
    windows = [(r.time_ns / 1e9, r.time_ns / 1e9 + r.fields["seconds"], r.fields["sent_bytes"])
               for r in run.of("gloo_collective") if r.fields["sent_bytes"]]
    t0 = marks[2].time_ns / 1e9
    t1 = marks[-1].time_ns / 1e9 + marks[-1].fields["seconds"]
    series = trafficmodel.series_from_windows(windows, t0, t1, 0.001)
    model = trafficmodel.fit(series, 0.001)
    mean_step = statistics.mean(r.fields["seconds"] for r in marks[2:-1])
    print(f"period {model.period_s * 1e3:.2f} ms, markers' mean step {mean_step * 1e3:.2f} ms "
          f"({model.period_s / mean_step - 1:+.2%})")
    assert model.period_s == pytest.approx(mean_step, rel=0.05), (model, mean_step)
    assert 0 < model.duty_cycle < 1


def test_traffic_model_records(run):
    models = [r for r in run.of("traffic_model") if "period_s" in r.fields]
    assert models, "no traffic_model record with a period"
    last = models[-1]
    # The agent's last model came at a rescan while the training lived, at the end of
    # the run or before it: its series ran from the first AllReduce (the whole run fits
    # in the 60 s window) for window_s (its end within the last 1 ms bin), and its onsets
    # are those of the steps begun inside it (the first burst, at the series' start, has
    # none). The markers' mean over the same steps is the reference, whatever the span.
    t0 = min(r.time_ns for r in run.of("gloo_collective", op="AllReduce")
             if r.fields["sent_bytes"])
    assert last.time_ns - t0 < 60e9, "the run outgrew the model's window"
    t1 = t0 + int((last.fields["window_s"] - 0.001) * 1e9)
    marks = sorted(run.of("train_step", rank="0"), key=lambda r: r.fields["step"])
    inside = [m for m in marks if t0 <= m.time_ns <= t1]
    assert len(inside) >= trafficmodel.MIN_ONSETS, (last.fields, len(inside))
    mean_step = (inside[-1].time_ns - inside[0].time_ns) / 1e9 / (len(inside) - 1)
    print(f"last traffic_model record: period {last.fields['period_s'] * 1e3:.2f} ms over "
          f"steps {inside[0].fields['step']}..{inside[-1].fields['step']}, markers' mean "
          f"{mean_step * 1e3:.2f} ms ({last.fields['period_s'] / mean_step - 1:+.2%})")
    assert last.fields["period_s"] == pytest.approx(mean_step, rel=0.10)
    # B comes from the NIC's 100 us peaks inside the collectives: this agent runs no nic
    # probe, so B is left out rather than quoted from an average
    assert "burst_bytes_per_s" not in last.fields


def test_without_the_buffer_hooks_collectives_and_steps_remain(tmp_path):
    """The default (a run of its own): no UnboundBuffer uprobes, so the
    collectives' sizes come from their options only; steps, phases and step bytes are
    unchanged, the payload fields are left out instead of written as zeros, and the
    traffic model is fitted to the ring's bytes by the message sizes (series gloo_ring)."""
    steps_run = 12
    run = collect(tmp_path, steps=steps_run)
    allreduces = run.of("gloo_collective", op="AllReduce")
    assert allreduces, run.agent_stderr[-2000:]
    assert all(r.fields["bytes_source"] == "options" for r in allreduces)
    assert sum(r.fields["bytes"] for r in allreduces) == run.param_bytes * steps_run
    steps = run.of("gloo_step")
    assert len(steps) >= steps_run - 1
    assert all(r.fields["bytes"] == run.param_bytes for r in steps)
    payload = {"sent_bytes", "recv_bytes", "sends", "wire_efficiency"}
    assert not [r for r in run.of("gloo_collective") + steps if payload & set(r.fields)]
    assert run.of("gloo_phase", phase="grad_sync")
    models = run.of("traffic_model")
    assert models and {m.tags["series"] for m in models} == {"gloo_ring"}
    for r in run.records:
        schema.validate(r)


def after_first_sample(steps: list[Record]) -> list[Record]:
    """The steps from the first that carries its cgroup's throttled time on, which
    must be every one after it: the cgroup is sampled from the poll that read the
    process's first collective on, so only the steps of that first poll began
    before any sample (how many those are depends on the machine's speed)."""
    steps = sorted(steps, key=lambda r: r.time_ns)
    first = next((i for i, r in enumerate(steps) if "throttled_seconds" in r.fields), None)
    return [] if first is None else steps[first:]


def test_every_step_carries_its_cgroups_throttled_time(run):
    """Unlimited (the module's run): the rank's cgroup is read, and never throttled."""
    timed = [r for r in run.of("gloo_step") if "seconds" in r.fields]
    later = after_first_sample(timed)
    assert later and all("throttled_seconds" in r.fields for r in later), run.agent_stderr[-2000:]
    assert {r.fields["throttled_seconds"] for r in later} == {0.0}
    assert not [r for r in timed if "cpu_limit" in r.fields]


def test_a_rank_under_a_cpu_quota_reports_its_throttled_time_and_the_limit(tmp_path):
    """Node 0's ranks at 10 % of a CPU (a run of its own): each step says how long the
    kernel held its cgroup off the CPU, and the quota. 10 %, not more: a quota
    throttles only a rank that wants more CPU than it allows, and on two busy cores
    three ranks, their agents and the collector leave each rank not much more than a
    quarter of a CPU; at 30 % a run on a loaded machine was throttled in fewer than
    half its steps. A DDP step's compute wants far more than 10 ms of every 100 ms."""
    run = collect(tmp_path, steps=40, cpu_pct=10)
    later = after_first_sample([r for r in run.of("gloo_step") if "seconds" in r.fields])
    assert later and all("throttled_seconds" in r.fields for r in later), run.agent_stderr[-2000:]
    assert {r.fields["cpu_limit"] for r in later} == {0.1}
    assert {r.fields["cpu_limit_held"] for r in later} == {True}     # set before the run
    # how long it is held off depends on how much CPU a step wants on this machine,
    # so only that it is held off in most steps is asserted
    throttled = [r.fields["throttled_seconds"] for r in later]
    assert statistics.median(throttled) > 0, throttled
    for r in run.records:
        schema.validate(r)
