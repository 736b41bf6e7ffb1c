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
from typing import NamedTuple

import numpy as np

from fabricscope.agent.probes.nic.ring import Bins


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


class Burst(NamedTuple):
    """A tuple: a busy link makes hundreds a second, and a frozen dataclass costs four
    times as much to create."""

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
                self._feed(bins, hot_bytes, out)
        if self._open is not None and upto > self._open.end_bin + 1:
            out.append(self._open.close())   # the bin after it was empty
            self._open = None
        return out

    def flush(self) -> list[Burst]:
        """At shutdown: report a burst still open."""
        out = [self._open.close()] if self._open is not None else []
        self._open = None
        return out

    def _feed(self, bins: Bins, hot_bytes: float, out: list[Burst]) -> None:
        """Runs of hot bins become bursts, with numpy over all the bins and a Python loop
        over the bursts only (a DDP job makes hundreds a second per link). Position 0 is
        the bin carried from the last feed: hot only as the end of a burst still open,
        and a head no second burst may take once a burst claimed it as its tail."""
        prev, open_ = self._prev, self._open
        cols = [bins.index, bins.bytes, bins.packets, bins.first_ns, bins.last_ns]
        if prev is not None:
            carried = (prev.index, prev.bytes, prev.packets, prev.first_ns, prev.last_ns)
            cols = [np.concatenate([np.array([c], np.int64), col]) for c, col in zip(carried, cols)]
        index, nbytes, packets, first_ns, last_ns = cols
        n = len(index)
        hot = nbytes >= hot_bytes
        if prev is not None:
            hot[0] = open_ is not None
        next_to = np.zeros(n, bool)                       # [i]: bin i follows bin i-1
        next_to[1:] = index[1:] == index[:-1] + 1
        joined = np.zeros(n, bool)
        joined[1:] = hot[1:] & hot[:-1] & next_to[1:]
        starts = np.flatnonzero(hot & ~joined)            # maximal runs of hot bins
        ends = np.flatnonzero(hot & ~np.append(joined[1:], False))
        tails, heads = ends + 1, starts - 1
        closes = tails < n                    # a bin after the run: it ends there
        tail_ok = closes.copy()               # ... and that bin, adjacent, is its tail
        tail_ok[closes] = next_to[tails[closes]]
        head_claimed = np.zeros(len(starts), bool)        # the run before took it as tail
        head_claimed[1:] = tail_ok[:-1] & (tails[:-1] == heads[1:])
        if prev is not None and prev.claimed:
            head_claimed |= heads == 0
        head_ok = (heads >= 0) & next_to[starts] & ~head_claimed
        a = np.where(head_ok, heads, starts)  # each burst's positions: a..b
        b = np.where(tail_ok, tails, ends)
        continues = open_ is not None and len(starts) > 0 and starts[0] == 0
        if continues:
            a[0] = 1                          # bin 0 is in the open burst already
        zero = np.zeros(1, np.int64)
        cb = np.concatenate([zero, np.cumsum(nbytes)])
        cp = np.concatenate([zero, np.cumsum(packets)])
        ch = np.concatenate([zero, np.cumsum(hot)])
        bounds = np.empty(2 * len(a), np.int64)
        bounds[0::2], bounds[1::2] = a, b + 1
        peaks = np.maximum.reduceat(np.append(nbytes, 0), bounds)[0::2] if len(a) else zero
        for k, (ak, bk, close, start_ns, add_bytes, add_packets, add_hot, peak, end_bin,
                end_ns) in enumerate(zip(
                    a.tolist(), b.tolist(), closes.tolist(), first_ns[a.clip(0, n - 1)].tolist(),
                    (cb[b + 1] - cb[a]).tolist(), (cp[b + 1] - cp[a]).tolist(),
                    (ch[b + 1] - ch[a]).tolist(), peaks.tolist(), index[b].tolist(),
                    last_ns[b].tolist())):
            if k == 0 and continues:
                burst = open_
                if bk < ak:                   # nothing beyond bin 0 (an empty range)
                    add_bytes = add_packets = add_hot = peak = 0
                    end_bin, end_ns = burst.end_bin, burst.end_ns
            elif close:                       # begins and ends here: no _Open needed
                out.append(Burst(start_ns, end_ns, add_bytes, add_packets, peak, add_hot,
                                 bk - ak + 1))
                self._open = None
                continue
            else:
                burst = _Open(start_ns, 0, 0)
            burst.bytes += add_bytes
            burst.packets += add_packets
            burst.hot_bins += add_hot
            burst.peak_bytes = max(burst.peak_bytes, peak)
            burst.bins += max(0, bk - ak + 1)
            burst.end_bin, burst.end_ns = end_bin, end_ns
            if close:
                out.append(burst.close())
                self._open = None
            else:
                self._open = burst
        i = n - 1
        self._prev = _Prev(int(index[i]), int(nbytes[i]), int(packets[i]), int(first_ns[i]),
                           int(last_ns[i]), bool(len(b) and b[-1] == i))


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


def window_shift(wall_offset_ns: int, bin_ns: int, per_window: int) -> int:
    """The shift (in bins) that starts the windows where the wall clock (monotonic +
    wall_offset_ns) passes a multiple of the window, to a bin: the agents cut their
    TCP windows at their poll just after each wall-clock second (agent/pipeline.py),
    and a NIC window at a phase of its own in the second ended after that poll, so
    its second reached the store a poll later than the node's TCP windows of the
    same second (the engine's first read of a second found no NIC peak in it)."""
    return (wall_offset_ns // bin_ns) % per_window


@dataclass(frozen=True)
class WindowGrid:
    """Where windows of `per_window` bins start: at each bin whose index plus `shift` is
    a multiple of per_window (the probe shifts them onto the wall clock's seconds:
    window_shift). The rings' assemblers and the probe's per-window reads cut alike."""

    per_window: int
    shift: int = 0

    def index(self, bin_index):
        """The window a bin (an int, or an array of them) falls in."""
        return (bin_index + self.shift) // self.per_window

    def start_bin(self, window: int) -> int:
        return window * self.per_window - self.shift


class WindowAssembler:
    """Cuts the bin stream of one ring into the windows of WindowGrid(per_window, shift)."""

    def __init__(self, bin_ns: int, per_window: int, start_bin: int, shift: int = 0):
        self.bin_ns, self.grid = bin_ns, WindowGrid(per_window, shift)
        self._window = self.grid.index(start_bin + 1)
        self._covered_from = start_bin + 1        # first bin the probe counts
        self._reset()

    def _reset(self) -> None:
        self._bytes = self._packets = self._hot = self._lost = 0
        self._sizes: list[np.ndarray] = []

    def feed(self, bins: Bins, lost: int, upto: int, hot_bytes: float) -> list[WindowStats]:
        """Add the bins of a drain (all < upto); returns the windows that ended before upto."""
        self._lost += lost
        out: list[WindowStats] = []
        windows = self.grid.index(bins.index)
        lo = 0
        while True:
            end_bin = self.grid.start_bin(self._window + 1)
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
        start_bin = self.grid.start_bin(self._window)
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
