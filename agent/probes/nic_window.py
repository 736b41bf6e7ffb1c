"""Window statistics and burst detection over drained bins (pure logic, no root).

Both consume, per ring, the successive outputs of nic_ring (non-empty complete
bins in order, plus `upto`: every bin below it has been seen, the missing ones
were empty). Neither needs a bin twice, so memory is one window of bin sizes.

A bin is hot when its utilization (bytes * 8 / bin length / link speed) is at
least the threshold. A burst is a run of consecutive hot bins, extended by the
non-empty bin just before and just after it: a burst rarely starts or ends on a
bin boundary, and its partly filled edge bins often stay under the threshold.
Its start and end are the first and last packet times recorded in those bins,
so they are exact to the packet, not to the bin. A burst is reported when it
has ended, so a link that stays saturated reports its burst at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from agent.probes.nic_ring import Bins


def p99(nonzero: np.ndarray, total: int, q: float = 0.99) -> float:
    """Nearest-rank q-quantile of `total` values: `nonzero` plus total - len(nonzero) zeros."""
    if total <= 0:
        return 0.0
    rank = max(1, math.ceil(q * total))          # 1-based rank in ascending order
    zeros = total - len(nonzero)
    if rank <= zeros:
        return 0.0
    k = rank - zeros - 1
    return float(np.partition(np.asarray(nonzero), k)[k])


@dataclass(frozen=True)
class Burst:
    start_ns: int       # monotonic: first packet
    end_ns: int         # monotonic: last packet
    bytes: int
    packets: int
    peak_bytes: int     # bytes of the busiest bin
    hot_bins: int
    bins: int


@dataclass
class _Open:
    start_ns: int
    end_ns: int
    end_bin: int
    bytes: int
    packets: int
    peak_bytes: int
    hot_bins: int
    bins: int

    def add(self, index: int, nbytes: int, packets: int, last_ns: int, hot: bool) -> None:
        self.end_bin, self.end_ns = index, last_ns
        self.bytes += nbytes
        self.packets += packets
        self.peak_bytes = max(self.peak_bytes, nbytes)
        self.hot_bins += hot
        self.bins += 1

    def close(self) -> Burst:
        return Burst(self.start_ns, self.end_ns, self.bytes, self.packets, self.peak_bytes,
                     self.hot_bins, self.bins)


class BurstDetector:
    def __init__(self) -> None:
        self._open: _Open | None = None
        # last non-empty bin seen: (index, bytes, packets, first_ns, claimed by a burst)
        self._prev: tuple[int, int, int, int, bool] | None = None

    def feed(self, bins: Bins, upto: int, hot_bytes: float) -> list[Burst]:
        out: list[Burst] = []
        if len(bins) and (self._open is not None or bool((bins.bytes >= hot_bytes).any())):
            for row in zip(bins.index.tolist(), bins.bytes.tolist(), bins.packets.tolist(),
                           bins.first_ns.tolist(), bins.last_ns.tolist()):
                self._step(row, hot_bytes, out)
        elif len(bins):
            self._prev = (int(bins.index[-1]), int(bins.bytes[-1]), int(bins.packets[-1]),
                          int(bins.first_ns[-1]), False)
        if self._open is not None and upto > self._open.end_bin + 1:
            out.append(self._open.close())   # the bin after it was empty
            self._open = None
        return out

    def flush(self) -> list[Burst]:
        """At shutdown: report a burst still open."""
        out = [self._open.close()] if self._open is not None else []
        self._open = None
        return out

    def _step(self, row, hot_bytes: float, out: list[Burst]) -> None:
        index, nbytes, packets, first_ns, last_ns = row
        hot = nbytes >= hot_bytes
        opened = self._open
        if opened is not None:
            if index == opened.end_bin + 1:
                opened.add(index, nbytes, packets, last_ns, hot)
                if not hot:                       # the partly filled tail bin ends it
                    out.append(opened.close())
                    self._open = None
                self._prev = (index, nbytes, packets, first_ns, True)
                return
            out.append(opened.close())            # a gap of empty bins ended it
            self._open = None
        if hot:
            burst = _Open(first_ns, last_ns, index, 0, 0, 0, 0, 0)
            prev = self._prev
            if prev is not None and prev[0] == index - 1 and not prev[4]:
                burst.start_ns = prev[3]          # the partly filled head bin
                burst.bytes, burst.packets, burst.peak_bytes, burst.bins = prev[1], prev[2], \
                    prev[1], 1
            burst.add(index, nbytes, packets, last_ns, True)
            self._open = burst
        self._prev = (index, nbytes, packets, first_ns, hot)


@dataclass(frozen=True)
class WindowStats:
    start_ns: int       # monotonic start of the window
    covered_bins: int   # bins of the window the probe watched (less in the first/last)
    bytes: int
    packets: int
    peak_bytes: int
    p99_bytes: float
    hot_bins: int
    lost_bins: int


class WindowAssembler:
    """Cuts the bin stream of one ring into windows of `per_window` bins."""

    def __init__(self, bin_ns: int, per_window: int, start_bin: int):
        self.bin_ns, self.per_window = bin_ns, per_window
        self._window = (start_bin + 1) // per_window
        self._covered_from = start_bin + 1        # first bin the probe counts
        self._reset()

    def _reset(self) -> None:
        self._bytes = self._packets = self._hot = self._lost = 0
        self._sizes: list[np.ndarray] = []

    def feed(self, bins: Bins, lost: int, upto: int, hot_bytes: float) -> list[WindowStats]:
        """Add the bins of a drain (all < upto); returns the windows that ended before upto."""
        self._lost += lost
        out: list[WindowStats] = []
        windows = bins.index // self.per_window
        lo = 0
        while True:
            end_bin = (self._window + 1) * self.per_window
            hi = int(np.searchsorted(windows, self._window, side="right"))
            self._add(bins.select(slice(lo, hi)), hot_bytes)
            lo = hi
            if end_bin > upto:
                break
            out.append(self._close(end_bin))
            self._window += 1
        return out

    def flush(self, upto: int) -> WindowStats | None:
        """At shutdown: the partial window up to `upto`, if it covered any bin."""
        if upto <= self._covered_from:
            return None
        return self._close(upto)

    def _add(self, bins: Bins, hot_bytes: float) -> None:
        if not len(bins):
            return
        self._bytes += int(bins.bytes.sum())
        self._packets += int(bins.packets.sum())
        self._hot += int(np.count_nonzero(bins.bytes >= hot_bytes))
        self._sizes.append(bins.bytes)

    def _close(self, end_bin: int) -> WindowStats:
        start_bin = self._window * self.per_window
        covered = end_bin - max(start_bin, self._covered_from)
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, np.int64)
        stats = WindowStats(start_bin * self.bin_ns, covered, self._bytes, self._packets,
                            int(sizes.max()) if len(sizes) else 0, p99(sizes, covered),
                            self._hot, self._lost)
        self._covered_from = end_bin
        self._reset()
        return stats
