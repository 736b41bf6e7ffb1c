"""The received bins of the last seconds, per interface, for the traffic model's B.

B, the burst bandwidth of a training job, is the rate of the busiest nic_bin_us bins
inside its collective windows: what the wire carried while the ring ran, not an
average over the step. The gloo probe knows the windows and not the bins; the NIC
probe knows the bins and not the windows, and drains them every poll, long before
a model is fitted. So the NIC probe keeps its RX bins of the last `keep_s` here
(ProbeContext.nic_bins) and the gloo probe asks for the peaks of its windows when it
fits a model (agent/probes/gloo/records.py). RX, because it is what arrived over
the link, after every shaper on the way; TX is counted before the local qdisc.

Only non-empty bins are kept (index and bytes, as the rings' drains give them): an
idle link costs nothing, a saturated one at 100 us bins 10,000 bins (160 kB) a
second. Pure logic, no root; the probe feeds it under its poll, the gloo probe reads
it under its own, so a lock guards the chunks.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

KEEP_S = 30.0           # the default gloo_model_window_s (10 s) and a margin


@dataclass(frozen=True)
class WindowPeaks:
    """The busiest bins of some collective windows on one interface."""

    interface: str
    peak_bytes_per_s: float     # median over the windows of each one's busiest bin
    windows: int                # windows the median is over (those with traffic)
    line_rate_bps: int | None   # the interface's line rate; None: unknown


class _Link:
    def __init__(self) -> None:
        self.chunks: deque[tuple[np.ndarray, np.ndarray]] = deque()   # (index, bytes)
        self.line_rate_bps: int | None = None


class BinHistory:
    def __init__(self, bin_ns: int, keep_s: float = KEEP_S):
        self.bin_ns = bin_ns
        self.keep_bins = int(keep_s * 1e9) // bin_ns
        self._links: dict[str, _Link] = {}
        self._upto = 0              # every bin below it has been drained (0: none yet)
        self._first = None          # the first bin counted
        self._lock = threading.Lock()

    def add(self, interface: str, index: np.ndarray, nbytes: np.ndarray,
            line_rate_bps: int | None) -> None:
        """One drain's non-empty bins of one interface (indices ascending)."""
        with self._lock:
            link = self._links.setdefault(interface, _Link())
            link.line_rate_bps = line_rate_bps
            if len(index):
                link.chunks.append((np.array(index, np.int64), np.array(nbytes, np.int64)))

    def drained(self, first: int, upto: int) -> None:
        """Every bin from `first` (the probe's first) to below `upto` has been added; the
        oldest beyond keep_s are forgotten."""
        with self._lock:
            self._first = first if self._first is None else self._first
            self._upto = max(self._upto, upto)
            oldest = self._upto - self.keep_bins
            for link in self._links.values():
                while link.chunks and link.chunks[0][0][-1] < oldest:
                    link.chunks.popleft()

    def peaks(self, windows: list[tuple[int, int]]) -> WindowPeaks | None:
        """The peaks of `windows` ((start_ns, end_ns) on the monotonic clock, merged and
        sorted by the caller or not) on the interface that received the most bytes
        inside them. Only windows whose every bin was drained and is still kept count;
        None: none such, or no traffic in them."""
        with self._lock:
            if self._first is None:
                return None
            lo_bin = max(self._first, self._upto - self.keep_bins)
            spans = _bin_spans(windows, self.bin_ns, lo_bin, self._upto)
            if not len(spans):
                return None
            best = None
            for name, link in self._links.items():
                per_window, total = _window_peaks(link.chunks, spans)
                if total > 0 and (best is None or total > best[0]):
                    best = (total, name, per_window, link.line_rate_bps)
        if best is None:
            return None
        _, name, per_window, rate = best
        busy = per_window[per_window > 0]
        return WindowPeaks(name, float(np.median(busy)) * 1e9 / self.bin_ns, len(busy), rate)


def _bin_spans(windows: list[tuple[int, int]], bin_ns: int, lo_bin: int,
               upto: int) -> np.ndarray:
    """[first bin, last bin] of each window (its partly covered edge bins included),
    merged where they overlap, of the windows lying within [lo_bin, upto)."""
    if not windows:
        return np.zeros((0, 2), np.int64)
    w = np.array(sorted(windows), np.int64).reshape(-1, 2)
    first, last = w[:, 0] // bin_ns, np.maximum(w[:, 0], w[:, 1]) // bin_ns
    keep = (first >= lo_bin) & (last < upto)
    first, last = first[keep], last[keep]
    out: list[list[int]] = []
    for a, b in zip(first.tolist(), last.tolist()):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out, np.int64).reshape(-1, 2)


def _window_peaks(chunks, spans: np.ndarray) -> tuple[np.ndarray, int]:
    """(busiest bin's bytes per span, bytes in all spans) of one interface's bins."""
    if not chunks:
        return np.zeros(len(spans), np.int64), 0
    index = np.concatenate([c[0] for c in chunks])
    nbytes = np.concatenate([c[1] for c in chunks])
    lo = np.searchsorted(index, spans[:, 0], side="left")
    hi = np.searchsorted(index, spans[:, 1], side="right")
    sums = np.concatenate([[0], np.cumsum(nbytes)])
    total = int((sums[hi] - sums[lo]).sum())
    peaks = np.zeros(len(spans), np.int64)
    has = hi > lo
    if has.any():
        bounds = np.empty(2 * int(has.sum()), np.int64)
        bounds[0::2], bounds[1::2] = lo[has], hi[has]
        peaks[has] = np.maximum.reduceat(np.append(nbytes, 0), bounds)[0::2]
    return peaks, total
