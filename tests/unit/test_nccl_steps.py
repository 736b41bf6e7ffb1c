"""Steps from NCCL calls (agent/probes/nccl/steps.py) on synthetic call sequences: DDP's
AllReduce buckets, FSDP's per-layer AllGather/ReduceScatter, one call per step, a
changed layout, and the nccl_step records with the process's job tags."""

import random

import pytest

from fabricscope.agent.probes.callseq import FALLBACK_CALLS, find_pattern
from fabricscope.agent.probes.nccl.steps import Call, CallSteps, StepRecords
from fabricscope.records import Record
from fabricscope.schema import validate
from tests.unit.test_ncclprof_probe import FakeProc

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
MB = 1 << 20


def ddp(steps, buckets=(25 * MB,) * 4, bucket_gap=5 * MS, step_gap=60 * MS, jitter=0.0,
        t0=T0, seed=1):
    """A DDP rank: parameter broadcast at construction, then per step the forward pass
    (step_gap) and one AllReduce per bucket during backward (bucket_gap apart)."""
    rnd = random.Random(seed)
    calls, t = [Call(t0, "Broadcast", "0x1", 100 * MB)], t0
    for _ in range(steps):
        t += int(step_gap * (1 + jitter * rnd.uniform(-1, 1)))
        for i, size in enumerate(buckets):
            if i:
                t += int(bucket_gap * (1 + jitter * rnd.uniform(-1, 1)))
            calls.append(Call(t, "AllReduce", "0x1", size))
    return calls


def fsdp(steps, layers=6, layer_bytes=8 * MB, fwd_gap=3 * MS, bwd_gap=4 * MS,
         step_gap=30 * MS):
    """An FSDP (ZeRO-3) rank: per layer an AllGather forward; backward an AllGather and
    a ReduceScatter per layer, in reverse."""
    calls, t = [], T0
    for _ in range(steps):
        t += step_gap
        for i in range(layers):
            t += fwd_gap if i else 0
            calls.append(Call(t, "AllGather", "0x2", layer_bytes))
        for _ in range(layers):
            t += bwd_gap
            calls.append(Call(t, "AllGather", "0x2", layer_bytes))
            t += MS
            calls.append(Call(t, "ReduceScatter", "0x2", layer_bytes))
    return calls


def run(calls, chunk=7):
    """Feed the calls a poll's worth at a time."""
    tracker, out = CallSteps(), []
    for i in range(0, len(calls), chunk):
        out += tracker.feed(calls[i:i + chunk])
    return tracker, out


def test_ddp_equal_buckets_make_one_step_of_all_buckets_not_one_per_bucket():
    tracker, steps = run(ddp(10))
    assert [s.collectives for s in steps] == [4] * len(steps) and len(steps) >= 7
    assert all(s.bytes == 100 * MB for s in steps)
    period = (60 + 3 * 5) * MS / 1e9
    assert all(s.seconds == pytest.approx(period) for s in steps)
    assert all(s.calls_seconds == pytest.approx(15 * MS / 1e9) for s in steps)
    assert [s.index for s in steps] == list(range(len(steps)))
    # each step starts at its first bucket: the call after the long pause
    assert all((s.start_ns - T0 - 60 * MS) % int(period * 1e9) == 0 for s in steps)


def test_ddp_with_jittery_pauses_still_cuts_at_the_forward_pass():
    _, steps = run(ddp(12, buckets=(MB, 25 * MB, 25 * MB, 9 * MB), jitter=0.3))
    assert len(steps) >= 9 and {s.collectives for s in steps} == {4}
    assert {s.bytes for s in steps} == {60 * MB}


def test_fsdp_layers_make_one_step_of_every_allgather_and_reducescatter():
    _, steps = run(fsdp(8), chunk=11)
    assert len(steps) >= 5 and {s.collectives for s in steps} == {18}
    assert {s.bytes for s in steps} == {18 * 8 * MB}
    period = (30 + 5 * 3 + 6 * 5) * MS / 1e9
    assert all(s.seconds == pytest.approx(period) for s in steps)


