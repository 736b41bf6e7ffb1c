"""Probe tcp_retransmit: every TCP retransmission sent from this node's addresses,
with its kind and the process that owns the flow.

Hooks tcp/tcp_retransmit_skb (+ tcp_retransmit_synack), tcp/tcp_cong_state_set
(+ tcp_destroy_sock) and TC egress on the interfaces holding the node's
addresses; see bpf/tcp_retransmit.bpf.c for why. Exports `tcp_retransmit` (what
TcpRetransSegs counts: sum(segs) equals it) and `tcp_retransmit_skipped`
(attempts abandoned before the count), see fabricscope/measurements/tcp.py.

Kinds (tag `kind`), from the socket's congestion state when it retransmitted:
  rto         the first retransmit after the socket entered Loss: the RTO timer's
              (one per timer firing; with syn and synack: nstat TcpExtTCPTimeouts)
  slow_start  later retransmits in Loss (TcpExtTCPSlowStartRetrans, in segments)
  fast        in Recovery: fast retransmit (TcpExtTCPFastRetrans, in segments); also
              more than one segment at once in Open, Disorder or CWR: the kernel
              sends those from its retransmit queue and counts them as fast too
              (a loss probe retransmits at most one MSS: tcp_send_loss_probe
              splits a larger tail first)
  tlp         one segment in Open, Disorder or CWR: a tail loss probe (at most
              TcpExtTCPLossProbes, which also counts probes that sent new data)
  syn         a SYN retransmitted (SYN_SENT); synack: a SYN-ACK (TcpExtTCPSynRetrans)
  unknown     the kernel has no tcp_cong_state_set (before 5.18)
Limits of the heuristic: a socket that changed congestion state before the probe
attached counts as Open until its next change; a retransmit in Open/CWR that is not
a probe (after an undo, or a path-MTU drop, which also enters Loss) is filed as tlp
or rto when it is a single segment; TcpExtTCPFastRetrans also counts single-segment
retransmits from the queue outside Recovery, which land in tlp here.

Misses: the kernel runs one tracepoint/kprobe BPF program per CPU at a time, and
none while a BPF map syscall runs there (agent/bpf.py: ProgStats); a tracepoint
that fires meanwhile on that CPU skips ours, and not every such skip is counted.
So retransmits are found where nothing is skipped: TC egress sees every packet
the node sends, and a packet consuming sequence space below the highest sequence
its socket sent is a retransmission, and with tcp_flows a SYN-ACK acknowledging
the same SYN as the flow's last one (bpf/tcp_retransmit.bpf.c); the congestion
state (the kind) and socket teardown come from raw tracepoints, which are skipped
far less often (tcp_flows recovers the teardowns they miss). The raw tcp_retransmit_skb tracepoint adds the attempts that
sent nothing (tcp_retransmit_skipped, and transmit failures after the count) and
counts retransmits the qdisc dropped after TC (retransmits_qdisc_dropped). Kernels
without raw tracepoints, and nodes whose addresses sit on no Ethernet interface,
fall back to the tracepoints (logged), whose skipped runs are exported as
probe_events_total{event="missed_retransmits"} and included in events_lost_total.

Cost (measured with BPF run-time stats, veth, 50 MiB with 2 % loss): TC egress
~470 ns per egress skb (GSO: ~17 skbs per MiB sent, so ~8 us of CPU per MiB);
the tracepoint ~3.5 us per retransmitted skb. Both are exported as
probe_events_total{event="bpf_run_ns"|"bpf_runs"} while kernel.bpf_stats_enabled=1.

Measured here (veth pair on a bridge, nft 2 % loss of skbs, 50 MiB, TSO on):
TcpRetransSegs 1043, tracepoint events with err 0: 31, sum(segs): 1043; with
tso/gso/gro off on both ends 732 vs 724 events (TCP keeps building GSO skbs),
sum(segs) 732. Lab acceptance: tests/kernel/test_e2e_retransmits.py and
tests/kernel/test_tcp_flows.py.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import re

from fabricscope.agent import addresses as addrs
from fabricscope.agent import bpf, tc
from fabricscope.agent.kernel import Capability
from fabricscope.agent.probes.tcp.owners import Owners
from fabricscope.agent.procmaps import shared_environments
from fabricscope.agent.probes.base import Probe, ProbeUnavailable
from fabricscope.agent.probes.base import ringbuf_pages as ringbuf_pages_for
from fabricscope.agent.probes.tcp.common import (FsFlow, addr_key, addr_text, fill_own_addrs,  # noqa: F401
                                     flow_key, flow_tags, state_name)
from fabricscope.agent.tc import TcPrograms
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.tcp_retransmit")

HOOK_SKB, HOOK_SYNACK = 1, 2
CA_OPEN, CA_DISORDER, CA_CWR, CA_RECOVERY, CA_LOSS, CA_UNKNOWN = 0, 1, 2, 3, 4, 0xff
SYN_SENT = 2
KINDS = ("fast", "rto", "slow_start", "tlp", "syn", "synack", "unknown")
#: FS_STAT_* order (bpf/tcp_retransmit.h)
STATS = ("hits", "emitted", "lost", "segs_unknown", "tc_packets", "tc_segs", "tc_bytes",
         "cong_set", "retransmits_qdisc_dropped", "tc_retransmits")


# Mirror of bpf/tcp_retransmit.h (checked against the compiled layout at load).
class RetransmitEvent(ctypes.Structure):
    _fields_ = [("ts_ns", ctypes.c_uint64), ("flow", FsFlow), ("family", ctypes.c_uint16),
                ("segs", ctypes.c_uint16), ("state", ctypes.c_int32), ("err", ctypes.c_int32),
                ("hook", ctypes.c_uint8), ("ca_state", ctypes.c_uint8),
                ("timeout", ctypes.c_uint8), ("pad", ctypes.c_uint8), ("bytes", ctypes.c_uint32)]


# Errors __tcp_retransmit_skb returns before it adds to TcpRetransSegs (it retries
# later). Any other error comes from the transmit itself, after the count: a
# positive NET_XMIT_DROP from the qdisc, -ENOBUFS, -EPERM (netfilter), ...
# (EHOSTUNREACH is also what ip_queue_xmit returns without a route; that case is
# counted by the kernel but filed here as skipped: both are rare, the first usual.)
SKIPPED_ERRNOS = frozenset({errno.EBUSY, errno.ENOMEM, errno.EAGAIN, errno.EHOSTUNREACH})
NET_XMIT = {1: "NET_XMIT_DROP", 2: "NET_XMIT_CN"}


def has_raw_tracepoints(release: str) -> bool:
    """BPF raw tracepoints came with Linux 4.17."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (4, 17)


