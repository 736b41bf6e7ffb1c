"""A process's CPU cgroup, its quota and its throttling (fabricscope/cgroupcpu.py), and
the per-step throttled time the gloo probe derives from polled samples
(agent/probes/gloo/records.CpuSamples)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from fabricscope.agent.probes.gloo.procs import describe
from fabricscope.agent.probes.gloo.records import CPU_SAMPLE_S, CpuSamples, ProcessState
from fabricscope.agent.probes.gloo.steps import Step
from fabricscope import cgroupcpu
from fabricscope.cgroupcpu import CgroupCpu, CpuHierarchy
from fabricscope.lineschema import canonical_line

V1 = """12:memory:/kubepods/pod1
3:cpu,cpuacct:/kubepods/burstable/pod1/abc
0::/
"""
V2 = "0::/kubepods.slice/pod1.slice/cri-abc.scope\n"


def test_the_process_cgroup_is_the_cpu_controllers_line():
    assert cgroupcpu.process_cgroup(V1, 1) == "/kubepods/burstable/pod1/abc"
    assert cgroupcpu.process_cgroup(V1, 2) == "/"
    assert cgroupcpu.process_cgroup(V2, 2) == "/kubepods.slice/pod1.slice/cri-abc.scope"
    assert cgroupcpu.process_cgroup(V2, 1) is None
    assert cgroupcpu.process_cgroup("", 2) is None
    # seen from a private cgroup namespace: not placeable in the reader's mount
    assert cgroupcpu.process_cgroup("0::/../../kubepods.slice/pod2.slice\n", 2) is None


def test_cpu_stat_and_the_quota_of_either_version():
    v1 = cgroupcpu.parse_stat("nr_periods 10\nnr_throttled 9\nthrottled_time 5000\n")
    v2 = cgroupcpu.parse_stat("usage_usec 70\nnr_periods 10\nnr_throttled 9\n"
                              "throttled_usec 5\nnr_bursts 0\n")
    assert cgroupcpu.throttled_ns(v1) == 5000 and cgroupcpu.throttled_ns(v2) == 5000
    assert cgroupcpu.throttled_ns({"nr_periods": 3}) is None
    assert cgroupcpu.parse_limit("10000 100000\n", None, None) == 0.1
    assert cgroupcpu.parse_limit("max 100000\n", None, None) is None
    assert cgroupcpu.parse_limit(None, "250000\n", "100000\n") == 2.5
    assert cgroupcpu.parse_limit(None, "-1\n", "100000\n") is None
    assert cgroupcpu.parse_limit("garbage", None, None) is None
    assert cgroupcpu.parse_limit(None, None, None) is None


@pytest.mark.parametrize("version", [1, 2])
def test_a_process_cgroup_is_read_from_its_files(tmp_path: Path, version: int):
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(V1 if version == 1 else V2)
    path = cgroupcpu.process_cgroup(V1 if version == 1 else V2, version)
    cg = tmp_path / "cg" / path.lstrip("/")
    cg.mkdir(parents=True)
    if version == 1:
        (cg / "cpu.stat").write_text("nr_periods 4\nnr_throttled 3\nthrottled_time 7000\n")
        (cg / "cpu.cfs_quota_us").write_text("10000\n")
        (cg / "cpu.cfs_period_us").write_text("100000\n")
    else:
        (cg / "cpu.stat").write_text("nr_periods 4\nnr_throttled 3\nthrottled_usec 7\n")
        (cg / "cpu.max").write_text("10000 100000\n")
    h = CpuHierarchy(version, str(tmp_path / "cg"))
    reader = CgroupCpu.of_process(h, 42, str(proc))
    assert (reader.throttled_ns(), reader.limit_cpus()) == (7000, 0.1)
    assert CgroupCpu.of_process(h, 43, str(proc)) is None          # gone
    assert CgroupCpu.of_process(None, 42, str(proc)) is None       # no cpu hierarchy
    (cg / "cpu.stat").unlink()
    assert reader.throttled_ns() is None                           # the cgroup went away


class CpuSample(NamedTuple):
    """What one read of a cgroup gives: its throttled time and its quota."""

    throttled_ns: int
    limit_cpus: float | None


class FakeCgroup:
    """A cgroup whose reads give these samples in turn (None: the read failed)."""

    def __init__(self, samples):
        self.samples = list(samples)
        self.limit = None

    def throttled_ns(self):
        s = self.samples.pop(0)
        self.limit = s.limit_cpus if s is not None else None
        return s.throttled_ns if s is not None else None

    def limit_cpus(self):
        return self.limit


def test_a_steps_throttled_time_is_interpolated_between_samples():
    # samples at 0, 1, 2 s; 0.5 s throttled per second from 1 s on
    samples = CpuSamples(FakeCgroup([CpuSample(0, 0.1), CpuSample(0, 0.1),
                                     CpuSample(500_000_000, 0.1), None]))
    for t in (0, 1, 2, 3):
        samples.sample(t * 1_000_000_000)          # the last read failed: no sample
    span = samples.span(500_000_000, 1_500_000_000)
    assert span.throttled_s == pytest.approx(0.25) and span.limit_cpus == 0.1
    assert samples.span(0, 2_000_000_000).throttled_s == pytest.approx(0.5)
    assert samples.span(1_000_000_000, 2_000_000_000).throttled_s == pytest.approx(0.5)
    assert samples.span(1_000_000_000, 2_500_000_000) is None        # past the last sample
    assert CpuSamples(FakeCgroup([])).span(0, 1) is None


def test_steps_a_quota_throttles_on_and_off_stay_apart_at_the_sampling_period():
    """A quota on every other 0.4 s step (as the alerting lab's jitter phase sets it),
    sampled every CPU_SAMPLE_S: the unthrottled steps get at most a sample period's
    share of their neighbours' throttling."""
    step_ns, period = 400_000_000, int(CPU_SAMPLE_S * 1e9)

    def throttled_at(t):          # 70 % throttled while an even step runs
        whole, part = divmod(t, 2 * step_ns)
        return int(0.7 * (whole * step_ns + min(part, step_ns)))
    times = range(0, 8 * step_ns + period, period)
    samples = CpuSamples(FakeCgroup([CpuSample(throttled_at(t), 0.05) for t in times]))
    for t in times:
        samples.sample(t)
    spans = [samples.span(i * step_ns + 7_000_000, (i + 1) * step_ns + 7_000_000).throttled_s
             for i in range(7)]
    assert all(x == pytest.approx(0.28, abs=0.01) for x in spans[0::2])
    assert all(x < 0.7 * CPU_SAMPLE_S for x in spans[1::2])


def test_a_quota_changed_between_two_steps_shows_on_each():
    """The alerting lab's jitter phase: a quota on every other 0.4 s step, lifted on the
    ones between, set once a step has ended. Each step carries the quota at its own
    end, and whether it held from its start: neighbouring steps never show one
    standing limit (diagnosis/detect_steps._starved)."""
    step_ns, period = 400_000_000, int(CPU_SAMPLE_S * 1e9)
    times = range(0, 6 * step_ns + period, period)
    # the sample at a step boundary still shows the quota before it
    samples = CpuSamples(FakeCgroup([CpuSample(0, None if ((t - 1) // step_ns) % 2 else 0.05)
                                     for t in times]))
    for t in times:
        samples.sample(t)
    spans = [samples.span(i * step_ns + 1_000_000, (i + 1) * step_ns - 1_000_000)
             for i in range(5)]
    assert [(s.limit_cpus, s.limit_held) for s in spans] == [(0.05, True), (None, True)] * 2 \
        + [(0.05, True)]
    # a step that ended after the boundary's sample: the next quota was set before the
    # sample after its end, which shows it; the step's own first sample showed its own
    late = [samples.span(i * step_ns + 1_000_000, (i + 1) * step_ns + 1_000_000)
            for i in range(5)]
    assert [(s.limit_cpus, s.limit_held) for s in late] == [(None, False), (0.05, False)] * 2 \
        + [(None, False)]


def test_a_step_record_carries_its_throttled_time_and_the_quota():
    info = describe(7, {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "198.18.0.1",
                        "MASTER_PORT": "29500"}, True)
    cpu = CpuSamples(FakeCgroup([CpuSample(0, 0.25), CpuSample(800_000_000, 0.25)]))
    state = ProcessState(info, 10.0, cpu=cpu)
    cpu.sample(0)
    cpu.sample(2_000_000_000)
    step = Step(0, 500_000_000, 1.0, 0.4, 1, 1000, 1000)
    (record,) = state._records([step], [], lambda ns: ns)
    assert record.fields["throttled_seconds"] == pytest.approx(0.4)
    assert record.fields["cpu_limit"] == 0.25 and record.fields["cpu_limit_held"] is True
    canonical_line(record)                                        # valid against the schema
    last = Step(1, 1_500_000_000, None, 0.4, 1, 1000, 1000)        # no length: no share
    (record,) = state._records([last], [], lambda ns: ns)
    assert "throttled_seconds" not in record.fields
