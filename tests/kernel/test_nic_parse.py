"""bpf/nic.bpf.c on crafted frames (BPF_PROG_TEST_RUN: no traffic leaves the kernel).

Each frame is run through the real TC program in the kernel; the test then reads
the flow map, the stats and the bin ring as the probe does and compares with what
the frame holds: IPv4/IPv6, TCP/UDP ports, DSCP and ECN CE, a VLAN tag left in
the frame, a later fragment (no ports), ARP (not IP), a TCP header cut off.
"""

from __future__ import annotations

import ipaddress
import struct
import time

import numpy as np
import pytest

from fabricscope.agent import bpf, kernel
from fabricscope.agent.probes.nic import bpfmap as nic_bpfmap
from fabricscope.agent.probes.nic.probe import register_interface
from fabricscope.agent.probes.nic.flows import KEY_DTYPE, VAL_DTYPE, FlowTable
from fabricscope.agent.probes.nic.ring import BIN_DTYPE, RingSet, mapped_reader

pytestmark = pytest.mark.root

BIN_NS = 100_000
SLOTS = 1024
MAC = bytes(6) + bytes(6)


def ipv4(proto: int, tos: int, payload: bytes, frag: int = 0, src="198.19.9.1",
         dst="198.19.9.2") -> bytes:
    return bytes([0x45, tos]) + struct.pack("!HHHBBH", 20 + len(payload), 0, frag, 64, proto, 0) \
        + ipaddress.IPv4Address(src).packed + ipaddress.IPv4Address(dst).packed + payload


def ipv6(nexthdr: int, tclass: int, payload: bytes) -> bytes:
    first = (6 << 28) | (tclass << 20)
    return struct.pack("!IHBB", first, len(payload), nexthdr, 64) \
        + ipaddress.IPv6Address("2001:2::1").packed + ipaddress.IPv6Address("2001:2::2").packed \
        + payload


def l4(sport: int, dport: int, size: int) -> bytes:
    return struct.pack("!HH", sport, dport) + bytes(size - 4)


FRAMES = {
    "tcp4_ef_ce": MAC + b"\x08\x00" + ipv4(6, (46 << 2) | 3, l4(40000, 5201, 1460)),
    "udp6_af11": MAC + b"\x86\xdd" + ipv6(17, (10 << 2) | 2, l4(1000, 2000, 100)),
    "udp4_vlan": MAC + b"\x81\x00\x00\x07\x08\x00" + ipv4(17, 0, l4(53, 3000, 50)),
    "udp4_frag": MAC + b"\x08\x00" + ipv4(17, 0, bytes(64), frag=100),
    "arp": MAC + b"\x08\x06" + bytes(28),
    "short": MAC + b"\x08\x00" + ipv4(6, 0, b""),     # TCP without its header
}


@pytest.fixture(scope="module")
def prog():
    kernel.prepare()
    b = bpf.compile_program("nic", [f"-DFS_NIC_BIN_NS={BIN_NS}", f"-DFS_NIC_RING_SLOTS={SLOTS}",
                                    f"-DFS_NIC_CPUS={nic_bpfmap.cpu_id_limit()}",
                                    "-DFS_NIC_RINGS=2", "-DFS_NIC_MAX_IFACES=1"])
    try:
        yield b
    finally:
        b.cleanup()


def test_an_interface_with_a_large_ifindex_is_found_in_the_hash():
    """Interfaces at or above FS_NIC_IFINDEX_SLOTS are looked up in fs_nic_ifaces (here
    the slots end at 1, so loopback, ifindex 1, is one of them)."""
    kernel.prepare()
    b = bpf.compile_program("nic", [f"-DFS_NIC_BIN_NS={BIN_NS}", f"-DFS_NIC_RING_SLOTS={SLOTS}",
                                    f"-DFS_NIC_CPUS={nic_bpfmap.cpu_id_limit()}",
                                    "-DFS_NIC_RINGS=2", "-DFS_NIC_MAX_IFACES=1",
                                    "-DFS_NIC_IFINDEX_SLOTS=1"])
    try:
        assert run(b, b"fs_nic_egress", FRAMES["tcp4_ef_ce"]) == -1
        assert stats(b)[1] == 1                                     # no_iface
        register_interface(b, 1, 0, 14, slots=1)
        assert len(b[b"fs_nic_ifaces"]) == 1
        assert run(b, b"fs_nic_egress", FRAMES["tcp4_ef_ce"], repeat=2) == -1
        assert stats(b)[1] == 1
        assert bpf.percpu_sums(b[b"fs_nic_ring_pkts"], 2) == [0, 2]
        assert len(flows(b, nic_bpfmap.possible_cpus())) == 1
    finally:
        b.cleanup()


def run(b, fn_name: bytes, frame: bytes, repeat: int = 1) -> int:
    fn = b.load_func(fn_name, type(b).SCHED_CLS)
    retval, _ns = nic_bpfmap.prog_test_run(fn.fd, frame, repeat)
    return retval


def stats(b) -> list[int]:
    return bpf.percpu_sums(b[b"stats"], 6)


def flows(b, cpus: int):
    row = nic_bpfmap.percpu_stride(VAL_DTYPE.itemsize) * cpus
    keys, values, n = nic_bpfmap.read_hash(b[b"fs_nic_flows"].map_fd, KEY_DTYPE.itemsize, row,
                                           64)
    deltas = FlowTable(cpus, 10**12, lambda _k: None).update(keys, values, n, 0)
    return {(d.proto, d.saddr, d.daddr, d.sport, d.dport, d.direction): d for d in deltas}