def err_name(err: int) -> str:
    if err > 0:
        return NET_XMIT.get(err, f"NET_XMIT_{err}")
    return errno.errorcode.get(-err, str(err))


def retransmit_kind(hook: int, state: int, ca_state: int, timeout: int, segs: int = 1) -> str:
    """Name the retransmit (see the module docstring for the rules and their limits)."""
    if hook == HOOK_SYNACK:
        return "synack"
    if state == SYN_SENT:
        return "syn"
    if ca_state == CA_UNKNOWN:
        return "unknown"
    if timeout:
        return "rto"
    if ca_state == CA_LOSS:
        return "slow_start"
    if ca_state == CA_RECOVERY or segs > 1:
        return "fast"
    return "tlp"


def decode(raw: bytes, to_wall) -> Record:
    """One ring buffer event (bytes of struct fs_retransmit_event) -> Record.

    tcp_retransmit: what the kernel counts in TcpRetransSegs (sent, or failed in the
    transmit itself); tcp_retransmit_skipped: attempts given up before that."""
    if len(raw) < ctypes.sizeof(RetransmitEvent):
        raise ValueError(f"event of {len(raw)} bytes, expected {ctypes.sizeof(RetransmitEvent)}")
    ev = RetransmitEvent.from_buffer_copy(raw[:ctypes.sizeof(RetransmitEvent)])
    tags = {**flow_tags(flow_key(ev.flow)), "state": state_name(ev.state),
            "kind": retransmit_kind(ev.hook, ev.state, ev.ca_state, ev.timeout, ev.segs)}
    time_ns = to_wall(ev.ts_ns)
    if ev.err < 0 and -ev.err in SKIPPED_ERRNOS:
        tags["reason"] = err_name(ev.err)
        return Record("tcp_retransmit_skipped", time_ns, tags, {"err": int(ev.err)})
    fields = {"segs": max(1, int(ev.segs)), "err": int(ev.err)}
    if ev.segs:
        fields["payload_bytes"] = int(ev.bytes)
    return Record("tcp_retransmit", time_ns, tags, fields)


