"""D from collective windows (fabricscope.trafficmodel.duty_from_windows)."""

import pytest

from fabricscope import trafficmodel as tm


def test_duty_is_the_time_with_a_window_in_flight_over_the_span():
    windows = [(i * 0.05, i * 0.05 + 0.02) for i in range(10)]
    assert tm.duty_from_windows(windows, 0.0, 0.5) == pytest.approx(0.4)


def test_overlapping_windows_of_two_threads_count_once():
    assert tm.duty_from_windows([(0.0, 0.3), (0.1, 0.4), (0.2, 0.25)], 0.0, 1.0) == \
        pytest.approx(0.4)


def test_windows_are_cut_at_the_span_and_an_empty_span_has_no_duty():
    assert tm.duty_from_windows([(-1.0, 0.5), (0.9, 3.0)], 0.0, 1.0) == pytest.approx(0.6)
    assert tm.duty_from_windows([(0.0, 1.0)], 1.0, 1.0) == 0.0


def test_a_network_bound_job_has_a_duty_above_one_half():
    windows = [(i * 0.1, i * 0.1 + 0.07) for i in range(20)]
    assert tm.duty_from_windows(windows, 0.0, 2.0) > 0.5