def test_one_allreduce_per_step_with_even_pauses_is_a_step_each():
    # a run of equal, evenly paced calls is also how a longer step's phase begins (an
    # FSDP forward pass): one call per step is taken after FALLBACK_CALLS of them
    calls = [Call(T0 + i * 50 * MS, "AllReduce", "0x1", 4 * MB)
             for i in range(FALLBACK_CALLS + 10)]
    assert find_pattern(calls[:FALLBACK_CALLS - 1], fresh=True) is None
    _, steps = run(calls)
    assert len(steps) == FALLBACK_CALLS + 9 and all(s.collectives == 1 for s in steps)
    assert all(s.seconds == pytest.approx(0.05) for s in steps)


@pytest.mark.parametrize("layers", [6, 16, 32])
@pytest.mark.parametrize("chunk", [1, 7, 11])
def test_an_fsdp_step_is_found_whole_however_its_calls_arrive(layers, chunk):
    # its forward gathers, then its backward's gather and reduce-scatter pairs, each
    # repeat within the step before the step repeats: neither is taken for the step
    tracker, steps = run(fsdp(10, layers=layers), chunk=chunk)
    assert len(steps) >= 6 and {s.collectives for s in steps} == {3 * layers}
    assert tracker.resyncs == 0


def test_no_step_is_claimed_before_the_sequence_repeated_three_times():
    assert find_pattern(ddp(2)) is None
    _, steps = run(ddp(2))
    assert steps == []


def test_calls_that_never_repeat_yield_no_steps():
    rnd = random.Random(3)
    calls = [Call(T0 + i * MS, "AlltoAll", "0x3", rnd.randrange(1, 10**9)) for i in range(200)]
    tracker, steps = run(calls)
    assert steps == [] and tracker.template is None


def test_a_changed_bucket_layout_is_found_again_and_counted():
    before = ddp(6)
    after = ddp(8, buckets=(30 * MB, 30 * MB, 40 * MB), t0=before[-1].ts_ns + 10 * MS)[1:]
    tracker, steps = run(before + after)
    assert tracker.resyncs == 1
    sizes = [s.collectives for s in steps]
    assert 4 in sizes and sizes[-1] == 3 and sizes == sorted(sizes, reverse=True)
    assert [s.index for s in steps] == list(range(len(steps)))


def call_record(pid, ts, op="AllReduce", size=25 * MB, ret=0):
    return Record("nccl_call", ts, {"op": op, "pid": str(pid), "timing": "enqueue",
                                    "comm": "0x55"},
                  {"api": f"nccl{op}", "bytes": size, "size_bytes": size, "ret": ret,
                   "seq": 1, "tid": pid})


def test_step_records_carry_the_process_job_and_rank_and_skip_other_nodes(tmp_path):
    proc = FakeProc(tmp_path)
    proc.add(100, b"RANK=2\0FABRICSCOPE_JOB=llm\0")
    proc.add(200, local=False)
    steps = StepRecords(proc.table())
    calls = ddp(6)[1:]
    out = []
    for i in range(0, len(calls), 5):
        batch = [call_record(100, c.ts_ns) for c in calls[i:i + 5]]
        batch += [call_record(200, c.ts_ns) for c in calls[i:i + 5]]
        batch.append(call_record(100, calls[i].ts_ns, op="GroupStart"))     # not a step call
        batch.append(call_record(100, calls[i].ts_ns + 1, ret=4))            # failed: ignored
        out += steps.feed(batch)
    assert out and all(r.measurement == "nccl_step" for r in out)
    for r in out:
        validate(Record(r.measurement, r.time_ns, {**r.tags, "node": "n0"}, r.fields))
    assert out[0].tags == {"job": "llm", "rank": "2"}
    assert out[0].fields["collectives"] == 4 and out[0].fields["pid"] == 100
    assert steps.stats()["step_calls_foreign"] == len(calls)


def test_an_exited_process_is_forgotten_and_its_open_step_counted(tmp_path):
    proc = FakeProc(tmp_path)
    proc.add(100)
    steps = StepRecords(proc.table())
    assert steps.feed([call_record(100, c.ts_ns) for c in ddp(5)[1:]])
    proc.kill(100)
    assert steps.feed([]) == []
    assert steps.stats()["steps_unterminated"] == 1