def record_flow(rec: Record) -> tuple[str, int, str, int]:
    t = rec.tags
    return (t["saddr"], int(t["sport"]), t["daddr"], int(t["dport"]))


def tag_owners(records: list[Record], owners: Owners) -> None:
    """Add owner tags (pid, comm, rank, ...) to records of flows whose owner is known."""
    keyed = [(record_flow(r), r) for r in records if "sport" in r.tags]
    if not keyed:
        return
    found = owners.resolve([k for k, _ in keyed])
    for key, rec in keyed:
        owner = found.get(key)
        if owner is not None:
            rec.tags.update(owner.tags())


class OwnerTagger:
    """Owner tags for flow records, waiting for them when they may still come.

    /proc is rescanned at most every Owners.rescan_s, so a flow that opened since the
    last scan is unknown for up to that long. Its records wait for the next scan
    rather than leave untagged (a short training job would otherwise lose the rank of
    most of its flows): a record is released once tagged, or once a scan made after
    it arrived could not find the owner (the process already closed the socket).
    Records without a flow pass straight through."""

    def __init__(self, owners: Owners):
        self.owners = owners
        self._waiting: list[tuple[int, Record]] = []     # (scans when it arrived, record)

    def tag(self, records: list[Record]) -> list[Record]:
        scans = self.owners.stats.scans
        pool = self._waiting + [(scans, r) for r in records]
        self._waiting = []
        tag_owners([r for _, r in pool], self.owners)
        out = []
        for arrived, r in pool:
            if "sport" in r.tags and "pid" not in r.tags and \
                    self.owners.stats.scans == arrived and self.owners.pending(record_flow(r)):
                self._waiting.append((arrived, r))
            else:
                out.append(r)
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def flush(self) -> list[Record]:
        """Everything still waiting, untagged (the probe is going away)."""
        out, self._waiting = [r for _, r in self._waiting], []
        return out


