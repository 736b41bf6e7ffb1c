"""nic_window: p99, burst detection across drains, window assembly."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricscope.agent.probes.nic.ring import Bins
from fabricscope.agent.probes.nic.window import (Burst, BurstDetector, BurstSelector, WindowAssembler, p99,
                                     window_shift)

BIN_NS = 100_000
HOT = 6250.0              # 50 % of 1 Gbit/s in 100 us


def bins(rows) -> Bins:
    """rows: (bin index, bytes) or (bin index, bytes, first offset, last offset)."""
    full = [(r + (0, BIN_NS - 1))[:4] if len(r) == 2 else r for r in rows]
    idx = np.array([r[0] for r in full], np.int64)
    return Bins(idx, np.array([r[1] for r in full], np.int64),
                np.array([max(1, r[1] // 1000) for r in full], np.int64),
                idx * BIN_NS + np.array([r[2] for r in full], np.int64),
                idx * BIN_NS + np.array([r[3] for r in full], np.int64))


# --- p99 -----------------------------------------------------------------------------

def test_p99_counts_idle_bins_as_zero():
    assert p99(np.array([5.0]), 100) == 0.0           # 99 zeros and one 5: rank 99 is 0
    assert p99(np.array([5.0, 7.0]), 100) == 5.0      # rank 99 of 100 -> the 5
    assert p99(np.array([]), 0) == 0.0


def test_p99_nearest_rank_matches_sorting():
    values = np.arange(1, 201, dtype=float)
    assert p99(values, 200) == 198.0                  # ceil(0.99 * 200) = 198


@given(st.lists(st.integers(1, 10**6), max_size=60), st.integers(0, 60))
@settings(max_examples=200, deadline=None)
def test_p99_equals_the_sorted_definition(nonzero, zeros):
    total = len(nonzero) + zeros
    expected = 0.0
    if total:
        full = sorted([0] * zeros + nonzero)
        expected = float(full[-(-99 * total // 100) - 1])
    assert p99(np.array(nonzero, float), total) == expected


# --- bursts --------------------------------------------------------------------------

def test_a_run_of_hot_bins_with_partial_edges_is_one_burst():
    det = BurstDetector()
    out = det.feed(bins([(9, 300), (10, 3000, 60_000, 99_000), (11, 12500), (12, 12500),
                         (13, 2000, 0, 20_000)]), upto=20, hot_bytes=HOT)
    (b,) = out
    assert b.start_ns == 10 * BIN_NS + 60_000           # first packet of the partial head bin
    assert b.end_ns == 13 * BIN_NS + 20_000             # last packet of the partial tail bin
    assert (b.bytes, b.hot_bins, b.bins, b.peak_bytes) == (3000 + 25000 + 2000, 2, 4, 12500)


def test_the_head_bin_is_only_taken_when_adjacent():
    det = BurstDetector()
    (b,) = det.feed(bins([(5, 100), (7, 9000)]), upto=10, hot_bytes=HOT)
    assert (b.start_ns, b.bytes, b.bins) == (7 * BIN_NS, 9000, 1)


def test_quiet_traffic_gives_no_burst():
    det = BurstDetector()
    rows = [(i, 500) for i in range(0, 10_000, 3)]
    assert det.feed(bins(rows), upto=10_001, hot_bytes=HOT) == []


def test_a_burst_spanning_drains_is_reported_once_when_it_ends():
    det = BurstDetector()
    assert det.feed(bins([(10, 1000), (11, 9000)]), upto=12, hot_bytes=HOT) == []
    assert det.feed(bins([(12, 9000)]), upto=13, hot_bytes=HOT) == []   # 13 not seen yet
    (b,) = det.feed(bins([]), upto=14, hot_bytes=HOT)                   # 13 was empty
    assert (b.start_ns, b.bytes, b.bins, b.hot_bins) == (10 * BIN_NS, 19000, 3, 2)


def test_a_tail_bin_is_not_also_the_head_of_the_next_burst():
    det = BurstDetector()
    out = det.feed(bins([(1, 9000), (2, 100), (3, 9000)]), upto=5, hot_bytes=HOT)
    assert [(b.bins, b.bytes) for b in out] == [(2, 9100), (1, 9000)]


def test_back_to_back_bursts_separated_by_one_empty_bin():
    det = BurstDetector()
    out = det.feed(bins([(1, 9000), (3, 9000), (4, 9000)]), upto=6, hot_bytes=HOT)
    assert [(b.start_ns // BIN_NS, b.bins) for b in out] == [(1, 1), (3, 2)]


def test_flush_reports_a_burst_still_open():
    det = BurstDetector()
    assert det.feed(bins([(1, 9000)]), upto=2, hot_bytes=HOT) == []
    (b,) = det.flush()
    assert b.bytes == 9000
    assert det.flush() == []


@given(st.lists(st.tuples(st.integers(2, 30), st.integers(1, 40)), min_size=1, max_size=12),
       st.integers(1, 7))
@settings(max_examples=150, deadline=None)
def test_bursts_are_found_whatever_the_drain_boundaries(shape, step):
    """Synthetic bursts (gap bins, hot bins) -> exactly those bursts, however the bins
    are cut into drains."""
    rows, expected, b = [], [], 0
    for gap, length in shape:
        b += gap
        expected.append((b, length * 9000))
        rows += [(b + i, 9000) for i in range(length)]
        b += length
    det, out = BurstDetector(), []
    data = bins(rows)
    for upto in range(0, b + 2 + step, step):
        mask = (data.index < upto) & (data.index >= upto - step)
        out += det.feed(data.select(mask), upto, HOT)
    assert [(x.start_ns // BIN_NS, x.bytes) for x in out] == expected


# --- windows -------------------------------------------------------------------------

def test_windows_close_when_their_last_bin_is_drained():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=99)   # counting from bin 100
    assert wa.feed(bins([(100, 1000), (105, 9000)]), 0, upto=109, hot_bytes=HOT) == []
    (w,) = wa.feed(bins([(109, 500), (112, 10)]), 0, upto=113, hot_bytes=HOT)
    assert (w.start_ns, w.covered_bins, w.bytes, w.peak_bytes, w.hot_bins) == \
        (100 * BIN_NS, 10, 10500, 9000, 1)
    assert w.p99_bytes == 9000          # 3 non-empty of 10: rank 10 is the largest


def test_first_window_covers_only_the_bins_since_start():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=104)
    (w,) = wa.feed(bins([(107, 100)]), 0, upto=110, hot_bytes=HOT)
    assert (w.start_ns, w.covered_bins, w.bytes) == (100 * BIN_NS, 5, 100)


def test_idle_windows_are_reported_with_zeros_and_lost_bins_are_kept():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=99)
    out = wa.feed(bins([]), lost=4, upto=130, hot_bytes=HOT)
    assert [(w.start_ns // BIN_NS, w.bytes, w.lost_bins) for w in out] == \
        [(100, 0, 4), (110, 0, 0), (120, 0, 0)]


def test_one_drain_spanning_windows_splits_the_bins():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=99)
    out = wa.feed(bins([(101, 1), (111, 2), (112, 3), (125, 4)]), 0, upto=130, hot_bytes=HOT)
    assert [w.bytes for w in out] == [1, 5, 4]


def test_flush_reports_the_partial_window():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=99)
    wa.feed(bins([(101, 7)]), 0, upto=104, hot_bytes=HOT)
    w = wa.flush(upto=104)
    assert (w.start_ns, w.covered_bins, w.bytes) == (100 * BIN_NS, 4, 7)


def test_shifted_windows_start_where_the_shift_says():
    wa = WindowAssembler(BIN_NS, per_window=10, start_bin=96, shift=3)   # from bin 97
    out = wa.feed(bins([(97, 1), (106, 2), (107, 3), (125, 4)]), 0, upto=130, hot_bytes=HOT)
    assert [(w.start_ns // BIN_NS, w.covered_bins, w.bytes) for w in out] == \
        [(97, 10, 3), (107, 10, 3), (117, 10, 4)]


@pytest.mark.parametrize("offset_ns", [0, 1, 99_999, 100_000, 1_764_900_000_123_456_789])
def test_the_shift_starts_each_window_within_a_bin_after_a_wall_clock_second(offset_ns):
    """The agents cut their TCP windows just after each wall-clock second; a NIC window
    must start with the second (not up to a bin before it: it would be stamped with
    the second before)."""
    second, per_window = 1_000_000_000, 10_000
    shift = window_shift(offset_ns, BIN_NS, per_window)
    wa = WindowAssembler(BIN_NS, per_window, start_bin=5_000_000, shift=shift)
    out = wa.feed(bins([]), 0, upto=5_030_000, hot_bytes=HOT)
    starts = [w.start_ns + offset_ns for w in out[1:]]    # the first is partial
    assert len(starts) == 2 and all(0 <= t % second < BIN_NS for t in starts)


@pytest.mark.parametrize("cut", [1, 3, 10, 25])
def test_window_totals_do_not_depend_on_drain_cadence(cut):
    rng = np.random.default_rng(cut)
    idx = np.sort(rng.choice(np.arange(100, 400), 120, replace=False))
    data = bins([(int(i), int(rng.integers(1, 20000))) for i in idx])
    wa = WindowAssembler(BIN_NS, per_window=50, start_bin=99)
    out = []
    for upto in range(100 + cut, 401 + cut, cut):
        mask = (data.index < upto) & (data.index >= upto - cut)
        out += wa.feed(data.select(mask), 0, upto, HOT)
    assert sum(w.bytes for w in out) == int(data.bytes.sum())
    assert [w.start_ns // BIN_NS for w in out] == list(range(100, 400, 50))


def reference_bursts(rows: dict[int, int]) -> list[tuple[int, int, int]]:
    """The definition, offline over all bins: (first bin, last bin, bytes) per burst."""
    out, claimed, b = [], set(), min(rows, default=0)
    end = max(rows, default=-1)
    while b <= end:
        if rows.get(b, 0) >= HOT:
            s = b
            while rows.get(b + 1, 0) >= HOT:
                b += 1
            e = b
            first = s - 1 if rows.get(s - 1) and (s - 1) not in claimed else s
            last = e + 1 if rows.get(e + 1) else e
            claimed.update(range(first, last + 1))
            out.append((first, last, sum(rows.get(i, 0) for i in range(first, last + 1))))
            b = last
        b += 1
    return out


@given(st.dictionaries(st.integers(0, 300), st.sampled_from([50, 3000, 6249, 6250, 9000]),
                       max_size=150), st.lists(st.integers(1, 40), min_size=1, max_size=30))
@settings(max_examples=300, deadline=None)
def test_detector_matches_the_offline_definition_for_any_drain_cuts(rows, cuts):
    data = bins(sorted(rows.items()))
    det, out, upto, i = BurstDetector(), [], 0, 0
    while upto <= 302:
        upto += cuts[i % len(cuts)]
        i += 1
        mask = (data.index < upto) & (data.index >= upto - cuts[(i - 1) % len(cuts)])
        out += det.feed(data.select(mask), upto, HOT)
    got = [(x.start_ns // BIN_NS, x.end_ns // BIN_NS, x.bytes) for x in out]
    assert got == reference_bursts(rows)


def _burst(start_ns: int, nbytes: int) -> Burst:
    return Burst(start_ns, start_ns + 1000, nbytes, 1, nbytes, 1, 1)


def test_selector_lists_the_largest_bursts_of_a_window_in_time_order():
    sel = BurstSelector(limit=2)
    sel.add([_burst(100, 5), _burst(200, 50), _burst(300, 7), _burst(1500, 1)])
    listed, found = sel.close(1000)
    assert found == 3 and [b.start_ns for b in listed] == [200, 300]
    listed, found = sel.flush()      # the burst after the window end stays for the next
    assert found == 1 and [b.start_ns for b in listed] == [1500]


def test_selector_ties_keep_the_earlier_and_zero_lists_none():
    sel = BurstSelector(limit=1)
    sel.add([_burst(1, 9), _burst(2, 9)])
    assert [b.start_ns for b in sel.close(10)[0]] == [1]
    none = BurstSelector(limit=0)
    none.add([_burst(1, 9)])
    assert none.close(10) == ([], 1)
