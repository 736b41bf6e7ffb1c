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
    bytes: int = 0
    packets: int = 0
    peak_bytes: int = 0
    hot_bins: int = 0
    bins: int = 0

    def close(self) -> Burst:
        return Burst(self.start_ns, self.end_ns, self.bytes, self.packets, self.peak_bytes,
                     self.hot_bins, self.bins)


@dataclass(frozen=True)
class _Prev:
    """The last non-empty bin seen, carried to the next feed."""

    index: int
    bytes: int
    packets: int
    first_ns: int
    last_ns: int
    claimed: bool       # part of a burst: cannot be the head of another


class _Batch:
    """One feed's bins with the carried bin in front (position 0), and prefix sums so
    that a run of positions sums in O(1): Python loops over runs, not over bins. What
    the loop over runs reads per position is also kept as Python lists: indexing a
    numpy array one element at a time costs ten times a list's."""

    def __init__(self, prev: _Prev | None, bins: Bins, hot_bytes: float, open_: bool):
        head = [] if prev is None else [prev]
        self.offset = len(head)
        cat = (lambda name: np.concatenate([np.array([getattr(p, name) for p in head],
                                                     np.int64), getattr(bins, name)]))
        index, nbytes, packets = cat("index"), cat("bytes"), cat("packets")
        self.hot = nbytes >= hot_bytes
        if head:   # the carried bin is hot only as the end of a burst still open
            self.hot[0] = open_
        self.claimed = [False] * len(index)
        if head:
            self.claimed[0] = prev.claimed
        zero = np.zeros(1, np.int64)
        self._cb = np.concatenate([zero, np.cumsum(nbytes)]).tolist()
        self._cp = np.concatenate([zero, np.cumsum(packets)]).tolist()
        self._ch = np.concatenate([zero, np.cumsum(self.hot)]).tolist()
        next_to = np.zeros(len(index), bool)               # [i]: bin i follows bin i-1
        next_to[1:] = index[1:] == index[:-1] + 1
        self._next_to = next_to
        self.next_to = next_to.tolist()
        self.index, self.bytes = index.tolist(), nbytes.tolist()
        self.packets = packets.tolist()
        self.first_ns, self.last_ns = cat("first_ns").tolist(), cat("last_ns").tolist()

    def runs(self) -> list[tuple[int, int]]:
        """(first, last) positions of maximal runs of consecutive hot bins."""
        hot, nxt = self.hot, self._next_to
        joined = np.zeros(len(hot), bool)
        joined[1:] = hot[1:] & hot[:-1] & nxt[1:]
        starts = np.flatnonzero(hot & ~joined)
        ends = np.flatnonzero(hot & ~np.append(joined[1:], False))
        return list(zip(starts.tolist(), ends.tolist()))

    def add(self, burst: _Open, a: int, b: int) -> None:
        """Add positions a..b (inclusive) to a burst."""
        burst.bytes += self._cb[b + 1] - self._cb[a]
        burst.packets += self._cp[b + 1] - self._cp[a]
        burst.hot_bins += self._ch[b + 1] - self._ch[a]
        burst.peak_bytes = max(burst.peak_bytes, max(self.bytes[a:b + 1]))
        burst.bins += b - a + 1
        burst.end_bin, burst.end_ns = self.index[b], self.last_ns[b]


class BurstDetector:
    def __init__(self) -> None:
        self._open: _Open | None = None
        self._prev: _Prev | None = None

    def feed(self, bins: Bins, upto: int, hot_bytes: float) -> list[Burst]:
        out: list[Burst] = []
        if len(bins):
            if self._open is None and not bool((bins.bytes >= hot_bytes).any()):
                last = len(bins) - 1          # fast path: nothing hot, nothing open
                self._prev = _Prev(int(bins.index[last]), int(bins.bytes[last]),
                                   int(bins.packets[last]), int(bins.first_ns[last]),
                                   int(bins.last_ns[last]), False)
            else:
                self._feed(_Batch(self._prev, bins, hot_bytes, self._open is not None), out)
        if self._open is not None and upto > self._open.end_bin + 1:
            out.append(self._open.close())   # the bin after it was empty
            self._open = None
        return out

    def flush(self) -> list[Burst]:
        """At shutdown: report a burst still open."""
        out = [self._open.close()] if self._open is not None else []
        self._open = None
        return out

    def _feed(self, batch: _Batch, out: list[Burst]) -> None:
        n = len(batch.index)
        for first, last in batch.runs():
            if first == 0 and self._open is not None:
                burst = self._open                     # continues: bin 0 is in it already
                if last > 0:
                    batch.add(burst, 1, last)
            else:
                burst = _Open(int(batch.first_ns[first]), 0, 0)
                head = first - 1
                if head >= 0 and batch.next_to[first] and not batch.claimed[head]:
                    burst.start_ns = int(batch.first_ns[head])   # the partly filled head bin
                    batch.add(burst, head, last)
                else:
                    batch.add(burst, first, last)
            batch.claimed[first:last + 1] = [True] * (last + 1 - first)
            self._open = burst
            tail = last + 1
            if tail < n:
                if batch.next_to[tail]:                # the partly filled tail bin ends it
                    batch.add(burst, tail, tail)
                    batch.claimed[tail] = True
                out.append(burst.close())              # else a gap of empty bins ended it
                self._open = None
        i = n - 1
        self._prev = _Prev(int(batch.index[i]), int(batch.bytes[i]), int(batch.packets[i]),
                           int(batch.first_ns[i]), int(batch.last_ns[i]), bool(batch.claimed[i]))


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


class BurstSelector:
    """Which bursts of one ring become records: per window at most `limit`, the largest
    by bytes (ties: the earlier), listed in time order. A burst belongs to the window its
    first packet falls in; every burst is counted there, listed or not, so the window
    record keeps the totals while a link that bursts all the time (a DDP job's every
    bucket) makes a bounded number of records."""

    def __init__(self, limit: int):
        self.limit = limit
        self._held: list[Burst] = []

    def add(self, bursts: list[Burst]) -> None:
        self._held += bursts

    def close(self, end_ns: int) -> tuple[list[Burst], int]:
        """Take the bursts that started before end_ns (a window's end): (listed, found)."""
        mine = [b for b in self._held if b.start_ns < end_ns]
        self._held = [b for b in self._held if b.start_ns >= end_ns]
        return self._pick(mine), len(mine)

    def flush(self) -> tuple[list[Burst], int]:
        """At shutdown: every burst still held, as one last window."""
        mine, self._held = self._held, []
        return self._pick(mine), len(mine)

    def _pick(self, bursts: list[Burst]) -> list[Burst]:
        if len(bursts) <= self.limit:
            return bursts
        order = sorted(range(len(bursts)), key=lambda i: (-bursts[i].bytes, i))[:self.limit]
        return [bursts[i] for i in sorted(order)]
