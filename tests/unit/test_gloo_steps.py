"""agent/probes/gloo/steps.py: steps and phases from collective windows (no root).

Sequences are built like the real ones: DDP's step 0 with its initial buckets,
then rebuilt buckets that overlap on ProcessGroupGloo's two worker threads, or
buckets separated by backward compute.
"""

from __future__ import annotations

import itertools

import pytest

from fabricscope.agent.probes.gloo.layout import Collective
from fabricscope.agent.probes.gloo.steps import (FALLBACK_BURSTS, StepTracker, candidates,
                                     choose_step_bytes, partition)

MS = 1_000_000
_tid = itertools.count(100)


def coll(op: str, start_ms: float, end_ms: float, nbytes: int, sent: int | None = None):
    return Collective(pid=1, tid=next(_tid), op=op, model=None if op == "Barrier" else op,
                      start_ns=int(start_ms * MS), end_ns=int(end_ms * MS), nranks=3, rank=0,
                      bytes=nbytes, bytes_source="options",
                      sent_bytes=sent if sent is not None else nbytes * 4 // 3,
                      recv_bytes=0, sends=1, recvs=1)


def feed(tracker: StepTracker, colls, shuffle_returns: bool = True):
    steps, phases = [], []
    # events arrive in return order, not start order
    for c in sorted(colls, key=lambda c: c.end_ns) if shuffle_returns else colls:
        s, p = tracker.add(c)
        steps += s
        phases += p
    s, p = tracker.flush()
    return steps + s, phases + p


