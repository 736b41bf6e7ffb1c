"""tcp_flows window logic: per-CPU merge, log2-histogram percentiles, records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.agent.probes.tcp.flow_layout import CWND_BUCKETS, RTT_BUCKETS, SLOT_DTYPE
from fabricscope.agent.probes.tcp.window import (FlowRetrans, NodeTally, bucket_bounds, flow_fields,
                                     flow_record, merge_slots, node_record, quantile_log2)
from fabricscope import schema
from fabricscope.records import Record

U32 = 0xFFFFFFFF


def log2_bucket(v: int, buckets: int) -> int:
    return min(max(v, 1).bit_length() - 1, buckets - 1)


def slot(gen, rtts=(), cwnds=(), acked=0, ssthresh=()):
    """What the kernel's slot holds after hits with these values (bpf/tcp_flows.bpf.c)."""
    s = np.zeros((), dtype=SLOT_DTYPE)
    s["gen"] = gen
    s["rtt_min_us"] = s["cwnd_min"] = s["ssthresh_min"] = U32
    s["segs_in"] = len(cwnds)
    s["acked"] = acked
    for c in cwnds:
        s["cwnd_min"] = min(int(s["cwnd_min"]), c)
        s["cwnd_max"] = max(int(s["cwnd_max"]), c)
        s["cwnd_hist"][log2_bucket(c, CWND_BUCKETS)] += 1
    for t in ssthresh:
        s["ssthresh_min"] = min(int(s["ssthresh_min"]), t)
        s["ssthresh_max"] = max(int(s["ssthresh_max"]), t)
    for r in rtts:
        s["rtt_samples"] += 1
        s["rtt_sum_us"] += r
        s["rtt_sumsq_us"] += r * r
        s["rtt_min_us"] = min(int(s["rtt_min_us"]), r)
        s["rtt_max_us"] = max(int(s["rtt_max_us"]), r)
        s["rtt_hist"][log2_bucket(r, RTT_BUCKETS)] += 1
    return s


def grid(*rows):
    """(flows, cpus) array from rows of slots."""
    return np.array([[c for c in row] for row in rows], dtype=SLOT_DTYPE)


def test_merge_adds_cpus_of_the_window_and_ignores_stale_slots():
    a = slot(7, rtts=[100, 300], cwnds=[10, 20], acked=1000, ssthresh=[50])
    b = slot(7, rtts=[50], cwnds=[5], acked=500)
    stale = slot(5, rtts=[1], cwnds=[1], acked=10 ** 9)
    empty = np.zeros((), dtype=SLOT_DTYPE)
    m = merge_slots(grid([a, b], [stale, empty]), 7)
    assert list(m["active"]) == [True, False]
    assert int(m["acked"][0]) == 1500 and int(m["segs_in"][0]) == 3
    assert (int(m["rtt_min_us"][0]), int(m["rtt_max_us"][0])) == (50, 300)
    assert (int(m["cwnd_min"][0]), int(m["cwnd_max"][0])) == (5, 20)
    assert int(m["rtt_hist"][0].sum()) == 3 and int(m["rtt_sum_us"][0]) == 450
    assert int(m["acked"][1]) == 0


def test_flow_fields_exact_statistics():
    m = merge_slots(grid([slot(1, rtts=[100, 100, 400], cwnds=[10, 12, 14], acked=3000,
                                ssthresh=[20, 30])]), 1)
    f = flow_fields(m, 0, 0.5)
    assert f["bytes_acked"] == 3000 and f["acked_bps"] == 3000 * 8 / 0.5
    assert (f["rtt_min_us"], f["rtt_max_us"], f["rtt_mean_us"]) == (100, 400, 200)
    assert f["rtt_stddev_us"] == pytest.approx(math.sqrt((2 * 100 ** 2 + 400 ** 2) / 3 - 200 ** 2))
    assert (f["cwnd_min"], f["cwnd_max"], f["ssthresh_min"], f["ssthresh_max"]) == (10, 14, 20, 30)
    assert 64 <= f["rtt_p50_us"] < 128 and 256 <= f["rtt_p99_us"] <= 400


def test_flow_without_rtt_samples_or_ssthresh_has_no_such_fields():
    m = merge_slots(grid([slot(3, cwnds=[10])]), 3)      # a pure receiver
    f = flow_fields(m, 0, 1.0)
    assert f["rtt_samples"] == 0 and "rtt_p50_us" not in f and "ssthresh_min" not in f
    rec = flow_record(("198.18.0.1", 1, "198.18.0.2", 2), f, FlowRetrans(3, 4000, 2, 1), 5,
                      {"pid": "9", "rank": "0"})
    assert rec.fields["retrans_segs"] == 3 and rec.fields["timeouts"] == 1
    rec.tags["node"] = "n"
    schema.validate(rec)


def test_equal_samples_give_exact_percentiles():
    hist = [0] * RTT_BUCKETS
    hist[log2_bucket(1000, RTT_BUCKETS)] = 50
    assert quantile_log2(hist, 0.5, 1000, 1000) == 1000
    assert quantile_log2([0] * RTT_BUCKETS, 0.5, 0, 0) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=(1 << 26)), min_size=1, max_size=300),
       st.sampled_from([0.5, 0.9, 0.99]))
def test_percentile_lies_in_the_bucket_of_the_true_nearest_rank(samples, q):
    hist = [0] * RTT_BUCKETS
    for v in samples:
        hist[log2_bucket(v, RTT_BUCKETS)] += 1
    got = quantile_log2(hist, q, min(samples), max(samples))
    true = sorted(samples)[max(1, math.ceil(q * len(samples))) - 1]
    low, high = bucket_bounds(log2_bucket(true, RTT_BUCKETS), RTT_BUCKETS)
    assert min(samples) <= got <= max(samples)
    assert low <= got <= high


def test_node_record_ratio_and_kinds():
    tally = NodeTally()
    flow = {"saddr": "198.18.0.1", "sport": "1", "daddr": "198.18.0.2", "dport": "2"}
    for kind, segs in (("fast", 10), ("rto", 1), ("slow_start", 4), ("tlp", 1)):
        tally.add_record(Record("tcp_retransmit", 1, {**flow, "kind": kind}, {"segs": segs}))
    tally.add_record(Record("tcp_reset", 1, {**flow, "direction": "sent"}, {"count": 1}))
    tally.add_record(Record("tcp_flow_open", 1, flow, {"active": True}))
    retrans = {("198.18.0.1", 1, "198.18.0.2", 2): FlowRetrans(16, 16 * 1000, 4, 1)}
    rec = node_record(10, 1.0, 1, 5000, (1600, 1_600_000), retrans, tally)
    f = rec.fields
    assert (f["retrans_segs"], f["retrans_bytes"]) == (16, 16000)
    assert f["retrans_ratio"] == 0.01 and f["retrans_seg_ratio"] == 0.01
    assert (f["fast_segs"], f["rto_segs"], f["slow_start_segs"], f["tlp_segs"]) == (10, 1, 4, 1)
    assert (f["timeouts"], f["resets_sent"], f["opens"]) == (1, 1, 1)
    idle = node_record(10, 1.0, 0, 0, (0, 0), {}, NodeTally()).fields
    assert idle["retrans_ratio"] == 0.0 and idle["flows"] == 0
    rec.tags["node"] = "n"
    schema.validate(rec)
