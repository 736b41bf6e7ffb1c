"""nic_ring: decoding the per-CPU bin rings from synthetic arrays (epochs, wrap, late drains)."""

import numpy as np
import pytest

from fabricscope.agent.probes.nic.ring import BIN_DTYPE, RingSet, merge, slot_ranges

BIN_NS = 100_000
SLOTS = 16
CPUS = 2


class FakeRings:
    """The per-CPU array as the kernel program would leave it (bpf/nic.bpf.c count_bin)."""

    def __init__(self, rings: int = 1, slots: int = SLOTS, cpus: int = CPUS):
        self.slots = slots
        self.data = np.zeros((rings * slots, cpus), BIN_DTYPE)
        self.reads: list[tuple[int, int]] = []

    def packet(self, ring: int, cpu: int, ts_ns: int, nbytes: int, segs: int = 1) -> None:
        b = ts_ns // BIN_NS
        off = ts_ns - b * BIN_NS
        slot = self.data[ring * self.slots + (b & (self.slots - 1)), cpu]
        if slot["epoch"] != b % 2**32:
            slot["epoch"], slot["bytes"], slot["packets"], slot["first_off"] = b % 2**32, 0, 0, off
        slot["bytes"] += nbytes
        slot["packets"] += segs
        slot["last_off"] = off
        self.data[ring * self.slots + (b & (self.slots - 1)), cpu] = slot

    def read(self, first: int, count: int) -> np.ndarray:
        self.reads.append((first, count))
        return self.data[first:first + count].copy()


def at(b: int, off: int = 0) -> int:
    return b * BIN_NS + off


def test_slot_ranges_split_at_the_ring_end():
    assert slot_ranges(5, 9, 16) == [(5, 4)]
    assert slot_ranges(14, 18, 16) == [(14, 2), (0, 2)]
    assert slot_ranges(32, 48, 16) == [(0, 16)]
    assert slot_ranges(7, 7, 16) == []


def test_bins_sum_over_cpus_with_first_and_last_packet_times():
    fake = FakeRings()
    fake.packet(0, 0, at(101, 40_000), 1000)
    fake.packet(0, 1, at(101, 10_000), 500)
    fake.packet(0, 1, at(101, 90_000), 1500, segs=3)
    fake.packet(0, 0, at(103, 5), 60)
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=100)
    (d,) = rings.drain(upto=104)
    assert d.bins.index.tolist() == [101, 103]
    assert d.bins.bytes.tolist() == [3000, 60]
    assert d.bins.packets.tolist() == [5, 1]
    assert d.bins.first_ns.tolist() == [at(101, 10_000), at(103, 5)]
    assert d.bins.last_ns.tolist() == [at(101, 90_000), at(103, 5)]
    assert (d.lost, d.slots_read) == (0, 3)


def test_the_current_bin_is_left_for_the_next_drain_and_nothing_is_read_twice():
    fake = FakeRings()
    fake.packet(0, 0, at(101), 100)
    fake.packet(0, 0, at(102), 200)          # bin 102 still open at the first drain
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=100)
    (d1,) = rings.drain(upto=102)
    assert d1.bins.index.tolist() == [101]
    fake.packet(0, 0, at(102, 50_000), 300)   # more packets in bin 102
    (d2,) = rings.drain(upto=104)
    assert d2.bins.index.tolist() == [102]
    assert d2.bins.bytes.tolist() == [500]
    (d3,) = rings.drain(upto=104)             # a repeated drain finds nothing new
    assert len(d3.bins) == 0 and d3.slots_read == 0


def test_a_late_drain_does_not_double_count_a_slot_reused_by_a_later_bin():
    fake = FakeRings()
    fake.packet(0, 0, at(101), 100)
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=100)
    assert rings.drain(upto=102)[0].bins.bytes.tolist() == [100]
    fake.packet(0, 0, at(101 + SLOTS), 7)      # same slot, one ring later
    (d,) = rings.drain(upto=101 + SLOTS)       # that bin is not complete yet
    assert len(d.bins) == 0 and d.lost == 0
    (d,) = rings.drain(upto=102 + SLOTS)
    assert d.bins.index.tolist() == [101 + SLOTS] and d.bins.bytes.tolist() == [7]


def test_stale_epochs_from_an_older_lap_are_ignored():
    fake = FakeRings()
    fake.packet(0, 1, at(105), 999)            # before the probe's start bin: not ours
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=110)
    (d,) = rings.drain(upto=105 + SLOTS)       # bin 105+16 maps to the same slot
    assert len(d.bins) == 0