class TcpRetransmitProbe(Probe):
    name = "tcp_retransmit"
    needs_bpf = True
    # tracepoints, and a TC program that counts segments on the wire
    capabilities = (Capability.BPF, Capability.PERFMON, Capability.NET_ADMIN)
    family = "tcp_retransmit"          # the bpf/<family>.bpf.c this probe compiles

    def __init__(self, ctx):
        super().__init__(ctx)
        self._bpf = None
        self._tc: TcPrograms | None = None
        self._pending: list[Record] = []
        self._decode_errors = 0
        self._handler_errors = 0
        self.owners = Owners(pods=getattr(ctx, "pods", None),
                             environments=shared_environments(ctx))
        self._tagger = OwnerTagger(self.owners)
        self.kinds_known = False
        self.raw_retransmit = False

    def _cflags(self) -> list[str]:
        fields = bpf.tracepoint_fields("tcp", "tcp_retransmit_skb")
        if fields is None:
            raise ProbeUnavailable("tracepoint tcp/tcp_retransmit_skb does not exist "
                                   "(kernel without CONFIG_TRACEPOINTS or older than 4.15)")
        # the C default (16 pages) per 0.2 s of poll interval
        flags = [f"-DMAX_ADDRS={max(64, len(self.ctx.addresses))}", "-Wno-unused-function",
                 f"-DRINGBUF_PAGES={ringbuf_pages_for(self.ctx, 16)}"]
        if "err" in fields:
            flags.append("-DFS_TP_HAS_ERR")
        if bpf.tracepoint_fields("tcp", "tcp_retransmit_synack") is not None:
            flags.append("-DFS_TP_SYNACK")
        self.kinds_known = bpf.tracepoint_fields("tcp", "tcp_cong_state_set") is not None
        if bpf.tracepoint_fields("tcp", "tcp_destroy_sock") is not None:
            flags.append("-DFS_TP_DESTROY")
        if self.kinds_known:
            flags.append("-DFS_TP_CONG_STATE")
        else:
            log.warning("%s: no tcp/tcp_cong_state_set on this kernel (before 5.18): "
                        "retransmits get kind=unknown", self.name)
        return flags + list(self.ctx.cflags)

    def attach(self) -> None:
        if not self.ctx.addresses:
            raise ProbeUnavailable("no node addresses to attribute retransmits to")
        flags = self._cflags()
        ifaces = addrs.interfaces_owning(self.ctx.addresses)
        if not ifaces:
            log.warning("%s: no Ethernet interface here holds %s, so TC egress cannot see "
                        "retransmitted packets; using the tracepoints (segments: 1 per "
                        "retransmit; misses counted as missed_retransmits)", self.name,
                        ", ".join(sorted(self.ctx.addresses)))
            self._bpf = bpf.compile_program(self.family, flags)
        elif has_raw_tracepoints(os.uname().release):
            # No fallback on failure here: a program that does not build or load is
            # a bug to see, not a kernel to work around.
            self._bpf = bpf.compile_program(self.family, flags + ["-DFS_RAW_RETRANSMIT"])
            self.raw_retransmit = True
        else:
            log.warning("%s: kernel %s has no raw tracepoints (4.17+); using the "
                        "tracepoints, which can miss retransmits (missed_retransmits)",
                        self.name, os.uname().release)
            self._bpf = bpf.compile_program(self.family, flags)
        try:
            self._setup()
            if ifaces:
                self._attach_tc(ifaces)
        except BaseException:
            self.detach()
            raise

    def _setup(self) -> None:
        """After compiling: check layouts, fill maps, open ring buffers."""
        bpf.check_layout(RetransmitEvent, self._bpf[b"event_layout"].Leaf)
        fill_own_addrs(self._bpf[b"own_addrs"], self.ctx.addresses)
        bpf.open_ring(self._bpf[b"events"], self._on_event, self._handler_error, self.name)

    def _attach_tc(self, ifaces) -> None:
        fn = self._bpf.load_func(b"tc_egress", type(self._bpf).SCHED_CLS)
        # its own clsact priority range, above the nic probe's: the NIC counts first
        self._tc = TcPrograms({"egress": fn}, tc.mode_of(self.ctx.config),
                              prio=0x4000 + os.getpid() % 0x3000)
        self._tc.attach(ifaces)
        log.info("%s: attached for %s (TC egress on %s, %s)", self.name,
                 ", ".join(sorted(self.ctx.addresses)), ", ".join(i.name for i in ifaces),
                 self._tc.mechanism)

    def _on_event(self, _ctx, data, size) -> int:
        try:
            self._pending.append(decode(ctypes.string_at(data, size), self.ctx.clock.to_wall))
        except ValueError as exc:
            self._decode_errors += 1
            log.debug("%s: undecodable event: %s", self.name, exc)
        return 0

    def _handler_error(self) -> None:
        self._handler_errors += 1

    def poll(self) -> list[Record]:
        if self._bpf is None:
            return self._tagger.flush()
        self._bpf.ring_buffer_consume()
        out, self._pending = self._pending, []
        return self._tagger.tag(out)

    def stats(self) -> dict[str, int]:
        if self._bpf is None:
            return {}
        out = dict(zip(STATS, bpf.percpu_sums(self._bpf[b"stats"], len(STATS))))
        out["decode_errors"] = self._decode_errors
        out["handler_errors"] = self._handler_errors
        progs = {name: bpf.prog_stats([fn.fd]) for name, fn in self._bpf.funcs.items()}
        # retransmits our program never saw are lost events; the rest are counted apart
        out["missed_retransmits"] = sum(st.missed for name, st in progs.items()
                                        if b"tcp_retransmit" in name)
        out["lost"] += out["missed_retransmits"]
        o = self.owners.stats
        out.update(owners_resolved=o.resolved, owners_unresolved=o.unresolved,
                   owners_from_connect=o.learned,
                   owner_scans=o.scans, owner_waiting=self._tagger.waiting,
                   # the agent's shared environments: every /proc reader's recalls
                   environments_recalled=self.owners.environments.recalled)
        # Cost of our programs, when the kernel's BPF stats are on (else 0), and the
        # hits they missed (missed_hits).
        out.update(sum(progs.values(), bpf.ProgStats()).counters())
        return out

    def detach(self) -> None:
        if self._tc is not None:
            self._tc.detach()
            self._tc = None
        if self._bpf is not None:
            b, self._bpf = self._bpf, None
            b.cleanup()
