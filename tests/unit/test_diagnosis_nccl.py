"""The diagnosis takes an NCCL job as it takes a gloo job: its steps from nccl_step, its
grad sync from the profiler plugin's kernel windows (ncclprof_collective), its rank
health from RAS (nccl_ras_rank), all read back from a real InfluxDB
(diagnosis/source.py) and judged by the same detectors."""

from __future__ import annotations

import pytest

from fabricscope.diagnosis.engine import JobEngine
from fabricscope.diagnosis.evidence import SECOND, StepSource
from fabricscope.diagnosis.finding import Finding, severity_rank
from fabricscope.diagnosis.jobclass import JobClassAnalyzer
from fabricscope.diagnosis.replay import replay
from fabricscope.diagnosis.source import Members, StoreSource
from fabricscope.diagnosis.store import Store
from fabricscope.services import InfluxServer
from tests.support.nccl_jobs import COMM, nccl_records, ras_poll
from tests.unit.test_diagnosis_evidence import T0, HopPlan, StepPlan, SynthJob, build

DB = "fabricscope"
FAULT = 25


def late_rank_2(i, t):
    """Rank 2 computes 3.5 s instead of 0.7 s from FAULT on; the others wait for it
    inside the collectives (their kernels spin until its data comes)."""
    if t < FAULT:
        return StepPlan(data_load=0.0)
    return StepPlan(seconds=3.8, sync=3.1, sync_of={"2": 0.3}, data_load=0.0)


def slowed_sync(i, t):
    return StepPlan(seconds=1.5, sync=0.8, data_load=0.0) if t >= FAULT \
        else StepPlan(data_load=0.0)


def lossy_port_1(s, src, dst):
    return HopPlan(loss=0.01 if s >= FAULT and 1 in (src, dst) else 0.0)


STRAGGLER = SynthJob(seconds=60, step=late_rank_2, job="nccl-straggler")
SLOW_LINK = SynthJob(seconds=60, step=slowed_sync, hop=lossy_port_1, job="nccl-slow-link")
UNPROFILED = SynthJob(seconds=60, step=late_rank_2, job="nccl-unprofiled")
BOTH = SynthJob(seconds=20, job="gloo-and-nccl")
HUNG = SynthJob(seconds=20, job="nccl-hung")
RECOVERED = SynthJob(seconds=20, job="nccl-recovered")


@pytest.fixture(scope="module")
def store():
    with InfluxServer() as influx:
        influx.query(f'CREATE DATABASE "{DB}"')
        s = Store(influx.url, DB)
        records = (nccl_records(build(STRAGGLER)) + nccl_records(build(SLOW_LINK))
                   + nccl_records(build(UNPROFILED), profiled=False)
                   + nccl_records(build(BOTH), with_gloo=True)
                   + nccl_records(build(HUNG)) + nccl_records(build(RECOVERED)))
        for spec, later in ((HUNG, {"1": "unresponsive"}), (RECOVERED, {})):
            records += ras_poll(spec.job, (T0 + 5) * SECOND, 3, {"1": "unresponsive"})
            records += ras_poll(spec.job, (T0 + 15) * SECOND, 3, later)
        s.write(records)
        yield s


def read(store: Store, spec: SynthJob):
    source = StoreSource(store)
    members = source.jobs(spec.t0_s * SECOND, spec.end_s * SECOND)[spec.job]
    return members, source.read(members, spec.t0_s * SECOND, spec.end_s * SECOND)


def diagnose(store: Store, spec: SynthJob) -> list[Finding]:
    _, ev = read(store, spec)
    return replay(JobEngine(spec.job), ev, spec.t0_s, spec.end_s + 5)


def serious(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if severity_rank(f.severity) >= 1]


def test_an_nccl_job_is_found_by_its_nccl_steps_with_its_ranks_nodes(store):
    members, ev = read(store, STRAGGLER)
    assert members == Members(STRAGGLER.job, {"0": "node0", "1": "node1", "2": "node2"},
                              StepSource.NCCL)
    assert ev.step_source() is StepSource.NCCL_PROFILED


def test_the_profilers_kernel_windows_are_each_steps_grad_sync(store):
    _, ev = read(store, STRAGGLER)
    truth = build(STRAGGLER)
    for rank, steps in truth.steps.items():
        back = ev.steps[rank]
        assert sorted(back) == sorted(steps)
        for t, step in steps.items():
            # the union of two overlapping windows, not their sum
            assert back[t].sync_seconds == pytest.approx(step.sync_seconds, abs=1e-6)
            assert back[t].seconds == step.seconds


