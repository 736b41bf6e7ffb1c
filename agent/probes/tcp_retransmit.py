"""Probe tcp_retransmit: every TCP retransmission sent from this node's addresses.

Hooks tcp/tcp_retransmit_skb (+ tcp/tcp_retransmit_synack) and TC egress on the
interfaces holding the node's addresses; see bpf/tcp_retransmit.bpf.c for why
both. Exports `tcp_retransmit` (what TcpRetransSegs counts: sum(segs) equals it)
and `tcp_retransmit_skipped` (attempts abandoned before the count), see
fabricscope/measurements/tcp.py.

Cost (measured with BPF run-time stats, veth, 50 MiB with 2 % loss): TC egress
~470 ns per egress skb (GSO: ~17 skbs per MiB sent, so ~8 us of CPU per MiB);
the tracepoint ~3.5 us per retransmitted skb. Both are exported as
probe_events_total{event="bpf_run_ns"|"bpf_runs"} while kernel.bpf_stats_enabled=1.

Measured here (veth pair on a bridge, nft 2 % loss of skbs, 50 MiB, TSO on):
TcpRetransSegs 1043, tracepoint events with err 0: 31, sum(segs): 1043; with
tso/gso/gro off on both ends 732 vs 724 events (TCP keeps building GSO skbs),
sum(segs) 732. Lab acceptance (tests/kernel/test_e2e_retransmits.py, 3 nodes,
gloo DDP, 2 % loss on node 1) passes with sum(segs) per node.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import logging

from agent import addresses as addrs
from agent import bpf
from agent.probes.base import Probe, ProbeUnavailable
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.tcp_retransmit")

FAMILY = "tcp_retransmit"
KIND_SKB, KIND_SYNACK = 1, 2
STATS = ("hits", "emitted", "lost", "segs_unknown", "tc_packets")   # FS_STAT_* order
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING", 12: "NEW_SYN_RECV"}


# Mirrors of bpf/tcp_retransmit.h (checked against the compiled layout at load).
class FsAddr(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint8 * 16)]


class FsFlow(ctypes.Structure):
    _fields_ = [("saddr", FsAddr), ("daddr", FsAddr), ("sport", ctypes.c_uint16),
                ("dport", ctypes.c_uint16)]


class RetransmitEvent(ctypes.Structure):
    _fields_ = [("ts_ns", ctypes.c_uint64), ("flow", FsFlow), ("family", ctypes.c_uint16),
                ("segs", ctypes.c_uint16), ("state", ctypes.c_int32), ("err", ctypes.c_int32),
                ("kind", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


def addr_key(text: str) -> bytes:
    """16-byte map key: IPv6 as is, IPv4 as v4-mapped (what the BPF side compares)."""
    ip = ipaddress.ip_address(text)
    if ip.version == 4:
        ip = ipaddress.IPv6Address("::ffff:" + str(ip))
    return ip.packed


def addr_text(raw: bytes) -> str:
    ip = ipaddress.IPv6Address(bytes(raw))
    return str(ip.ipv4_mapped or ip)


# Errors __tcp_retransmit_skb returns before it adds to TcpRetransSegs (it retries
# later). Any other error comes from the transmit itself, after the count: a
# positive NET_XMIT_DROP from the qdisc, -ENOBUFS, -EPERM (netfilter), ...
# (EHOSTUNREACH is also what ip_queue_xmit returns without a route; that case is
# counted by the kernel but filed here as skipped: both are rare, the first usual.)
SKIPPED_ERRNOS = frozenset({errno.EBUSY, errno.ENOMEM, errno.EAGAIN, errno.EHOSTUNREACH})
NET_XMIT = {1: "NET_XMIT_DROP", 2: "NET_XMIT_CN"}


def err_name(err: int) -> str:
    if err > 0:
        return NET_XMIT.get(err, f"NET_XMIT_{err}")
    return errno.errorcode.get(-err, str(err))


def decode(raw: bytes, to_wall) -> Record:
    """One ring buffer event (bytes of struct fs_retransmit_event) -> Record.

    tcp_retransmit: what the kernel counts in TcpRetransSegs (sent, or failed in the
    transmit itself); tcp_retransmit_skipped: attempts given up before that."""
    if len(raw) < ctypes.sizeof(RetransmitEvent):
        raise ValueError(f"event of {len(raw)} bytes, expected {ctypes.sizeof(RetransmitEvent)}")
    ev = RetransmitEvent.from_buffer_copy(raw[:ctypes.sizeof(RetransmitEvent)])
    tags = {"saddr": addr_text(ev.flow.saddr.a), "daddr": addr_text(ev.flow.daddr.a),
            "sport": str(ev.flow.sport), "dport": str(ev.flow.dport),
            "state": TCP_STATES.get(ev.state, str(ev.state))}
    time_ns = to_wall(ev.ts_ns)
    if ev.err < 0 and -ev.err in SKIPPED_ERRNOS:
        tags["reason"] = err_name(ev.err)
        return Record("tcp_retransmit_skipped", time_ns, tags, {"err": int(ev.err)})
    return Record("tcp_retransmit", time_ns, tags,
                  {"segs": max(1, int(ev.segs)), "err": int(ev.err)})


class TcpRetransmitProbe(Probe):
    name = "tcp_retransmit"
    needs_bpf = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self._bpf = None
        self._tc: bpf.TcEgress | None = None
        self._pending: list[Record] = []
        self._decode_errors = 0

    def _cflags(self) -> list[str]:
        fields = bpf.tracepoint_fields("tcp", "tcp_retransmit_skb")
        if fields is None:
            raise ProbeUnavailable("tracepoint tcp/tcp_retransmit_skb does not exist "
                                   "(kernel without CONFIG_TRACEPOINTS or older than 4.15)")
        flags = [f"-DMAX_ADDRS={max(64, len(self.ctx.addresses))}", "-Wno-unused-function"]
        if "err" in fields:
            flags.append("-DFS_TP_HAS_ERR")
        if bpf.tracepoint_fields("tcp", "tcp_retransmit_synack") is not None:
            flags.append("-DFS_TP_SYNACK")
        return flags + list(self.ctx.cflags)

    def attach(self) -> None:
        if not self.ctx.addresses:
            raise ProbeUnavailable("no node addresses to attribute retransmits to")
        self._bpf = bpf.compile_program(FAMILY, self._cflags())
        try:
            bpf.check_layout(RetransmitEvent, self._bpf[b"event_layout"].Leaf)
            own = self._bpf[b"own_addrs"]
            for text in sorted(self.ctx.addresses):
                key = own.Key()
                ctypes.memmove(ctypes.addressof(key), addr_key(text), 16)
                own[key] = ctypes.c_uint8(1)
            self._bpf[b"events"].open_ring_buffer(self._on_event)
            self._attach_tc()
        except BaseException:
            self.detach()
            raise

    def _attach_tc(self) -> None:
        ifaces = addrs.interfaces_owning(self.ctx.addresses)
        if not ifaces:
            log.warning("tcp_retransmit: no Ethernet interface here holds %s; segment counts "
                        "fall back to 1 per retransmit", ", ".join(sorted(self.ctx.addresses)))
            return
        fn = self._bpf.load_func(b"tc_egress", type(self._bpf).SCHED_CLS)
        self._tc = bpf.TcEgress(fn)
        self._tc.attach(ifaces)
        log.info("tcp_retransmit: attached for %s (TC egress on %s)",
                 ", ".join(sorted(self.ctx.addresses)), ", ".join(i.name for i in ifaces))

    def _on_event(self, _ctx, data, size) -> int:
        try:
            self._pending.append(decode(ctypes.string_at(data, size), self.ctx.clock.to_wall))
        except ValueError as exc:
            self._decode_errors += 1
            log.debug("tcp_retransmit: undecodable event: %s", exc)
        return 0

    def poll(self) -> list[Record]:
        if self._bpf is None:
            return []
        self._bpf.ring_buffer_consume()
        out, self._pending = self._pending, []
        return out

    def stats(self) -> dict[str, int]:
        if self._bpf is None:
            return {}
        out = dict(zip(STATS, bpf.percpu_sums(self._bpf[b"stats"], len(STATS))))
        out["decode_errors"] = self._decode_errors
        # Cost of our programs, when the kernel's BPF stats are on (else 0).
        out["bpf_run_ns"], out["bpf_runs"] = bpf.prog_run_stats(
            fn.fd for fn in self._bpf.funcs.values())
        return out

    def detach(self) -> None:
        if self._tc is not None:
            self._tc.detach()
            self._tc = None
        if self._bpf is not None:
            b, self._bpf = self._bpf, None
            b.cleanup()

