"""The nic probe's recent received bins and the peaks of collective windows in them."""

from __future__ import annotations

import numpy as np
import pytest

from fabricscope.agent.probes.nic.history import BinHistory

BIN = 100_000           # 100 us
MS = 1_000_000


def feed(h: BinHistory, name: str, bins: dict[int, int], rate: int | None = None) -> None:
    index = np.array(sorted(bins), np.int64)
    h.add(name, index, np.array([bins[i] for i in index], np.int64), rate)


def test_each_windows_busiest_bin_and_the_median_over_windows():
    h = BinHistory(BIN)
    # windows at 0-2 ms, 10-12 ms, 20-22 ms (bins 0-20, 100-120, 200-220)
    feed(h, "eth0", {5: 1000, 6: 12_500, 105: 10_000, 210: 11_000, 211: 200}, rate=10**9)
    h.drained(0, 1000)
    p = h.peaks([(0, 2 * MS), (10 * MS, 12 * MS), (20 * MS, 22 * MS)])
    assert p.interface == "eth0" and p.windows == 3
    assert p.peak_bytes_per_s == pytest.approx(11_000 / 1e-4)      # median of 12.5k, 10k, 11k
    assert p.line_rate_bps == 10**9


def test_traffic_outside_the_windows_does_not_count():
    h = BinHistory(BIN)
    # a data load at 3x the ring's rate, between two collectives
    feed(h, "eth0", {5: 12_500, 50: 37_500, 51: 37_500, 105: 12_500})
    h.drained(0, 1000)
    p = h.peaks([(0, 2 * MS), (10 * MS, 12 * MS)])
    assert p.peak_bytes_per_s == pytest.approx(12_500 / 1e-4)


def test_the_interface_that_received_most_inside_the_windows_is_read():
    h = BinHistory(BIN)
    feed(h, "eth0", {5: 12_500, 6: 12_500, 105: 12_500})
    feed(h, "eth1", {5: 20_000, 300: 900_000})          # more bytes, but outside
    h.drained(0, 1000)
    assert h.peaks([(0, 2 * MS), (10 * MS, 12 * MS)]).interface == "eth0"


def test_overlapping_windows_count_once_and_edge_bins_are_in():
    h = BinHistory(BIN)
    feed(h, "eth0", {0: 5_000, 20: 9_000, 30: 7_000})
    h.drained(0, 1000)
    # two threads' collectives overlap: one window, bins 0..30; the partly covered
    # bin 20 (2.0-2.1 ms) belongs to a window ending at 2.05 ms
    p = h.peaks([(50_000, 2_050_000), (1 * MS, 3 * MS)])
    assert p.windows == 1 and p.peak_bytes_per_s == pytest.approx(9_000 / 1e-4)


def test_windows_not_yet_drained_or_already_forgotten_are_left_out():
    h = BinHistory(BIN, keep_s=0.01)            # keeps 100 bins
    assert h.peaks([(0, MS)]) is None           # nothing drained yet
    feed(h, "eth0", {5: 1_000})
    feed(h, "eth0", {305: 3_000})
    h.drained(0, 320)
    assert h.peaks([(0, MS)]) is None           # bins 0..10 are older than 100 bins
    assert h.peaks([(31 * MS, 33 * MS)]) is None     # ends at bin 330: not drained
    assert h.peaks([(30 * MS, 31 * MS)]).peak_bytes_per_s == pytest.approx(3_000 / 1e-4)


def test_silent_windows_give_no_peak():
    h = BinHistory(BIN)
    feed(h, "eth0", {500: 1_000})
    h.drained(0, 1000)
    assert h.peaks([(0, MS), (10 * MS, 11 * MS)]) is None
    p = h.peaks([(0, MS), (49 * MS, 51 * MS)])          # one silent, one with traffic
    assert p.windows == 1
