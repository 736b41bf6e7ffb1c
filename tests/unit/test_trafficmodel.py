"""fabricscope.trafficmodel on synthetic square waves (known T, B, D)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fabricscope import trafficmodel as tm


def square_wave(period_bins: float, duty: float, amplitude: float, periods: int,
                jitter: float = 0.0, seed: int = 0) -> np.ndarray:
    """Bytes per bin of a square wave (fractional period via exact window spreading)."""
    rng = np.random.default_rng(seed)
    windows, t = [], 0.0
    for _ in range(periods):
        p = period_bins * (1 + jitter * rng.uniform(-1, 1))
        windows.append((t, t + duty * p, amplitude * duty * p))
        t += p
    return tm.series_from_windows(windows, 0.0, t, 1.0)


def test_series_from_windows_spreads_bytes_evenly():
    s = tm.series_from_windows([(0.5, 2.5, 400.0)], 0.0, 4.0, 1.0)
    assert s.tolist() == [100.0, 200.0, 100.0, 0.0]
    assert s.sum() == 400.0


def test_series_from_windows_cuts_outside_and_handles_points():
    s = tm.series_from_windows([(-1.0, 1.0, 200.0), (3.0, 3.0, 7.0), (9.0, 10.0, 5.0)],
                               0.0, 4.0, 1.0)
    assert s.tolist() == [100.0, 0.0, 0.0, 7.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-0.5, 10.5), st.floats(0.0, 2.0), st.floats(0.0, 1e7)),
                max_size=40),
       st.sampled_from([1e-4, 1e-3, 0.3, 1.0]), st.floats(1e3, 1e5))
def test_series_from_windows_conserves_bytes_at_any_clock_offset(raw, bin_s, t0):
    # windows with absolute (monotonic-clock) times; the series holds exactly the
    # bytes of the parts inside [t0, t0 + 10), each window spread evenly
    windows = [(t0 + s, t0 + s + d, b) for s, d, b in raw]
    series = tm.series_from_windows(windows, t0, t0 + 10.0, bin_s)
    rel = [(s - t0, e - t0, b) for s, e, b in windows]
    inside = sum(b * (min(e, 10.0) - max(s, 0.0)) / (e - s) if e > s else b
                 for s, e, b in rel if b > 0 and e >= 0 and s < 10.0 and (e > s or s >= 0))
    assert len(series) == int(np.ceil(10.0 / bin_s - 1e-9))
    assert (series >= 0).all()
    assert series.sum() == pytest.approx(inside, rel=1e-6, abs=1e-3)


def test_series_from_windows_rejects_bad_bins():
    with pytest.raises(ValueError):
        tm.series_from_windows([], 0.0, 1.0, 0.0)


def test_autocorrelation_is_one_at_zero_and_periodic():
    r = tm.autocorrelation(square_wave(20, 0.3, 1.0, 30))
    assert r[0] == pytest.approx(1.0)
    assert r[20] > 0.9 and r[10] < 0


def test_fit_square_wave_exact():
    bin_s = 0.001
    model = tm.fit(square_wave(50, 0.3, 1000.0, 40), bin_s)
    assert model.period_s == pytest.approx(0.050, rel=1e-3)
    assert model.duty_cycle == pytest.approx(0.3, abs=0.01)
    assert model.burst_bytes_per_s == pytest.approx(1000.0 / bin_s, rel=1e-6)
    assert model.acf_peak > 0.95
    assert model.network_bound is False
    assert model.window_s == pytest.approx(2.0)


def test_fit_refines_a_fractional_period_below_one_bin():
    model = tm.fit(square_wave(37.4, 0.6, 5.0, 50), 1.0)
    assert model.period_s == pytest.approx(37.4, rel=0.005)
    assert model.network_bound is True


def test_fit_with_jitter_stays_within_five_percent():
    s = square_wave(40, 0.4, 1.0, 60, jitter=0.1, seed=3)
    model = tm.fit(s, 1.0)
    assert model.period_s == pytest.approx(40, rel=0.05)


def test_period_is_the_median_when_steps_drift_and_skew():
    # step times drift slowly and have a long tail (a loaded machine): the median
    # interval, not the smeared autocorrelation peak, is what T reports
    rng = np.random.default_rng(7)
    periods = np.concatenate([np.linspace(40, 70, 30), np.linspace(70, 35, 30)])
    periods = periods * (1 + rng.exponential(0.05, len(periods)))
    windows, t = [], 0.0
    for p in periods:
        windows.append((t, t + 0.8 * p, 0.8 * p))
        t += p
    model = tm.fit(tm.series_from_windows(windows, 0.0, t, 1.0), 1.0)
    assert model.period_s == pytest.approx(float(np.median(periods)), rel=0.03)


def test_burst_onsets_are_sub_bin_and_merge_close_edges():
    s = np.array([0, 0, 5, 10, 10, 0, 10, 10, 0, 0, 0, 10, 10, 0], dtype=float)
    # bin 2 is half full: the burst began at 2.5; the edge at 6 is within 6 bins of it
    # and merges; the one at 11 starts on a bin boundary
    onsets = tm.burst_onsets(s, min_gap_bins=6)
    assert onsets == pytest.approx([2.5, 11.0])
    # a start filling only 5 % of its bin (below the level) is still placed exactly
    assert tm.burst_onsets(np.array([0, 0.5, 10, 10, 0.0]), 1) == pytest.approx([1.95])


@pytest.mark.parametrize("second_at", [0.3, 0.45, 0.6])
def test_two_bursts_per_step_give_the_step_period(second_at):
    # a step syncs two gradient buckets separated by backward compute
    rng = np.random.default_rng(5)
    windows, t = [], 0.0
    for _ in range(40):
        p = 50 * (1 + 0.05 * rng.uniform(-1, 1))
        windows += [(t, t + 8, 8.0), (t + second_at * p, t + second_at * p + 8, 8.0)]
        t += p
    model = tm.fit(tm.series_from_windows(windows, 0.0, t, 1.0), 1.0)
    assert model.period_s == pytest.approx(50, rel=0.05)


def test_harmonic_does_not_win():
    # a wave whose every second burst is weaker: T is still the burst spacing
    s = square_wave(30, 0.3, 1.0, 40)
    s[np.arange(len(s)) % 60 < 30] *= 0.8
    model = tm.fit(s, 1.0)
    assert model.period_s == pytest.approx(30, rel=0.02)


def test_silence_and_noise_have_no_period():
    assert tm.fit(np.zeros(500), 0.001).period_s is None
    assert tm.fit(np.zeros(500), 0.001).duty_cycle == 0.0
    noise = np.random.default_rng(1).exponential(1.0, 2000)
    assert tm.fit(noise, 0.001).period_s is None


def test_period_bounds_are_respected():
    s = square_wave(20, 0.3, 1.0, 50)
    assert tm.sync_period(s, 1.0, min_period_s=25, max_period_s=30) is None
    assert tm.sync_period(s, 1.0, max_period_s=25)[0] == pytest.approx(20, rel=0.01)


def test_to_dict_has_every_figure():
    d = tm.fit(square_wave(10, 0.5, 2.0, 20), 1.0).to_dict()
    assert set(d) == {"period_s", "acf_peak", "burst_bytes_per_s", "duty_cycle",
                      "mean_bytes_per_s", "window_s", "network_bound"}


@settings(max_examples=40, deadline=None)
@given(period=st.floats(8, 80), duty=st.floats(0.1, 0.8), amplitude=st.floats(1, 1e6))
def test_fit_recovers_any_clean_square_wave(period, duty, amplitude):
    burst_bins = duty * period
    assume(burst_bins >= 3)          # B needs bursts of a few bins (see the module doc)
    model = tm.fit(square_wave(period, duty, amplitude, 30), 1.0)
    assert model.period_s == pytest.approx(period, rel=0.01)
    assert model.duty_cycle == pytest.approx(duty, abs=1.5 / period + 0.01)
    # edge bins are partly filled: at most one bin's worth of error per burst
    assert model.burst_bytes_per_s == pytest.approx(amplitude, rel=1 / burst_bins + 0.01)


def test_period_is_the_mean_step_time_when_step_times_are_skewed_and_onsets_jitter():
    # a loaded machine: step times with a long tail (40 ms + exponential), and where
    # in its step the burst starts jitters by up to 12 ms. The median of such onset
    # intervals drifts from the median step time towards the mean; T is the mean.
    rng = np.random.default_rng(7)
    steps = 0.040 + rng.exponential(0.008, 80)
    starts = np.concatenate([[0.0], np.cumsum(steps)[:-1]])
    onsets = starts + 0.005 + rng.uniform(0, 0.012, len(steps))
    windows = [(t, t + 0.010, 4e5) for t in onsets]
    bin_s = 0.0005
    model = tm.fit(tm.series_from_windows(windows, 0.0, float(starts[-1] + steps[-1]), bin_s),
                   bin_s)
    mean_step = (onsets[-1] - onsets[0]) / (len(onsets) - 1)
    assert model.period_s == pytest.approx(mean_step, rel=0.01)
    assert model.period_s == pytest.approx(steps.mean(), rel=0.02)
    # what a median would have said here: off by more than the tolerance above
    assert abs(np.median(np.diff(onsets)) / steps.mean() - 1) > 0.02


def test_slow_steps_with_the_same_bytes_count_as_one_period_each():
    """A loaded machine stretches some steps to 2-4x the median interval; each still
    syncs the gradient bytes once, so T is the mean step time, not a shorter period
    that counts the slow steps as several (the bytes between onsets say how many)."""
    windows, t, lengths = [], 0.0, []
    for k in range(60):
        step = 32.0 * (3.4 if k % 9 == 4 else 1.0)       # every ninth step is slow
        windows.append((t, t + 10.0, 1e6))               # the same burst every step
        lengths.append(step)
        t += step
    series = tm.series_from_windows(windows, 0.0, t, 1.0)
    period, _acf = tm.sync_period(series, 1.0)
    assert period == pytest.approx(np.mean(lengths[:-1]), rel=0.02)


def test_a_fitted_model_holds_plain_floats_for_the_wire():
    import numpy as np
    from fabricscope import trafficmodel
    series = np.tile([5e6] * 5 + [0.0] * 45, 40)
    model = trafficmodel.fit(series, 0.001)
    assert model.period_s is not None
    for value in (model.period_s, model.acf_peak, model.burst_bytes_per_s, model.duty_cycle,
                  model.mean_bytes_per_s, model.window_s):
        assert type(value) is float, (value, type(value))
