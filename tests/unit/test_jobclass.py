"""fabricscope.jobclass over synthetic windows: each kind's loop, random arrivals,
mixes, and inputs that cannot be used."""

from __future__ import annotations

import random

import pytest

from fabricscope.jobclass import JobClass, Observation, OpFamily, classify, classify_windows
from fabricscope.records import Record

MS = 1_000_000


def loop(pattern, steps=30, step_ms=40.0, ranks=(0,), jitter=0.1, t0=0, seed=1):
    """A training loop: `pattern` ((op, bytes, offset_ms, duration_ms), ...) every step,
    the step's length jittered by +-jitter."""
    rng, out, t = random.Random(seed), [], t0
    for _ in range(steps):
        for rank in ranks:
            for op, size, off, dur in pattern:
                start = t + int(off * MS)
                out.append(Observation(op, size, start, start + int(dur * MS), rank=rank))
        t += int(step_ms * MS * (1 + rng.uniform(-jitter, jitter)))
    return out


def served(pattern, requests=60, rate=20.0, seed=2):
    """A server: requests arrive as a Poisson process and are served one at a time."""
    rng, out, arrival, free = random.Random(seed), [], 0.0, 0.0
    for _ in range(requests):
        arrival += rng.expovariate(rate) * 1e3            # ms
        begin = max(arrival, free)
        for op, size, off, dur in pattern:
            start = int((begin + off) * MS)
            out.append(Observation(op, size, start, start + int(dur * MS), rank=0))
        free = begin + max(off + dur for _, _, off, dur in pattern)
    return out


DDP = [("AllReduce", 1 << 20, 10, 2), ("AllReduce", 6 << 20, 13, 8)]
FSDP_GLOO = ([("AllGather", 1 << 20, 2 + 3 * i, 1.5) for i in range(4)]
             + [("AllGather", 1 << 20, 15 + 4 * i, 1.5) for i in range(4)]
             + [("AllReduce", 1 << 20, 16.5 + 4 * i, 2) for i in range(4)])
FSDP_NCCL = ([("AllGather", 1 << 20, 2 + 3 * i, 1.5) for i in range(4)]
             + [("AllGather", 1 << 20, 15 + 4 * i, 1.5) for i in range(4)]
             + [("ReduceScatter", 1 << 20, 16.5 + 4 * i, 2) for i in range(4)])
MOE = [(op, 64 << 10, off, 0.5) for off, op in ((2, "AlltoAll"), (4, "AlltoAllv"),
                                                 (6, "AlltoAllv"), (12, "AlltoAllv"),
                                                 (14, "AlltoAllv"))] + \
      [("AllReduce", 8 << 10, 20, 0.5)]
PIPELINE = [("Send", 32 << 10, 2 * i, 0.3) for i in range(4)] + \
           [("Recv", 32 << 10, 12 + 2 * i, 0.3) for i in range(4)]
SERVE_MOE = [("AlltoAll", 64, 0, 0.3), ("AlltoAllv", 64 << 10, 1, 0.5),
             ("AlltoAllv", 64 << 10, 3, 0.5)]
SERVE_PIPELINE = [("Send", 64 << 10, 0, 0.5), ("Recv", 64 << 10, 3, 0.5)]


@pytest.mark.parametrize("pattern, expected, per_step", [
    (DDP, JobClass.DATA_PARALLEL, 2), (FSDP_GLOO, JobClass.SHARDED, 12),
    (FSDP_NCCL, JobClass.SHARDED, 12), (MOE, JobClass.MOE_ALLTOALL, 6),
    (PIPELINE, JobClass.PIPELINE, 8)])
def test_each_training_loop_is_named_with_its_period_and_collectives_per_step(
        pattern, expected, per_step):
    result = classify(loop(pattern, step_ms=40))
    assert result.job_class is expected, result.reason
    assert result.collectives_per_step == per_step
    assert result.period_s == pytest.approx(0.040, rel=0.05)
    assert result.arrival_rate_per_s is None


def fsdp_layers(layers: int) -> list:
    """FSDP2 on gloo, a layer per unit: each layer gathered whole before its forward,
    again before its backward, and its gradient reduced (an AllReduce on gloo)."""
    return ([("AllGather", 128 << 10, 1 + 0.5 * i, 0.3) for i in range(layers)]
            + [(op, size, 1 + 0.5 * layers + 0.5 * i + 0.2 * k, 0.1)
               for i in range(layers)
               for k, (op, size) in enumerate((("AllGather", 128 << 10),
                                               ("AllReduce", 128 << 10)))])


@pytest.mark.parametrize("layers", [16, 48])
def test_a_sharded_step_whose_calls_repeat_layer_by_layer_is_one_step(layers):
    """Its backward pass repeats (AllGather, AllReduce) layer by layer, which matches
    all but twice a step one layer later: the step is the whole repeat, not a layer."""
    result = classify(loop(fsdp_layers(layers), step_ms=10 + layers))
    assert result.job_class is JobClass.SHARDED, result.reason
    assert result.collectives_per_step == 3 * layers
    assert result.period_s == pytest.approx((10 + layers) / 1000, rel=0.05)