def test_an_nccl_jobs_compute_straggler_is_named_with_the_profilers_evidence(store):
    findings = diagnose(store, STRAGGLER)
    assert [(f.cause, f.where) for f in serious(findings)] == [("straggler_compute",
                                                                "node2")]
    f = serious(findings)[0]
    assert f.place["rank"] == "2"
    assert [v["rank"] for v in f.victims] == ["0", "1"]
    assert {e.measurement for e in f.evidence} == {"ncclprof_collective"}


def test_an_nccl_jobs_slow_link_is_named_from_its_tcp_flows_as_a_gloo_jobs(store):
    findings = diagnose(store, SLOW_LINK)
    assert [(f.cause, f.where) for f in serious(findings)] == [("lossy_link", "node1")]
    f = serious(findings)[0]
    assert f.place["node"] == "node1" and f.place["rank"] == "1"
    assert "gloo_step" not in {e.measurement for g in findings for e in g.evidence
                               if g.cause != "lossy_link"}


def test_nccl_steps_without_the_profiler_name_no_straggler_they_cannot_see(store):
    _, ev = read(store, UNPROFILED)
    assert ev.step_source() is StepSource.NCCL
    assert all(s.sync_seconds == 0.0 for table in ev.steps.values() for s in table.values())
    findings = diagnose(store, UNPROFILED)
    assert "straggler_compute" not in {f.cause for f in findings}
    slow = [f for f in findings if f.cause == "unexplained_slowdown"]
    assert slow and {e.measurement for e in slow[0].evidence} == {"nccl_step"}


def test_a_job_with_gloo_and_nccl_steps_is_read_once_from_gloo(store):
    members, ev = read(store, BOTH)
    assert list(StoreSource(store).jobs(BOTH.t0_s * SECOND, BOTH.end_s * SECOND)).count(
        BOTH.job) == 1
    assert members.source is StepSource.GLOO
    assert ev.steps == build(BOTH).steps          # each step once, as gloo reported it
    assert ev.step_source() is StepSource.GLOO


def test_a_rank_ras_reports_unresponsive_is_a_telemetry_gap_at_its_node(store):
    _, ev = read(store, HUNG)
    engine = JobEngine(HUNG.job)
    engine.feed(ev)
    engine.evaluate(HUNG.end_s * SECOND)
    gaps = [f for f in engine.findings() if f.cause == "telemetry_gap"]
    assert [(f.where, f.place.get("rank")) for f in gaps] == [("node1", "1")]
    assert gaps[0].evidence[0].measurement == "nccl_ras_rank"
    assert f"communicator {COMM}" in gaps[0].summary and "unresponsive" in gaps[0].summary


def test_a_rank_a_later_ras_poll_no_longer_reports_gives_no_finding(store):
    _, ev = read(store, RECOVERED)
    assert ev.ras_polls == {COMM: (T0 + 15) * SECOND}
    engine = JobEngine(RECOVERED.job)
    engine.feed(ev)
    engine.evaluate(RECOVERED.end_s * SECOND)
    assert [f for f in engine.findings() if f.cause == "telemetry_gap"] == []


def test_the_job_class_analyzer_reads_an_nccl_jobs_class_from_the_profilers_collectives(
        store):
    now = (STRAGGLER.t0_s + 20) * SECOND
    records = JobClassAnalyzer(store).records([STRAGGLER.job], now)
    assert [r.tags["class"] for r in records] == ["data_parallel"]
    fields = records[0].fields
    assert fields["allreduce_bytes_share"] == 1.0 and fields["rows_dropped"] == 0
    assert fields["collectives_per_step"] == pytest.approx(2, abs=0.5)


def test_compare_takes_an_nccl_jobs_step_time_from_its_nccl_steps(store):
    """gloo_step cuts no step of an NCCL job: nccl_step does, and its step time is the
    question; the loop of its collectives is not asked for what the steps answer."""
    from fabricscope.diagnosis.compare import compare_samples, samples
    from fabricscope.diagnosis.timespan import Span
    t0 = STRAGGLER.t0_s * SECOND
    got = samples(store, STRAGGLER.job, Span(t0, t0 + FAULT * SECOND),
                  Span(t0 + FAULT * SECOND, STRAGGLER.end_s * SECOND))
    before, after = got["step_time"]
    assert len(before) >= 10 and len(after) >= 5 and min(after) > max(before)
    assert got["exchange_time"] == ([], [])
    verdicts = {r.metric: r.verdict for r in compare_samples(got)}
    assert verdicts["step_time"] == "worse"