def test_parser_bins_and_stats_on_crafted_frames(prog):
    cpus = nic_bpfmap.possible_cpus()
    # no interface registered yet: counted, nothing else
    assert run(prog, b"fs_nic_ingress", FRAMES["arp"]) == -1      # TC_ACT_UNSPEC
    assert stats(prog)[:2] == [0, 1]        # skbs: not counted in the kernel (see below)
    register_interface(prog, 1, 0, 14)                              # loopback: test runs

    start_bin = time.monotonic_ns() // BIN_NS
    for name, frame in FRAMES.items():
        assert run(prog, b"fs_nic_ingress", frame, repeat=3) == -1, name
    assert run(prog, b"fs_nic_egress", FRAMES["tcp4_ef_ce"]) == -1
    end_bin = time.monotonic_ns() // BIN_NS

    s = dict(zip(("skbs", "no_iface", "not_ip", "short", "flow_full", "ring_miss"), stats(prog)))
    assert s == {"skbs": 0, "no_iface": 1, "not_ip": 3, "short": 3, "flow_full": 0,
                 "ring_miss": 0}
    # every skb of a watched interface is in its ring's count (the probe's skbs stat)
    assert bpf.percpu_sums(prog[b"fs_nic_ring_pkts"], 2) == [3 * len(FRAMES), 1]

    f = flows(prog, cpus)
    tcp = f[("tcp", "198.19.9.1", "198.19.9.2", 40000, 5201, "rx")]
    assert (tcp.bytes, tcp.packets, tcp.ce_marks, tcp.dscp) == \
        (3 * len(FRAMES["tcp4_ef_ce"]), 3, 3, 46)
    assert f[("tcp", "198.19.9.1", "198.19.9.2", 40000, 5201, "tx")].packets == 1
    udp6 = f[("udp", "2001:2::1", "2001:2::2", 1000, 2000, "rx")]
    assert (udp6.bytes, udp6.ce_marks, udp6.dscp) == (3 * len(FRAMES["udp6_af11"]), 0, 10)
    vlan = f[("udp", "198.19.9.1", "198.19.9.2", 53, 3000, "rx")]
    assert vlan.bytes == 3 * len(FRAMES["udp4_vlan"])
    frag = f[("udp", "198.19.9.1", "198.19.9.2", 0, 0, "rx")]
    assert frag.bytes == 3 * len(FRAMES["udp4_frag"])
    assert len(f) == 5

    # the bins hold every frame, ingress in ring 0 and egress in ring 1, read where the
    # kernel writes them (the array mapped into memory) and through bpf() alike
    ids = nic_bpfmap.cpu_id_limit()
    fd = prog[b"fs_nic_ring"].map_fd
    mapped = nic_bpfmap.map_array(fd, 2 * ids * SLOTS * BIN_DTYPE.itemsize)
    rings = RingSet(2, SLOTS, BIN_NS, mapped_reader(mapped, 2, ids, SLOTS), start_bin - 1)
    rx, tx = rings.drain(end_bin + 1)
    raw = np.frombuffer(nic_bpfmap.read_array_range(fd, 0, 2 * ids * SLOTS, BIN_DTYPE.itemsize),
                        BIN_DTYPE)
    assert int(raw["bytes"].sum()) == int(rx.bins.bytes.sum() + tx.bins.bytes.sum())
    # every registered run is binned, IP or not; the unregistered first run is not
    assert int(rx.bins.bytes.sum()) == 3 * sum(len(x) for x in FRAMES.values())
    assert int(rx.bins.packets.sum()) == 3 * len(FRAMES)
    assert int(tx.bins.bytes.sum()) == len(FRAMES["tcp4_ef_ce"])
    assert rx.lost == tx.lost == 0
    assert start_bin * BIN_NS <= int(rx.bins.first_ns.min()) <= int(rx.bins.last_ns.max()) \
        < (end_bin + 1) * BIN_NS


@pytest.mark.parametrize("parts, counts_bins, counts_flows", [
    (0, False, False), (1, False, False), (3, True, False), (5, False, True), (7, True, True)])
def test_each_part_of_the_program_can_be_left_out_for_the_cost_benchmark(parts, counts_bins,
                                                                         counts_flows):
    """bench/nic_parts.py compiles -DFS_NIC_PARTS=mask: each variant passes the verifier
    and does exactly its parts (0: not even the interface lookup, whose miss counts)."""
    kernel.prepare()
    b = bpf.compile_program("nic", [f"-DFS_NIC_BIN_NS={BIN_NS}", f"-DFS_NIC_RING_SLOTS={SLOTS}",
                                    f"-DFS_NIC_CPUS={nic_bpfmap.cpu_id_limit()}",
                                    "-DFS_NIC_RINGS=2", "-DFS_NIC_MAX_IFACES=1",
                                    f"-DFS_NIC_PARTS={parts}"])
    try:
        assert run(b, b"fs_nic_ingress", FRAMES["tcp4_ef_ce"]) == -1
        assert stats(b)[1] == (1 if parts else 0)                   # no_iface: the lookup ran
        register_interface(b, 1, 0, 14)
        for fn in (b"fs_nic_ingress", b"fs_nic_egress"):
            assert run(b, fn, FRAMES["tcp4_ef_ce"], repeat=2) == -1
        assert bpf.percpu_sums(b[b"fs_nic_ring_pkts"], 2) == ([2, 2] if counts_bins else [0, 0])
        assert len(flows(b, nic_bpfmap.possible_cpus())) == (2 if counts_flows else 0)
    finally:
        b.cleanup()