def ddp_run(steps: int, grad: int = 8_396_800, overlap: bool = True, period: float = 50.0):
    """Init collectives, step 0 with one bucket, then two buckets per step."""
    out = [coll("AllGather", 0, 2, 24), coll("Broadcast", 3, 10, grad)]
    t = 20.0
    out.append(coll("AllReduce", t + 5, t + 30, grad))
    for _ in range(1, steps):
        t += period
        if overlap:
            out += [coll("AllReduce", t + 5, t + 30, grad // 2),
                    coll("AllReduce", t + 6, t + 31, grad // 2)]
        else:
            out += [coll("AllReduce", t + 5, t + 15, grad // 2),
                    coll("AllReduce", t + 17, t + 27, grad // 2)]
    out.append(coll("Barrier", t + 40, t + 41, 0))
    return out


def test_partition():
    assert partition([8, 4, 4, 4, 4], 8) == [0, 1, 3]
    assert partition([8, 4, 4, 4], 8) == [0, 1, 3]        # last group in progress
    assert partition([8, 4, 5], 8) is None
    assert partition([], 8) == [0]


@pytest.mark.parametrize("overlap", [True, False])
def test_ddp_steps_carry_the_gradient_bytes_once(overlap):
    steps, phases = feed(StepTracker(), ddp_run(10, overlap=overlap))
    assert [s.index for s in steps] == list(range(10))
    assert {s.bytes for s in steps} == {8_396_800}
    assert [s.buckets for s in steps] == [1] + [2] * 9
    assert [s.seconds for s in steps[1:-1]] == pytest.approx([0.050] * 8)
    assert steps[-1].seconds is None                       # the last step has no end
    assert steps[0].start_ns == 25 * MS


def test_overlapping_buckets_sync_is_the_union():
    steps, _ = feed(StepTracker(), ddp_run(4, overlap=True))
    assert steps[2].sync_seconds == pytest.approx(0.026)   # [5, 31] ms, not 25 + 25
    steps, _ = feed(StepTracker(), ddp_run(4, overlap=False))
    assert steps[2].sync_seconds == pytest.approx(0.020)   # two windows of 10 ms


def test_phases():
    steps, phases = feed(StepTracker(), ddp_run(5))
    (init,) = [p for p in phases if p.name == "param_broadcast"]
    assert (init.step, init.collectives, init.bytes) == (-1, 2, 8_396_800 + 24)
    assert init.seconds == pytest.approx(0.010)
    sync = {p.step: p for p in phases if p.name == "grad_sync"}
    compute = {p.step: p for p in phases if p.name == "compute"}
    assert set(sync) == set(range(5)) and set(compute) == set(range(4))
    for s in steps[:-1]:
        assert sync[s.index].seconds + compute[s.index].seconds == pytest.approx(s.seconds)
        assert compute[s.index].seconds == pytest.approx(s.compute_seconds)


def test_equal_buckets_split_by_gaps_not_by_size():
    # every bucket 4 MB, not overlapping: sizes alone would make each bucket a step;
    # the long gaps (forward + optimizer) separate steps, the short ones buckets
    colls, t = [], 0.0
    for _ in range(8):
        colls += [coll("AllReduce", t, t + 10, 4), coll("AllReduce", t + 12, t + 22, 4)]
        t += 60
    steps, _ = feed(StepTracker(), colls)
    assert [s.buckets for s in steps] == [2] * 8
    assert [s.seconds for s in steps[:-1]] == pytest.approx([0.060] * 7)


def test_one_bucket_per_step():
    colls = [coll("AllReduce", 40 * i, 40 * i + 10, 4) for i in range(6)]
    steps, _ = feed(StepTracker(), colls)
    assert [s.buckets for s in steps] == [1] * 6


def test_no_steps_until_two_groups_are_seen():
    tracker = StepTracker()
    assert tracker.add(coll("AllReduce", 0, 10, 8)) == ([], [])
    assert tracker.add(coll("AllReduce", 50, 60, 8)) == ([], [])
    assert tracker.add(coll("AllReduce", 100, 110, 8)) == ([], [])
    # three gaps, all alike: one burst per step; each step ends where the next starts
    steps, _ = tracker.add(coll("AllReduce", 150, 160, 8))
    assert [s.index for s in steps] == [0, 1, 2]
    assert [s.seconds for s in steps] == pytest.approx([0.050] * 3)


def test_candidates():
    found = candidates([8, 4, 4, 8, 4, 4])
    assert [(c.total, c.complete, c.single()) for c in found] == \
        [(8, 4, False), (12, 2, False), (16, 2, False)]
    assert [c.total for c in candidates([4, 4, 4, 4])] == [4, 8]
    assert candidates([4, 4, 4, 4])[0].single()
    assert FALLBACK_BURSTS > 4


def test_choose_step_bytes_needs_a_consistent_cut():
    tracker = StepTracker()
    for c in [coll("AllReduce", 0, 10, 8), coll("AllReduce", 50, 60, 3),
              coll("AllReduce", 100, 110, 7)]:
        tracker.add(c)
    assert choose_step_bytes(tracker.bursts) is None


def test_a_changed_gradient_size_resyncs():
    colls = [coll("AllReduce", 40 * i, 40 * i + 10, 8) for i in range(5)]
    colls += [coll("AllReduce", 40 * i, 40 * i + 10, 12) for i in range(5, 12)]
    tracker = StepTracker()
    steps, _ = feed(tracker, colls)
    assert tracker.resyncs == 1 and tracker.skipped == 1
    assert [s.bytes for s in steps] == [8] * 4 + [12] * 7


def test_ddp_parameter_broadcast_names_the_step_bytes_early():
    # equal non-overlapping buckets with irregular gaps: only the hint decides
    colls = [coll("Broadcast", 0, 5, 8)]
    gaps = [3, 30, 9, 25, 4, 31]
    t = 10.0
    for g in gaps:
        colls.append(coll("AllReduce", t, t + 10, 4))
        t += 10 + g
    tracker = StepTracker()
    tracker.add(colls[0])
    out = []
    for c in colls[1:]:
        out += tracker.add(c)[0]
    assert tracker.step_bytes == 8
    assert [s.buckets for s in out] == [2, 2]


def test_noisy_gaps_wait_then_fall_back_to_the_smallest_total():
    tracker = StepTracker()
    t, out = 0.0, []
    # long gaps at no regular position: no grouping of the equal buckets is clean
    gaps = [5, 40, 5, 5, 40, 40, 5, 5, 5, 40, 5, 40, 40, 5, 5, 40, 5]
    first_at = None
    for n, g in enumerate(gaps, start=1):
        out += tracker.add(coll("AllReduce", t, t + 10, 4))[0]
        if out and first_at is None:
            first_at = n
        t += 10 + g
    assert tracker.step_bytes == 4
    assert first_at == FALLBACK_BURSTS              # undecided until then
    assert len(out) == len(gaps) - 1 and all(s.buckets == 1 for s in out)


def test_non_allreduce_after_init_and_empty_allreduce_are_ignored():
    tracker = StepTracker()
    steps, phases = feed(tracker, [coll("AllReduce", 0, 1, 0), coll("Broadcast", 5, 6, 8)])
    assert steps == [] and phases == []


def test_the_next_steps_allreduce_in_flight_closes_the_last_step_at_its_start():
    """The probe sees the next step's first AllReduce in flight (the BPF `active` map)
    before it returns: the last step ends at its entry, and is emitted then, with the
    length its return would have given it; the steps after are unchanged."""
    colls = sorted(ddp_run(6, overlap=False), key=lambda c: c.end_ns)
    held = StepTracker()
    seen = []
    for c in colls:
        if c.op == "AllReduce" and held.step_bytes is not None:
            early, _ = held.next_started(c.start_ns)
            seen += early
            assert held.next_started(c.start_ns) == ([], [])      # once only
        seen += held.add(c)[0]
    seen += held.flush()[0]
    plain, _ = feed(StepTracker(), colls, shuffle_returns=False)
    assert [(s.index, s.start_ns, s.seconds, s.sync_seconds) for s in seen] == \
        [(s.index, s.start_ns, s.seconds, s.sync_seconds) for s in plain]
    assert held.late == 0 and held.resyncs == 0


def test_an_allreduce_in_flight_inside_the_last_steps_burst_or_an_unfinished_step_closes_nothing():
    t = StepTracker()
    feed_some = sorted(ddp_run(4, overlap=False), key=lambda c: c.end_ns)[:-2]  # step 3 half in
    for c in feed_some:
        t.add(c)
    assert t.step_bytes is not None
    assert t.next_started(t.bursts[-1].end_ns + 10 * MS) == ([], [])     # step 3 not whole
    t.add(sorted(ddp_run(4, overlap=False), key=lambda c: c.end_ns)[-2])
    end = t.bursts[-1].end_ns
    assert t.next_started(end + 100_000) == ([], [])                    # within merge gap
    steps, phases = t.next_started(end + 5 * MS)
    assert [s.index for s in steps] == [3] and steps[0].seconds is not None
    assert {p.name for p in phases} == {"grad_sync", "compute"}


def test_the_step_in_progress_is_known_while_it_runs():
    """Between its steps' ends the probe reports the step a process is in
    (gloo_progress): computing since its last AllReduce returned, or inside one; each
    value so far."""
    colls = [c for c in sorted(ddp_run(4, overlap=False), key=lambda c: c.end_ns)
             if c.op == "AllReduce"]
    t = StepTracker()
    assert t.open_step(0, None) is None                       # no steps known yet
    for c in colls[:-1]:                                      # step 3's second bucket out
        t.add(c)
    assert t.step_bytes is not None
    # step 3 (from 175 ms): its first bucket 175-185 ms, the second in flight since 187
    o = t.open_step(190 * MS, 187 * MS)
    assert (o.index, o.start_ns, o.waiting) == (3, 175 * MS, True)
    assert (o.seconds, o.sync_seconds) == pytest.approx((0.015, 0.013))
    t.add(colls[-1])                                          # 187-197 ms: step 3 whole
    o = t.open_step(230 * MS, None)
    assert (o.index, o.start_ns, o.waiting) == (3, 175 * MS, False)
    assert (o.seconds, o.sync_seconds, o.compute_seconds) == pytest.approx((0.055, 0.020, 0.035))
    # the next step's first AllReduce in flight since 225 ms closes step 3: the
    # process is inside step 4's first AllReduce, waiting since then
    assert [s.index for s in t.next_started(225 * MS)[0]] == [3]
    o = t.open_step(240 * MS, 225 * MS)
    assert (o.index, o.start_ns, o.waiting) == (4, 225 * MS, True)
    assert (o.seconds, o.sync_seconds, o.compute_seconds) == pytest.approx((0.015, 0.015, 0))
    assert t.open_step(240 * MS, None) is None      # returned, its event not read yet
    assert t.open_step(240 * MS, 250 * MS) is None  # began after now: not in flight then


def test_the_step_in_progress_starts_with_an_allreduce_still_in_flight_that_began_first():
    """ProcessGroupGloo runs buckets on two threads: the bucket begun second can return
    first. The step in progress then starts where the one still in flight began, the
    start its gloo_step will have, not at the returned one's."""
    grad = 8_396_800
    colls = ddp_run(4)                      # steps 1-3 at 70, 120, 170 ms: 75-100, 76-101
    colls += [coll("AllReduce", 225, 250, grad // 2), coll("AllReduce", 226, 240, grad // 2)]
    t = StepTracker()
    for c in sorted(colls, key=lambda c: c.end_ns):
        if c.end_ns <= 245 * MS and c.op != "Barrier":
            t.add(c)
    t.next_started(225 * MS)                # closes step 3: step 4's first is in flight
    o = t.open_step(245 * MS, 225 * MS)     # 226-240 returned, 225- still in flight
    assert (o.index, o.start_ns, o.waiting) == (4, 225 * MS, True)
    assert (o.seconds, o.sync_seconds) == pytest.approx((0.020, 0.020))
    t.add(colls[-2])
    steps, _ = t.flush()
    assert [(s.index, s.start_ns) for s in steps] == [(4, 225 * MS)]


def test_no_step_in_progress_is_named_where_an_allreduce_in_flight_joins_the_step_before():
    t = StepTracker()
    for c in sorted(ddp_run(4), key=lambda c: c.end_ns):
        if c.end_ns <= 190 * MS:
            t.add(c)
    assert [b.start_ns for b in t.bursts] == [125 * MS]     # steps 0, 1 emitted
    # one in flight since 101.1 ms, as step 1's burst ended (75-101 ms), would join that
    # burst: which step it belongs to, and where step 2 starts, are not known
    assert t.open_step(190 * MS, int(101.1 * MS)) is None
    o = t.open_step(190 * MS, 110 * MS)    # in the gap before step 2: it opens step 2
    assert (o.index, o.start_ns, o.waiting) == (2, 110 * MS, True)


def fsdp_run(steps: int, layers: int = 16, grad: int = 65_536, lazy_init: bool = False):
    """FSDP2 over gloo, as the lab's `--kind fsdp` runs it: per layer an AllGather before
    its forward, another before its backward, and its ReduceScatter, which gloo runs as
    an AllReduce of the layer's whole gradient; a step every 3 ms per layer, and 50
    more. Step 0's forward
    gathers come before the first AllReduce (the tracker's init). lazy_init: step 0
    also reduces one small buffer first, a call no later step repeats."""
    out, t, period = [], 0.0, 3.0 * layers + 50
    for n in range(steps):
        for _ in range(layers):                      # forward: 1 ms per layer
            out.append(coll("AllGather", t, t + 0.5, grad // 3))
            t += 1.0
        if n == 0 and lazy_init:
            out.append(coll("AllReduce", t, t + 0.3, 64))
            t += 1.0
        for _ in range(layers):                      # backward: 2 ms per layer
            out.append(coll("AllGather", t, t + 0.5, grad // 3))
            out.append(coll("AllReduce", t + 1.0, t + 1.6, grad))
            t += 2.0
        t = period * (n + 1)                         # optimizer, data
    return out


@pytest.mark.parametrize("lazy_init", [False, True])
@pytest.mark.parametrize("layers", [1, 3, 16, 100])
def test_a_sharded_step_is_every_layer_not_one(layers, lazy_init):
    # each layer's AllReduce burst is alike and so are the gaps between them: by bytes
    # and gaps alone each layer would be a step; its gathers make the sequence's period
    # the step
    tracker = StepTracker()
    steps, _ = feed(tracker, fsdp_run(8, layers=layers, lazy_init=lazy_init))
    assert tracker.sequenced and tracker.resyncs == 0
    assert {s.buckets for s in steps} == {layers}
    assert {s.bytes for s in steps} == {layers * 65_536}
    period = (3.0 * layers + 50) / 1e3
    assert [s.seconds for s in steps[:-1]] == pytest.approx([period] * (len(steps) - 1))
    assert len(steps) >= 7            # step 0 too, unless its calls differ (lazy_init)


def test_the_same_layers_without_their_gathers_are_one_step_each():
    # the case the sequence exists for: AllReduce alone cannot tell a layer from a step
    colls = [c for c in fsdp_run(4) if c.op == "AllReduce"]
    steps, _ = feed(StepTracker(), colls)
    assert {s.buckets for s in steps} == {1}
