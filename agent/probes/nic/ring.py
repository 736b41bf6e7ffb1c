"""Decode the NIC bin rings (pure logic: unit-tested with synthetic (bin, CPU) arrays).

Layout (bpf/nic.h): one array `fs_nic_ring` holding R rings of S slots per CPU
(S a power of two); bin b of ring r on CPU c lives at slot (r * C + c) * S +
(b & (S - 1)), as struct fs_nic_bin {u32 epoch, bytes, packets, first_off,
last_off, pad} where epoch = b mod 2**32. The agent maps the array into its
memory (mapped_reader); a SlotReader hands the merge one ring's slots as an
array of shape (count, CPUs), whatever the memory layout behind it.

Draining ring r up to bin `upto` (exclusive) consumes bins (last, upto), where
`last` is the last bin consumed before. A slot is taken only when its epoch is
exactly the bin expected there, so:
- a bin still being written (>= upto) is never read: the next drain takes it;
- a bin consumed before is never read twice: `last` moved past it;
- a slot that already holds a newer bin (the ring wrapped before the drain) loses
  the older one; bins older than upto - S are gone for the same reason. Both are
  counted in `lost` (bins, whether they had traffic or not: nobody can know).
All CPUs of a ring are drained up to the same bin in one read, so one `last` per
ring stands for the per-CPU watermarks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

BIN_DTYPE = np.dtype([("epoch", "<u4"), ("bytes", "<u4"), ("packets", "<u4"),
                      ("first_off", "<u4"), ("last_off", "<u4"), ("pad", "<u4")])
_EPOCH_MOD = 1 << 32

#: read(first_slot, count) -> array of shape (count, cpus) with dtype BIN_DTYPE, where
#: first_slot = ring * S + slot
SlotReader = Callable[[int, int], np.ndarray]


def mapped_reader(buffer, n_rings: int, cpus: int, slots: int) -> SlotReader:
    """A SlotReader over the ring array as the kernel lays it out (ring, CPU, slot),
    e.g. the BPF map's mmap: views, no copy (merge copies what it reads, at once)."""
    view = np.frombuffer(buffer, BIN_DTYPE, count=n_rings * cpus * slots).reshape(
        n_rings, cpus, slots)

    def read(first: int, count: int) -> np.ndarray:
        ring, slot = divmod(first, slots)
        return view[ring, :, slot:slot + count].T
    return read


@dataclass
class Bins:
    """Complete, non-empty bins of one ring, summed over CPUs, in bin order."""

    index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    packets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # monotonic
    last_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.index)

    def select(self, mask_or_slice) -> "Bins":
        return Bins(self.index[mask_or_slice], self.bytes[mask_or_slice],
                    self.packets[mask_or_slice], self.first_ns[mask_or_slice],
                    self.last_ns[mask_or_slice])


@dataclass
class Drained:
    bins: Bins
    lost: int           # bins lost to wrap in this drain
    slots_read: int     # non-empty (bin, CPU) slots consumed: what reached user space


def slot_ranges(lo: int, hi: int, slots: int) -> list[tuple[int, int]]:
    """Slot ranges (first, count) holding bins [lo, hi), hi - lo <= slots, in bin order."""
    n = hi - lo
    if n <= 0:
        return []
    first = lo & (slots - 1)
    if first + n <= slots:
        return [(first, n)]
    return [(first, slots - first), (0, n - (slots - first))]


def merge(rows: np.ndarray, expected: np.ndarray, bin_ns: int, slots: int) -> tuple[Bins, int, int]:
    """rows[i, cpu] should hold bin expected[i]. Returns (bins, lost, slots_read)."""
    n, cpus = rows.shape
    # one contiguous (field, cpu, bin) copy: numpy reduces fast across the outer axis
    # and slowly across a short inner one. Through (cpu, bin) first: the mapped ring
    # holds each CPU's bins in a row, so that step is a copy of a few rows.
    fields = np.ascontiguousarray(rows.T).view("<u4").reshape(
        cpus, n, len(BIN_DTYPE.names)).transpose(2, 0, 1).copy()
    epoch, nbytes, npkts, first_off, last_off = fields[0], fields[1], fields[2], fields[3], fields[4]
    want = (expected % _EPOCH_MOD).astype(np.uint32)
    valid = (epoch == want) & (npkts > 0)
    # uint32 differences wrap modulo 2**32, as epochs do; slots is a power of two
    ahead = epoch - want
    newer = (ahead != 0) & (ahead < _EPOCH_MOD // 2) & ((ahead & np.uint32(slots - 1)) == 0)
    lost = int(np.count_nonzero(newer.any(axis=0)))
    keep = valid.any(axis=0)
    if not keep.any():
        return Bins(), lost, 0
    valid, nbytes, npkts = valid[:, keep], nbytes[:, keep], npkts[:, keep]
    first_off, last_off = first_off[:, keep], last_off[:, keep]
    b = (nbytes * valid).sum(axis=0, dtype=np.int64)
    p = (npkts * valid).sum(axis=0, dtype=np.int64)
    first = np.where(valid, first_off, np.uint32(0xFFFFFFFF)).min(axis=0).astype(np.int64)
    last = np.where(valid, last_off, np.uint32(0)).max(axis=0).astype(np.int64)
    index = expected[keep].astype(np.int64)
    base = index * bin_ns
    return Bins(index, b, p, base + first, base + last), lost, int(np.count_nonzero(valid))


@dataclass
class Ring:
    """Consumption state of one ring (one interface and direction)."""

    ring_id: int
    last: int           # last bin consumed
    packets: int = -1   # the ring's packet count when last drained (-1: never)


class RingSet:
    """Every ring of the bin array, drained through one SlotReader."""

    def __init__(self, n_rings: int, slots: int, bin_ns: int, read: SlotReader, start_bin: int,
                 packets: Callable[[], Sequence[int]] | None = None):
        """packets: per ring, the packets the kernel counted so far (all CPUs); a ring
        whose count has not moved since its last drain is not read (idle)."""
        if slots & (slots - 1):
            raise ValueError(f"ring slots {slots} is not a power of two")
        self.slots, self.bin_ns, self.read, self.packets = slots, bin_ns, read, packets
        self.rings = [Ring(r, start_bin) for r in range(n_rings)]
        self.skipped = 0        # drains of idle rings that read nothing

    def drain(self, upto: int) -> list[Drained]:
        """Consume bins < upto of every ring; one Drained per ring, in ring order."""
        # Counts first: a packet counted after this read lands in a later drain.
        counts = list(self.packets()) if self.packets is not None else [None] * len(self.rings)
        return [self._drain(ring, upto, count) for ring, count in zip(self.rings, counts)]

    def _drain(self, ring: Ring, upto: int, count: int | None = None) -> Drained:
        if count is not None and count == ring.packets and upto > ring.last + 1:
            ring.last = upto - 1           # nothing arrived: every bin since is empty
            self.skipped += 1
            return Drained(Bins(), 0, 0)
        if count is not None:
            ring.packets = count
        lo = max(ring.last + 1, upto - self.slots)
        lost = max(0, lo - (ring.last + 1))
        if lo >= upto:
            return Drained(Bins(), lost, 0)
        parts = [self.read(ring.ring_id * self.slots + first, count)
                 for first, count in slot_ranges(lo, upto, self.slots)]
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        bins, wrapped, read = merge(rows, np.arange(lo, upto, dtype=np.int64), self.bin_ns,
                                    self.slots)
        ring.last = upto - 1
        return Drained(bins, lost + wrapped, read)