def test_wrap_before_the_drain_counts_lost_bins():
    fake = FakeRings()
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=100)
    for b in range(101, 101 + 3 * SLOTS):       # three laps of traffic, no drain
        fake.packet(0, 0, at(b), 10)
    upto = 101 + 3 * SLOTS
    (d,) = rings.drain(upto=upto)
    # only the last lap survives; every older bin is counted as lost
    assert d.bins.index.tolist() == list(range(upto - SLOTS, upto))
    assert d.lost == upto - SLOTS - 101
    assert sum(count for _, count in fake.reads) == SLOTS   # one lap read, not three


def test_a_slot_already_overwritten_by_the_next_lap_counts_as_lost():
    fake = FakeRings()
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=100)
    fake.packet(0, 0, at(101), 10)
    fake.packet(0, 0, at(101 + SLOTS), 20)     # overwrote bin 101 before the drain
    (d,) = rings.drain(upto=101 + SLOTS)
    assert len(d.bins) == 0
    assert d.lost == 1


def test_rings_are_independent():
    fake = FakeRings(rings=3)
    fake.packet(0, 0, at(101), 1)
    fake.packet(2, 1, at(101), 3)
    rings = RingSet(3, SLOTS, BIN_NS, fake.read, start_bin=100)
    out = rings.drain(upto=102)
    assert [d.bins.bytes.tolist() for d in out] == [[1], [], [3]]


def test_epoch_wraps_at_32_bits():
    big = 2**32 + 5                            # epoch stored as 5
    fake = FakeRings()
    fake.packet(0, 0, at(big), 42)
    rings = RingSet(1, SLOTS, BIN_NS, fake.read, start_bin=big - 1)
    (d,) = rings.drain(upto=big + 1)
    assert d.bins.index.tolist() == [big] and d.bins.first_ns.tolist() == [at(big)]


def test_merge_ignores_cpus_holding_other_bins():
    b = 7 + SLOTS
    rows = np.zeros((1, 3), BIN_DTYPE)
    rows[0, 0] = (b, 100, 1, 5, 5, 0)
    rows[0, 1] = (b - SLOTS, 999, 9, 0, 0, 0)  # older lap: stale
    rows[0, 2] = (b, 50, 2, 3, 80, 0)
    bins, lost, read = merge(rows, np.array([b]), BIN_NS, SLOTS)
    assert bins.bytes.tolist() == [150] and bins.packets.tolist() == [3]
    assert bins.first_ns.tolist() == [b * BIN_NS + 3] and bins.last_ns.tolist() == [b * BIN_NS + 80]
    assert (lost, read) == (0, 2)


def test_ring_size_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        RingSet(1, 12, BIN_NS, lambda *_: None, 0)


def test_an_idle_ring_is_not_read_and_loses_nothing_however_long_it_slept():
    fake = FakeRings(rings=2)
    counts = [0, 0]

    def packet(ring, ts_ns, nbytes):
        fake.packet(ring, 0, ts_ns, nbytes)
        counts[ring] += 1

    rings = RingSet(2, SLOTS, BIN_NS, fake.read, start_bin=100, packets=lambda: list(counts))
    packet(0, at(101), 100)
    d0, d1 = rings.drain(upto=103)
    assert d0.bins.bytes.tolist() == [100]
    assert [first // SLOTS for first, _ in fake.reads] == [0, 1]   # the first drain reads all
    fake.reads.clear()
    d0, d1 = rings.drain(upto=103 + 5 * SLOTS)          # idle far longer than the ring holds
    assert fake.reads == [] and (d0.lost, d1.lost) == (0, 0) and rings.skipped == 2
    packet(1, at(103 + 5 * SLOTS + 1), 70)              # ring 1 wakes up
    d0, d1 = rings.drain(upto=103 + 5 * SLOTS + 3)
    assert [r for r, _ in fake.reads] == [1 * SLOTS + (103 + 5 * SLOTS) % SLOTS]
    assert d1.bins.bytes.tolist() == [70] and d0.slots_read == 0


def test_possible_cpus_count_and_id_limit_of_a_cpulist(tmp_path):
    """Per-CPU maps hold one value per possible CPU; the mapped rings are indexed by CPU
    id, so a cpulist with a hole needs more regions than CPUs."""
    from fabricscope.agent.probes.nic.bpfmap import cpu_id_limit, possible_cpus
    for text, count, limit in [("0\n", 1, 1), ("0-1\n", 2, 2), ("0-3,8-11\n", 8, 12)]:
        path = tmp_path / "possible"
        path.write_text(text)
        assert (possible_cpus(path), cpu_id_limit(path)) == (count, limit)