def test_sharded_on_gloo_is_decided_by_the_allgather_share_of_bytes():
    result = classify(loop(FSDP_GLOO))
    assert result.mix[OpFamily.GATHER_SCATTER].bytes_share == pytest.approx(2 / 3)
    assert result.mix[OpFamily.ALLREDUCE].bytes_share == pytest.approx(1 / 3)
    assert "67%" in result.reason and "sharded" in result.reason


def test_a_moe_jobs_small_router_allreduce_does_not_make_it_data_parallel():
    result = classify(loop(MOE))
    assert result.mix[OpFamily.ALLREDUCE].count == 30
    assert result.mix[OpFamily.ALLTOALL].bytes_share > 0.9
    assert result.components == (JobClass.MOE_ALLTOALL, JobClass.DATA_PARALLEL)


@pytest.mark.parametrize("pattern", [SERVE_MOE, SERVE_PIPELINE])
def test_random_arrivals_without_gradient_reduction_are_inference_with_their_rate(pattern):
    result = classify(served(pattern, requests=80, rate=20.0))
    assert result.job_class is JobClass.INFERENCE, result.reason
    assert result.period_s is None and result.collectives_per_step is None
    assert result.arrival_rate_per_s == pytest.approx(20.0, rel=0.35)
    assert result.gap_spread > 0.8
    assert "arrivals/s" in result.reason


def test_a_pipeline_that_trains_on_a_clock_is_not_inference_though_it_reduces_nothing():
    result = classify(loop(PIPELINE, jitter=0.3))
    assert result.job_class is JobClass.PIPELINE
    assert result.gap_spread < 0.8


def test_no_family_with_most_bytes_is_mixed_and_names_both():
    result = classify(loop([("AllReduce", 1 << 20, 2, 2), ("AlltoAllv", 1 << 20, 8, 2)]))
    assert result.job_class is JobClass.MIXED
    assert set(result.components) == {JobClass.DATA_PARALLEL, JobClass.MOE_ALLTOALL}
    assert "50%" in result.reason


def test_message_sizes_are_reported_as_p50_and_p90():
    result = classify(loop(
                           [("AllReduce", s, i * 3, 1) for i, s in enumerate(
                               [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000])]))
    assert result.p50_bytes == pytest.approx(550)
    assert result.p90_bytes == pytest.approx(910)


def test_control_ops_are_in_the_mix_but_never_decide():
    obs = loop([("Broadcast", 64 << 20, 1, 5), ("Barrier", 0, 7, 1)], steps=10)
    result = classify(obs)
    assert result.job_class is JobClass.UNKNOWN
    assert result.mix[OpFamily.CONTROL].count == 20
    obs += loop(DDP, steps=10)
    assert classify(obs).job_class is JobClass.DATA_PARALLEL


def test_an_empty_window_is_unknown():
    result = classify([])
    assert result.job_class is JobClass.UNKNOWN and result.observations == 0


def test_unusable_observations_are_dropped_and_counted_by_cause():
    obs = loop(DDP, steps=10) + [
        Observation("AllToAllSomething", 10, 0, 1),
        Observation("AllReduce", -5, 0, 1),
        Observation("AllReduce", 10, 5, 1),
        Observation("AllReduce", 1.5, 0, 1)]
    result = classify(obs)
    assert result.dropped == {"unknown_op": 1, "bad_bytes": 2, "bad_window": 1}
    assert result.observations == 20
    assert result.job_class is JobClass.DATA_PARALLEL


def test_unknown_sizes_count_for_the_mix_by_count_and_still_give_a_class():
    obs = [Observation(o.op, None, o.start_ns, o.end_ns, o.rank) for o in loop(MOE)]
    result = classify(obs)
    assert result.job_class is JobClass.MOE_ALLTOALL
    assert result.p50_bytes is None
    assert result.mix[OpFamily.ALLTOALL].count_share == pytest.approx(5 / 6)


def test_a_job_that_changes_kind_midway_is_reclassified_in_the_next_window():
    first = loop(DDP, steps=25, step_ms=40)                     # 1 s of DDP
    second = loop(MOE, steps=33, step_ms=30, t0=1_000 * MS)     # then 1 s of MoE
    windows = classify_windows(first + second, window_s=1.0)
    assert [c.job_class for _, c in windows] == [JobClass.DATA_PARALLEL,
                                                  JobClass.MOE_ALLTOALL]


def test_a_gloo_collective_record_becomes_an_observation():
    from fabricscope.jobclass import observation_from_record
    rec = Record("gloo_collective", 1_000_000_000, {"op": "AlltoAllv", "rank": "2", "job": "j"},
                 {"seconds": 0.002, "bytes": 4096})
    obs = observation_from_record(rec)
    assert obs == Observation("AlltoAllv", 4096, 1_000_000_000, 1_002_000_000, rank=2)


def test_the_result_serialises_with_plain_names():
    d = classify(loop(DDP)).to_dict()
    assert d["class"] == "data_parallel" and d["mix"]["allreduce"]["bytes_share"] == 1.0


