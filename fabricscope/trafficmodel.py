"""The job's traffic model: sync period T, burst bandwidth B, duty cycle D.

Data-parallel training traffic is a square wave: compute silence, then a
synchronised burst of gradient exchange, once per step. Three numbers describe it:

* T, the sync period. The autocorrelation of the bandwidth series (bytes per bin)
  says whether the series is periodic and gives a coarse period: its first strong
  peak (or a true peak near 1/2 .. 1/4 of that lag when at least 3/4 as high:
  jitter can make the peak at 3T the highest), refined below one bin with a
  parabola and the peaks at 2T, 3T, ... Step times jitter and drift on a shared
  machine, which smears those peaks, so T itself comes from burst onsets: rising
  edges out of silence (through ONSET_LEVEL x the robust peak; placed below one
  bin by how full the edge bins are compared to the burst's rate). Onsets are
  first merged only within the autocorrelation's zero-lag lobe (one per burst),
  and their median interval is taken unless the autocorrelation near 2x or 3x it
  is clearly stronger; otherwise (several bursts per step) onsets closer than half
  the coarse period are merged. T is then the mean period over the onsets: the
  time from the first onset to the last over the periods between them. An
  interval counts as as many periods as the median interval's bytes it carried
  (every step syncs the same gradient bytes: a slow step is still one period, an
  interval over a missed onset two, a burst split by a pause none). A median of
  jittery intervals is not the mean step time: when where in the
  step the burst starts jitters (a loaded machine), the median drifts towards
  the mean by several per cent, while the mean over the span errs only by the
  jitter of its two ends. With fewer than MIN_ONSETS onsets the coarse period
  stands.
* B, the burst bandwidth: the mean rate of the bins "in a burst", i.e. at or above
  half of the series' robust peak (its 99th percentile), in bytes per second.
* D, the duty cycle: the fraction of bins in a burst (= comm time / T). D > 0.5
  means the network, not compute, bounds the step.

B and D need bursts of at least a few bins (the bins at a burst's edges are only
partly filled): pick bin_s below a third of the shortest burst.

Where the collective windows themselves are known (the agent's gloo probe), D is
their union over the span (duty_from_windows: comm time / T, whatever the bytes),
and B is not the series' (a payload spread evenly over a window is that window's
average, far below the wire's rate during it): the agent takes it from the NIC's
busiest bins inside the windows (agent/probes/nic/history.py).

Pure functions over numpy arrays; the agent (gloo probe, from collective windows)
and the collector (from stored bandwidth series) both use them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np
import numpy.fft  # noqa: F401  (numpy loads it lazily: at import, not at the first fit)

BURST_LEVEL = 0.5          # a bin is "in a burst" at >= this x the robust peak
PEAK_PERCENTILE = 99.0     # robust peak: ignores a few outlier bins
MIN_ACF_PEAK = 0.2         # below this the series is not periodic enough to name T
MAX_HARMONICS = 8          # peaks at m x T used to refine T
MAX_SUBHARMONIC = 4        # a peak at up to 4T may stand for T ...
SUBHARMONIC_HEIGHT = 0.75  # ... when the one near T is at least this high relative to it
ONSET_ACF = 0.8            # several bursts per period: acf at 2T or 3T above acf(T) / this
ONSET_LEVEL = 0.1          # a burst starts where the rate rises through this x the peak
MIN_ONSETS = 5             # onsets needed before they give T


@dataclass(frozen=True)
class TrafficModel:
    period_s: float | None     # T; None when the series shows no periodicity
    acf_peak: float            # autocorrelation at T (0..1): how regular the wave is
    burst_bytes_per_s: float   # B
    duty_cycle: float          # D
    mean_bytes_per_s: float
    window_s: float            # length of the series

    @property
    def network_bound(self) -> bool:
        return self.duty_cycle > 0.5

    def to_dict(self) -> dict:
        return {**asdict(self), "network_bound": self.network_bound}


def series_from_windows(windows: Iterable[tuple[float, float, float]], t0: float, t1: float,
                        bin_s: float) -> np.ndarray:
    """Bytes per bin over [t0, t1) from (start_s, end_s, bytes) windows.

    Each window's bytes are spread evenly over its duration (a zero-length window
    puts all into its bin); the parts outside [t0, t1) are cut off. Vectorised (the
    agent runs this over thousands of collectives every few seconds): each window
    adds its partly covered first and last bins directly and its fully covered
    bins through a difference array."""
    if bin_s <= 0 or t1 <= t0:
        raise ValueError("need bin_s > 0 and t1 > t0")
    n = int(np.ceil((t1 - t0) / bin_s - 1e-9))
    out = np.zeros(n)
    w = np.asarray(list(windows) if not isinstance(windows, np.ndarray) else windows,
                   dtype=float).reshape(-1, 3)
    span = t1 - t0
    start, end, nbytes = w[:, 0] - t0, w[:, 1] - t0, w[:, 2]   # relative: keeps precision
    keep = (nbytes > 0) & (end >= 0) & (start < span)
    start, end, nbytes = start[keep], end[keep], nbytes[keep]
    point = end <= start
    np.add.at(out, np.clip((start[point] / bin_s).astype(np.int64), 0, n - 1), nbytes[point])
    start, end, nbytes = start[~point], end[~point], nbytes[~point]
    rate = nbytes / (end - start)
    a, z = np.maximum(start, 0.0), np.minimum(end, span)
    first = (a / bin_s).astype(np.int64)
    last = np.minimum(n - 1, (z / bin_s).astype(np.int64))
    one = first == last
    np.add.at(out, first[one], rate[one] * (z[one] - a[one]))
    f, lst, r, a, z = first[~one], last[~one], rate[~one], a[~one], z[~one]
    np.add.at(out, f, r * ((f + 1) * bin_s - a))
    np.add.at(out, lst, r * np.maximum(z - lst * bin_s, 0.0))
    full = np.zeros(n + 1)
    np.add.at(full, f + 1, r * bin_s)
    np.add.at(full, lst, -r * bin_s)
    out += np.maximum(np.cumsum(full[:n]), 0.0)
    return out


def autocorrelation(series: np.ndarray) -> np.ndarray:
    """Normalised autocorrelation r[k], k = 0..n-1 (r[0] = 1), via FFT."""
    x = np.asarray(series, dtype=float)
    x = x - x.mean()
    n = len(x)
    if n == 0 or not np.any(x):
        return np.zeros(max(n, 1))
    size = 1 << (2 * n - 1).bit_length()
    spec = np.fft.rfft(x, size)
    acf = np.fft.irfft(spec * np.conj(spec), size)[:n]
    # unbiased: each lag is averaged over the n-k pairs it has
    acf = acf / np.arange(n, 0, -1)
    return acf / acf[0]


def _refine(acf: np.ndarray, k: int) -> float:
    """Sub-bin position of the peak at lag k (parabola through k-1, k, k+1)."""
    if k <= 0 or k >= len(acf) - 1:
        return float(k)
    a, b, c = acf[k - 1], acf[k], acf[k + 1]
    denom = a - 2 * b + c
    if denom >= 0:
        return float(k)
    return k + 0.5 * (a - c) / denom


def _subharmonic(acf: np.ndarray, k: int, lo: int) -> int:
    """k / m for the largest m <= MAX_SUBHARMONIC with a true local peak near k / m of
    at least SUBHARMONIC_HEIGHT x k's: jittered steps can make the peak at 3T the
    highest."""
    for m in range(MAX_SUBHARMONIC, 1, -1):
        centre = k / m
        a, b = int(centre * 0.85), int(np.ceil(centre * 1.15))
        if a < lo or b >= len(acf) - 1:
            continue
        j = a + int(np.argmax(acf[a:b + 1]))
        if a < j < b and acf[j] >= SUBHARMONIC_HEIGHT * acf[k] and acf[j] >= MIN_ACF_PEAK:
            return j
    return k


def _local_peak(acf: np.ndarray, lo: int, hi: int) -> int | None:
    lo, hi = max(1, lo), min(len(acf) - 2, hi)
    if hi < lo:
        return None
    return lo + int(np.argmax(acf[lo:hi + 1]))


def _acf_period(acf: np.ndarray, bin_s: float, min_period_s: float,
                max_period_s: float | None) -> tuple[float, float, int, int] | None:
    """(lag in bins, acf there, zero-lag lobe width, last lag) of the autocorrelation's
    period, or None when there is none strong enough."""
    n = len(acf)
    below = np.nonzero(acf[1:] < 0)[0]
    if len(below) == 0:
        return None
    lobe = int(below[0]) + 1
    lo = max(lobe, int(np.ceil(min_period_s / bin_s)), 1)
    hi = n // 2
    if max_period_s is not None:
        hi = min(hi, int(max_period_s / bin_s))
    if hi - lo < 2:
        return None
    window = acf[lo:hi + 1]
    best = float(window.max())
    if best < MIN_ACF_PEAK:
        return None
    # the first local maximum reaching 90 % of the highest: a harmonic at 2T never wins
    peaks = [lo + i for i in range(1, len(window) - 1)
             if window[i] >= window[i - 1] and window[i] >= window[i + 1]
             and window[i] >= 0.9 * best]
    k = peaks[0] if peaks else lo + int(np.argmax(window))
    k = _subharmonic(acf, k, lo)
    lag = _refine(acf, k)
    estimates = [lag]
    for m in range(2, MAX_HARMONICS + 1):
        centre = int(round(m * lag))
        half = max(1, int(lag / 4))
        if centre + half >= n - 1 or centre > (n * 3) // 4:
            break
        km = _local_peak(acf, centre - half, centre + half)
        if km is None or acf[km] < 0.5 * acf[k]:
            break
        estimates.append(_refine(acf, km) / m)
    return estimates[-1], float(acf[k]), lobe, hi


def _acf_near(acf: np.ndarray, lag: float) -> float:
    a, b = max(1, int(lag * 0.85)), min(len(acf) - 1, int(np.ceil(lag * 1.15)))
    return float(acf[a:b + 1].max()) if b >= a else -1.0


def _one_burst_per_period(acf: np.ndarray, lag: float) -> bool:
    """Is `lag` the period, rather than the spacing of several bursts per period?
    The autocorrelation near it must be positive and not clearly weaker than near
    2 or 3 times it (where several bursts per period would line up)."""
    here = _acf_near(acf, lag)
    if here <= 0:
        return False
    return all(_acf_near(acf, m * lag) < here / ONSET_ACF
               for m in (2, 3) if m * lag * 1.15 < len(acf) - 1)


def _onset_period(series: np.ndarray, min_gap_bins: float) -> tuple[float, float] | None:
    """(median onset interval, mean period over the onsets) in bins; None: too few.

    How many periods an interval spans is read from the bytes it carried, not from
    its length: every step synchronises the same gradient bytes, so an interval with
    about the median interval's bytes is one period however long the step took (a
    slow step on a loaded machine is 2-4 medians long and still one period), one
    with twice the bytes spans two (an onset was missed), and one with under half
    (a burst split by a pause) spans none."""
    onsets = burst_onsets(series, min_gap_bins)
    if len(onsets) < MIN_ONSETS:
        return None
    gaps = np.diff(onsets)
    median = float(np.median(gaps))
    if median <= 0:
        return None
    x = np.asarray(series, dtype=float)
    cuts = np.rint(np.asarray(onsets)).astype(int)
    carried = np.array([x[a:b].sum() for a, b in zip(cuts[:-1], cuts[1:])])
    typical = float(np.median(carried))
    if typical <= 0:
        return None
    ratio = carried / typical
    periods = float(np.where(ratio < 0.5, 0.0, np.maximum(1.0, np.rint(ratio))).sum())
    if periods <= 0:
        return None
    return median, (onsets[-1] - onsets[0]) / periods


def sync_period(series: np.ndarray, bin_s: float, min_period_s: float = 0.0,
                max_period_s: float | None = None) -> tuple[float, float] | None:
    """(T in seconds, autocorrelation at T), or None when the series is not periodic.

    The autocorrelation decides whether there is a period and gives a coarse one;
    burst onsets give T (see the module doc), first merged only within the zero-lag
    lobe (one onset per burst), kept unless the autocorrelation says several bursts
    make one period; else merged within half the coarse period."""
    x = np.asarray(series, dtype=float)
    acf = autocorrelation(x)
    coarse = _acf_period(acf, bin_s, min_period_s, max_period_s)
    if coarse is None:
        return None
    lag, peak, lobe, hi = coarse
    lo = max(lobe, min_period_s / bin_s)
    per_burst = _onset_period(x, lobe)
    if per_burst is not None and lo <= per_burst[0] <= hi and \
            _one_burst_per_period(acf, per_burst[0]):
        return per_burst[1] * bin_s, _acf_near(acf, per_burst[1])
    merged = _onset_period(x, 0.5 * lag)
    if merged is not None and 0.5 * lag <= merged[0] <= 1.5 * lag:
        return merged[1] * bin_s, _acf_near(acf, merged[1])
    return lag * bin_s, peak


def burst_onsets(series: np.ndarray, min_gap_bins: float) -> list[float]:
    """Sub-bin positions where the rate rises through ONSET_LEVEL x the robust peak,
    keeping only the first of onsets closer than min_gap_bins."""
    x = np.asarray(series, dtype=float)
    if len(x) < 2:
        return []
    level = ONSET_LEVEL * float(np.percentile(x, PEAK_PERCENTILE))
    if level <= 0:
        return []
    rising = np.nonzero((x[:-1] < level) & (x[1:] >= level))[0] + 1
    out: list[float] = []
    for j in rising:
        # bins j-1 and j hold the partly filled start of the burst: measured against
        # the full rate (the larger of j, j+1), their fill says where it began
        full = max(x[j], x[j + 1] if j + 1 < len(x) else 0.0)
        pos = j + 1 - (x[j - 1] + x[j]) / full
        pos = min(max(pos, j - 1.0), j + 1.0)
        if not out or pos - out[-1] >= min_gap_bins:
            out.append(float(pos))
    return out


def burst_level(series: np.ndarray) -> float:
    """Rate threshold (bytes per bin) above which a bin counts as in a burst."""
    x = np.asarray(series, dtype=float)
    if len(x) == 0:
        return 0.0
    return BURST_LEVEL * float(np.percentile(x, PEAK_PERCENTILE))


def burst_bandwidth(series: np.ndarray, bin_s: float) -> float:
    """B: mean bytes per second over the bins in a burst (0 for a silent series)."""
    x = np.asarray(series, dtype=float)
    level = burst_level(x)
    if level <= 0:
        return 0.0
    return float(x[x >= level].mean() / bin_s)


def duty_cycle(series: np.ndarray) -> float:
    """D: fraction of bins in a burst."""
    x = np.asarray(series, dtype=float)
    level = burst_level(x)
    if level <= 0:
        return 0.0
    return float(np.count_nonzero(x >= level) / len(x))


def duty_from_windows(windows: Iterable[tuple[float, float]], t0: float, t1: float) -> float:
    """D from (start, end) windows: the time [t0, t1) has one or more in flight, over
    t1 - t0 (overlapping windows, e.g. two threads' collectives, count once)."""
    if t1 <= t0:
        return 0.0
    busy, reach = 0.0, t0
    for start, end in sorted(windows):
        start, end = max(start, reach), min(end, t1)
        if end > start:
            busy += end - start
            reach = end
    return busy / (t1 - t0)


def fit(series: np.ndarray, bin_s: float, min_period_s: float = 0.0,
        max_period_s: float | None = None) -> TrafficModel:
    """T, B and D of one bandwidth series (bytes per bin of bin_s seconds)."""
    x = np.asarray(series, dtype=float)
    found = sync_period(x, bin_s, min_period_s, max_period_s)
    # plain floats: a numpy scalar is no float on the wire (the collector refuses it)
    return TrafficModel(
        period_s=float(found[0]) if found else None,
        acf_peak=float(found[1]) if found else 0.0,
        burst_bytes_per_s=float(burst_bandwidth(x, bin_s)),
        duty_cycle=float(duty_cycle(x)),
        mean_bytes_per_s=float(x.mean() / bin_s) if len(x) else 0.0,
        window_s=len(x) * bin_s)