def test_a_training_loop_whose_short_steps_jitter_as_much_as_they_last_keeps_its_period():
    """DDP steps of ~10 ms on a busy host: the gaps between steps spread like random
    arrivals, but a job that reduces gradients trains, and its repeat is its step."""
    from fabricscope.jobclass import SPREAD_PERIODIC
    obs = loop([("AllReduce", 2 << 20, 1, 2)], steps=12, step_ms=10.0, jitter=0.9, seed=7)
    result = classify(obs)
    assert result.gap_spread > SPREAD_PERIODIC              # a clock test alone would fail
    assert result.job_class is JobClass.DATA_PARALLEL
    starts = sorted(o.start_ns for o in obs)
    assert result.period_s == pytest.approx((starts[-1] - starts[0]) / 11 / 1e9)
    assert result.collectives_per_step == 1 and result.arrival_rate_per_s is None


def pipeline(stages: int, micro=4, steps=12, step_ms=10.0, jitter=0.9, seed=7):
    """GPipe training over `stages` ranks: each micro-batch's input received from the
    stage before and its output sent on, then each one's gradient back over the same
    links; the step's length jittered by +-jitter (its calls take under a millisecond,
    so the steps never overlap)."""
    rng, out, t = random.Random(seed), [], 0
    for _ in range(steps):
        for r in range(stages):
            forward = ([("Recv", r - 1)] if r > 0 else []) + \
                ([("Send", r + 1)] if r < stages - 1 else [])
            backward = ([("Recv", r + 1)] if r < stages - 1 else []) + \
                ([("Send", r - 1)] if r > 0 else [])
            calls = forward * micro + backward * micro
            for i, (op, peer) in enumerate(calls):
                start = t + int((0.01 * r + 0.05 * i) * MS)
                out.append(Observation(op, 32 << 10, start, start + int(0.02 * MS), rank=r,
                                       peer=peer))
        t += int(step_ms * MS * (1 + rng.uniform(-jitter, jitter)))
    return out


def served_round(stages: int, requests=80, rate=20.0, seed=2):
    """A served pipeline: each request goes stage to stage and its answer from the last
    stage back to the first, one way round; requests arrive as a Poisson process."""
    rng, out, arrival = random.Random(seed), [], 0.0
    for _ in range(requests):
        arrival += rng.expovariate(rate) * 1e3            # ms
        for r in range(stages):
            ahead, behind = (r + 1) % stages, (r - 1) % stages
            calls = [("Send", ahead), ("Recv", behind)] if r == 0 else \
                [("Recv", behind), ("Send", ahead)]
            for i, (op, peer) in enumerate(calls):
                start = int((arrival + (stages if r == 0 and i else r) + 0.5 * i) * MS)
                out.append(Observation(op, 64 << 10, start, start + int(0.3 * MS), rank=r,
                                       peer=peer))
    return out


def test_a_pipeline_whose_short_steps_jitter_as_much_as_they_last_trains_by_its_backward_pass():
    """Its gradients come back over the links its activations went: a backward pass,
    so training, and its repeat is its step however the busy host spreads the gaps."""
    from fabricscope.jobclass import SPREAD_PERIODIC
    result = classify(pipeline(stages=3))
    assert result.gap_spread > SPREAD_PERIODIC              # a clock test alone would fail
    assert result.job_class is JobClass.PIPELINE, result.reason
    assert result.period_s is not None and result.arrival_rate_per_s is None


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_served_pipeline_whose_requests_go_one_way_round_stays_inference(stages):
    """With three stages or more its links carry data one way only. Two stages cannot
    be told from training by their links (the answer comes back over the one link), so
    the gaps' spread decides, as it does for any job without a backward pass."""
    result = classify(served_round(stages))
    assert result.job_class is JobClass.INFERENCE, result.reason
    assert result.period_s is None and result.arrival_rate_per_s


@pytest.mark.parametrize("buckets", [2, 3, 5])
def test_a_step_of_equal_gradient_buckets_is_one_step_not_one_per_bucket(buckets):
    """Equal AllReduces repeat within the step: the repeat is a bucket, and the step is
    found where the repeats' gaps alternate (short between buckets, long over compute)."""
    c = classify(loop([("AllReduce", 25 << 20, 10 + 3 * i, 2) for i in range(buckets)]))
    assert c.job_class is JobClass.DATA_PARALLEL
    assert c.period_s == pytest.approx(0.040, rel=0.05)
    assert c.collectives_per_step == buckets


@pytest.mark.parametrize("jitter", [0.3, 0.6, 0.9])
def test_a_jittery_loop_of_one_collective_per_step_keeps_its_step(jitter):
    """Independent gaps narrow by sqrt(m) when m are summed: no multiple is taken for a
    step on its own."""
    obs = loop([("AllReduce", 25 << 20, 10, 2)], steps=60, jitter=jitter, seed=3)
    c = classify(obs)
    assert c.collectives_per_step == 1
    starts = sorted(o.start_ns for o in obs)
    assert c.period_s == pytest.approx((starts[-1] - starts[0]) / 59 / 1e9)
