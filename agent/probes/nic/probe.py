"""Probe nic: every NIC's traffic in microsecond bins, bursts, flows, queues, drops.

Hooks TC ingress and egress (tcx links, or clsact + cls_bpf: agent/tc.py) of the watched
interfaces (config `interfaces`, default every non-loopback interface that is up
in the agent's network namespace) and, in the host's namespace only,
skb/kfree_skb. Aggregates in the kernel (bpf/nic.bpf.c): rings of bytes/packets
per nic_bin_us bin, a region per CPU of one array the agent maps into its memory,
per-CPU flow counters, per-CPU drop counters; user space reads the rings in place
and the counters in batches each poll (nic_bpfmap, nic_ring), cuts windows
and finds bursts (nic_window), takes flow deltas (nic_flows), qdisc counters
(nic_qdisc) and drop reasons (nic_drops). Exports nic_window, nic_burst,
nic_flow, nic_qdisc, skb_drop (fabricscope/measurements/nic.py).

Line rate (agent/probes/nic/settings.py): configured, or the kernel's speed of a
link with hardware under it; virtual links have none unless configured, and their
records leave out utilization and bursts. The RX bins of the last seconds stay in a
BinHistory (ProbeContext.nic_bins): the gloo probe's traffic model takes its burst
bandwidth B from the busiest bins inside the collective windows.

Cost: per packet one array lookup (interface), one array update (bin), a header
parse from the skb's linear data and one LRU-hash update (flow); nothing is sent
per packet. User space reads the bins in place and ~poll_interval/bin slots per
ring and CPU per poll. Measured here (2-core VM; `fabricscope bench iperf3-overhead-nic`,
docs/PERFORMANCE.md): the TC program 78 ns per 1514-byte frame (BPF_PROG_TEST_RUN,
warm), ~210 ns per skb live under load (bpf_stats, itself ~50 ns of that); iperf3
over a veth pair keeps 0.91-0.94 of its throughput with the probe on both ends, where
empty TC programs alone keep 0.95-0.99 (the hook's own cost on this VM); both probe
processes together 1.3 % of one core; ~77 wire packets per user-space event.

Standalone: `python -m fabricscope.agent.probes.nic.standalone --interfaces eth0` prints records.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass

import numpy as np

from fabricscope.agent.probes.nic import bpfmap as nic_bpfmap

from fabricscope.agent.probes.nic import drops as nic_drops

from fabricscope.agent.probes.nic import qdisc as nic_qdisc
from fabricscope.agent.probes.nic import settings as settings_mod
from fabricscope.agent.kernel import Capability
from fabricscope.agent.probes.base import Probe, ProbeUnavailable
from fabricscope.agent.probes.nic.flows import KEY_DTYPE, VAL_DTYPE, FlowDelta, FlowTable
from fabricscope.agent.probes.nic.history import BinHistory
from fabricscope.agent.probes.nic.ring import BIN_DTYPE, RingSet, mapped_reader
from fabricscope.agent.probes.nic.window import (Burst, BurstDetector, BurstSelector, WindowAssembler,
                                     WindowGrid, WindowStats, window_shift)
from fabricscope.errors import UserError
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.nic")

FAMILY = "nic"
DIRECTIONS = ("rx", "tx")          # ring = interface slot * 2 + FS_NIC_RX/TX
IFINDEX_SLOTS = 1024      # FS_NIC_IFINDEX_SLOTS
KERNEL_STATS = ("skbs", "no_iface", "not_ip", "short", "flow_full", "ring_miss")  # FS_NIC_STAT_*
DROP_SLOTS = 512                   # FS_NIC_DROP_SLOTS
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
#: received bins kept beyond the traffic model's window: its collectives are read a
#: poll or more after they end
HISTORY_MARGIN_S = 5.0
L2_LEN = {1: 14, 772: 14}          # ARPHRD_ETHER, ARPHRD_LOOPBACK; others: raw IP (tun, wg)


class NicProbe(Probe):
    name = "nic"
    needs_bpf = True
    capabilities = (Capability.BPF, Capability.PERFMON, Capability.NET_ADMIN)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.s = settings_mod.from_config(ctx.config)
        self._bpf = None
        self._tc = None
        self._ifaces: list[Link] = []                  # by slot: ring = slot * 2 + direction
        self._rings: RingSet | None = None
        self._ipr = None
        self._ring_map = None                          # the mmap of fs_nic_ring
        self._ring_packets = None                      # () -> skbs counted per ring
        self._pending: list[Record] = []
        self._grid = WindowGrid(1)                     # where windows start: set at attach
        self._rates: list[settings_mod.LineRate] = []  # by slot, read at each window end
        self.history = _history(self.s.bin_ns, ctx.config)   # RX bins for the model's B
        # `lost` (bins the ring overwrote before a drain) is fabricscope_agent_events_lost_total
        self._counts = {"lost": 0, "slots_read": 0, "flow_entries_read": 0, "windows": 0,
                        "idle_drains": 0, "bursts": 0, "bursts_unlisted": 0, "flows_evicted": 0,
                        "flows_deleted": 0, "drops_host_wide": 0}
        self._kernel_stats: dict[str, int] = {}

    # --- attach ---------------------------------------------------------------------

    def attach(self) -> None:
        self._ifaces = pick_interfaces(self.s.interfaces)
        self._names = {link.index: link.name for link in self._ifaces}
        self._cpus = nic_bpfmap.possible_cpus()
        self._cpu_ids = nic_bpfmap.cpu_id_limit()      # the rings' CPU axis: by CPU id
        ring_bytes = self.s.ring_bytes(len(self._ifaces), self._cpu_ids)
        if ring_bytes > settings_mod.RING_BUDGET_BYTES:
            # many CPUs or interfaces: shorter rings, drained more often than configured
            slots = settings_mod.slots_within(settings_mod.RING_BUDGET_BYTES,
                                              len(self._ifaces), self._cpu_ids)
            if slots < self.s.ring_slots:
                self.s = dataclasses.replace(self.s, ring_slots=slots)
                self.max_poll_interval_s = (slots * self.s.bin_ns / 1e9
                                            / settings_mod.RING_MARGIN)
                log.info("nic: rings of %d bins fit %d MiB for %d interfaces on %d CPUs; "
                         "the agent polls every %.3g s", slots,
                         settings_mod.RING_BUDGET_BYTES >> 20, len(self._ifaces), self._cpus,
                         self.max_poll_interval_s)
            ring_bytes = self.s.ring_bytes(len(self._ifaces), self._cpu_ids)
        if ring_bytes > settings_mod.MAX_RING_BYTES:
            raise UserError(f"nic rings would take {ring_bytes >> 20} MiB ({len(self._ifaces)} "
                            f"interfaces, {self._cpus} CPUs, {self.s.ring_slots} bins)",
                            "raise --nic-bin-us, lower --poll-interval-s or list fewer "
                            "--interfaces")
        drops = nic_drops.read_layout() if nic_drops.in_initial_netns() else None
        self._bpf = _compile(self.s, len(self._ifaces), self._cpu_ids, drops,
                             list(self.ctx.cflags))
        try:
            self._check_layouts()
            self._register_interfaces()
            self._attach_tc()
            if drops is not None:
                self._bpf.attach_tracepoint(tp=b"skb:kfree_skb", fn_name=b"fs_nic_kfree_skb")
                self._drops = nic_drops.DropCounts(drops[1], DROP_SLOTS - 1)
                self._drops.update(self._drop_totals())
                self._counts["drops_host_wide"] = 1
            else:
                self._drops = None
            self._start_state()
        except BaseException:
            self.detach()
            raise
        log.info("nic: watching %s (TC by %s, %d us bins, %d-bin rings, %s)",
                 ", ".join(link.name for link in self._ifaces), self._tc.mechanism,
                 self.s.bin_ns // 1000, self.s.ring_slots,
                 "host-wide drop reasons" if drops else
                 "no drop reasons: not in the host's network namespace")

    def _check_layouts(self) -> None:
        ring, flows = self._bpf[b"fs_nic_ring"], self._bpf[b"fs_nic_flows"]
        sizes = {"fs_nic_bin": (_item_size(ring.Leaf), BIN_DTYPE.itemsize),
                 "fs_nic_flow_key": (_item_size(flows.Key), KEY_DTYPE.itemsize),
                 "fs_nic_flow_val": (_item_size(flows.Leaf), VAL_DTYPE.itemsize)}
        bad = [f"{n} {c} != {p}" for n, (c, p) in sizes.items() if c != p]
        if bad:
            raise ProbeUnavailable("bpf/nic.h and its Python mirror differ: " + ", ".join(bad))

    def _register_interfaces(self) -> None:
        for slot, link in enumerate(self._ifaces):
            register_interface(self._bpf, link.index, slot * 2, L2_LEN.get(link.arphrd, 0))

    def _attach_tc(self) -> None:
        from fabricscope.agent import tc

        kind = type(self._bpf).SCHED_CLS
        fns = {"ingress": self._bpf.load_func(b"fs_nic_ingress", kind),
               "egress": self._bpf.load_func(b"fs_nic_egress", kind)}
        # clsact: a priority below tcp_retransmit's range (0x4000..), so the NIC counts
        # first; per process, so that two agents sharing a namespace (tests) keep apart
        self._tc = tc.TcPrograms(fns, tc.mode_of(self.ctx.config),
                                 prio=0x1000 + os.getpid() % 0x2000)
        self._tc.attach(self._ifaces)

    def _start_state(self) -> None:
        s = self.s
        start = time.monotonic_ns() // s.bin_ns
        n_rings = len(self._ifaces) * 2
        try:
            self._ring_map = nic_bpfmap.map_array(
                self._bpf[b"fs_nic_ring"].map_fd,
                n_rings * self._cpu_ids * s.ring_slots * BIN_DTYPE.itemsize)
        except OSError as exc:
            raise ProbeUnavailable(f"cannot map the bin rings into memory ({exc.strerror}): "
                                   "BPF_F_MMAPABLE arrays need Linux 5.5+") from None
        read = mapped_reader(self._ring_map, n_rings, self._cpu_ids, s.ring_slots)
        pkts_fd = self._bpf[b"fs_nic_ring_pkts"].map_fd

        def packets() -> list[int]:
            raw = nic_bpfmap.read_array_range(pkts_fd, 0, n_rings, 8 * self._cpus)
            return np.frombuffer(raw, "<u8").reshape(n_rings, self._cpus).sum(axis=1).tolist()
        self._ring_packets = packets

        rings = RingSet(n_rings, s.ring_slots, s.bin_ns, read, start, packets)
        self._grid = WindowGrid(s.bins_per_window, window_shift(self.ctx.clock.offset_ns,
                                                                s.bin_ns, s.bins_per_window))
        self._windows = [WindowAssembler(s.bin_ns, s.bins_per_window, start, self._grid.shift)
                         for _ in rings.rings]
        self._bursts = [BurstDetector() for _ in rings.rings]
        self._selectors = [BurstSelector(s.bursts_per_window) for _ in rings.rings]
        self._read_line_rates()
        self._window_index = self._grid.index(start + 1)
        flows = self._bpf[b"fs_nic_flows"]
        self._flows = FlowTable(self._cpus, 2 * s.window_ns,
                                lambda raw: flows.__delitem__(flows.Key.from_buffer_copy(raw)))
        self._read_flows(time.monotonic_ns())      # baseline: flows from before attach
        from pyroute2 import IPRoute
        self._ipr = IPRoute()                       # in the agent's namespace, kept open
        self._qdiscs = nic_qdisc.QdiscDeltas(nic_qdisc.read(self._ipr, list(self._names)))
        self._upto = start + 1
        self._first_bin = start + 1
        self._rings = rings                         # last: detach drains only a full state
        if self.history is not None and hasattr(self.ctx, "nic_bins"):
            # the gloo probe's traffic model reads it (kept after detach: the models
            # written at the agent's last poll are fitted after the probes detach)
            self.ctx.nic_bins = self.history

    # --- poll -----------------------------------------------------------------------

    def poll(self) -> list[Record]:
        if self._bpf is None or self._rings is None:
            out, self._pending = self._pending, []
            return out
        now = time.monotonic_ns()
        self._drain(now // self.s.bin_ns - 1)     # the current and the last bin may be in use
        out, self._pending = self._pending, []
        return out

    def _drain(self, upto: int, final: bool = False) -> None:
        if upto <= self._upto and not final:
            return
        upto = max(upto, self._upto)
        wall = self.ctx.clock.to_wall
        for ring, drained in zip(self._rings.rings, self._rings.drain(upto)):
            slot, direction = divmod(ring.ring_id, 2)
            name, speed = self._ifaces[slot].name, self._rates[slot]
            hot = self._hot_bytes(speed.bps)
            if DIRECTIONS[direction] == "rx" and self.history is not None:
                self.history.add(name, drained.bins.index, drained.bins.bytes, speed.bps)
            self._counts["lost"] += drained.lost
            self._counts["slots_read"] += drained.slots_read
            self._counts["idle_drains"] = self._rings.skipped
            tags = {"interface": name, "direction": DIRECTIONS[direction]}
            bursts = self._bursts[ring.ring_id].feed(drained.bins, upto, hot)
            windows = self._windows[ring.ring_id].feed(drained.bins, drained.lost, upto, hot)
            if final:
                bursts += self._bursts[ring.ring_id].flush()
                last = self._windows[ring.ring_id].flush(upto)
                windows += [last] if last else []
            selector = self._selectors[ring.ring_id]
            selector.add(bursts)
            for i, w in enumerate(windows):
                listed, found = (selector.flush() if final and i == len(windows) - 1
                                 else selector.close(w.start_ns + self.s.window_ns))
                self._pending += [self._burst_record(b, tags, speed, wall) for b in listed]
                self._pending.append(self._window_record(w, tags, speed, wall, found,
                                                         len(listed)))
                self._counts["bursts_unlisted"] += found - len(listed)
            self._counts["bursts"] += len(bursts)
            self._counts["windows"] += len(windows)
        self._upto = upto
        if self.history is not None:
            self.history.drained(self._first_bin, upto)
        window = self._grid.index(upto)
        if window > self._window_index or final:
            # the per-window reads, once per window end (the rings' windows end together)
            start_ns = self._grid.start_bin(window - (0 if final else 1)) * self.s.bin_ns
            self._window_index = window
            self._per_window(wall(start_ns), time.monotonic_ns())

    def _per_window(self, time_ns: int, now_mono: int) -> None:
        names = self._names
        for f in self._read_flows(now_mono):
            if f.ifindex in names:
                self._pending.append(_flow_record(f, names[f.ifindex], time_ns))
        for q in self._qdiscs.update(nic_qdisc.read(self._ipr, list(names))):
            self._pending.append(_qdisc_record(q, names[q.ifindex], time_ns))
        if self._drops is not None:
            for reason, n in sorted(self._drops.update(self._drop_totals()).items()):
                self._pending.append(Record("skb_drop", time_ns,
                                            {"reason": reason, "scope": "host"}, {"drops": n}))
        self._read_line_rates()

    def _read_line_rates(self) -> None:
        """Each interface's line rate, at attach and at each window end (a link that
        comes up or is reconfigured); logs which have none, once each."""
        rates = [self.s.speeds.line_rate(link.name) for link in self._ifaces]
        unknown_before = {link.name for link, r in zip(self._ifaces, self._rates)
                          if r.bps is None}
        for link, rate in zip(self._ifaces, rates):
            if rate.bps is None and link.name not in unknown_before:
                log.info("nic: %s has no line rate (a virtual link, or hardware that "
                         "reports none): utilization and bursts are left out; give "
                         "--link-speed-bps %s=RATE where one applies", link.name, link.name)
        self._rates = rates

    def _hot_bytes(self, speed_bps: int | None) -> float:
        """Bytes a bin holds at the burst threshold; without a line rate no bin is hot."""
        if speed_bps is None:
            return float("inf")
        return self.s.threshold * speed_bps * self.s.bin_ns / 8e9

    def _read_flows(self, now_mono: int) -> list[FlowDelta]:
        row = nic_bpfmap.percpu_stride(VAL_DTYPE.itemsize) * self._cpus
        keys, values, n = nic_bpfmap.read_hash(self._bpf[b"fs_nic_flows"].map_fd,
                                               KEY_DTYPE.itemsize, row, self.s.max_flows)
        out = self._flows.update(keys, values, n, now_mono)
        self._counts["flow_entries_read"] += n
        self._counts["flows_evicted"] = self._flows.evicted
        self._counts["flows_deleted"] = self._flows.deleted
        return out

    def _drop_totals(self) -> list[int]:
        row = 8 * self._cpus
        raw = nic_bpfmap.read_array_range(self._bpf[b"fs_nic_drops"].map_fd, 0, DROP_SLOTS, row)
        return np.frombuffer(raw, "<u8").reshape(DROP_SLOTS, self._cpus).sum(axis=1).tolist()

    def _window_record(self, w: WindowStats, tags: dict, speed: settings_mod.LineRate, wall,
                       bursts: int, listed: int) -> Record:
        """Without a line rate: no speed, utilization, hot bins or bursts (all relative
        to one); the rates in bit/s stay."""
        bin_s = self.s.bin_ns / 1e9
        peak_bps = w.peak_bytes * 8 / bin_s
        fields = {"bytes": w.bytes, "packets": w.packets,
                  "rate_bps": w.bytes * 8 / (w.covered_bins * bin_s) if w.covered_bins else 0.0,
                  "peak_bps": peak_bps, "p99_bps": w.p99_bytes * 8 / bin_s,
                  "link_speed_source": speed.source.value,
                  "bin_us": self.s.bin_ns // 1000, "lost_bins": w.lost_bins}
        if speed.bps is not None:
            fields.update(peak_util=peak_bps / speed.bps, hot_bins=w.hot_bins,
                          hot_s=w.hot_bins * bin_s, link_speed_bps=speed.bps,
                          bursts=bursts, bursts_listed=listed)
        return Record("nic_window", wall(w.start_ns), dict(tags), fields)

    def _burst_record(self, b: Burst, tags: dict, speed: settings_mod.LineRate, wall) -> Record:
        """Only links with a line rate have bursts (hot bins are a share of it)."""
        peak_bps = b.peak_bytes * 8e9 / self.s.bin_ns
        fields = {"duration_ns": b.end_ns - b.start_ns, "bytes": b.bytes, "packets": b.packets,
                  "peak_util": peak_bps / speed.bps, "peak_bps": peak_bps,
                  "hot_bins": b.hot_bins, "bins": b.bins}
        return Record("nic_burst", wall(b.start_ns), dict(tags), fields)

    # --- stats, detach ----------------------------------------------------------------

    def interface_names(self) -> list[str]:
        return [link.name for link in self._ifaces]

    def stats(self) -> dict[str, int]:
        """Counters for fabricscope_agent_probe_events_total{probe="nic"}: user-space ones
        (see __init__), the kernel's FS_NIC_STAT_*, and the TC programs' run time
        (bpf_run_ns, bpf_runs: 0 unless sysctl kernel.bpf_stats_enabled=1)."""
        if self._bpf is not None:
            from fabricscope.agent import bpf
            kernel = dict(zip(KERNEL_STATS, bpf.percpu_sums(self._bpf[b"stats"],
                                                            len(KERNEL_STATS))))
            if self._ring_packets is not None:     # the programs count no skbs themselves
                kernel["skbs"] = sum(self._ring_packets()) + kernel["no_iface"]
            self._kernel_stats = {**kernel, **bpf.prog_stat_counters(
                fn.fd for fn in (self._tc.fns.values() if self._tc is not None else ()))}
        return {**self._counts, **self._kernel_stats}

    def detach(self) -> None:
        """Remove the TC programs, drain the last bins (their records come out of the
        next poll()), then free the BPF maps. Safe twice and after a failed attach."""
        if self._tc is not None:
            self._tc.detach()
            self._tc = None
        if self._bpf is not None:
            b = self._bpf
            try:
                if self._rings is not None:
                    self._drain(time.monotonic_ns() // self.s.bin_ns + 1, final=True)
                    self.stats()                  # keep the kernel counters' last values
            finally:
                self._bpf = None
                self._rings = None                # its reader views the mapping closed here
                if self._ring_map is not None:
                    try:
                        self._ring_map.close()
                    except BufferError:           # a view still held (a test): the GC unmaps
                        pass
                    self._ring_map = None
                b.cleanup()
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    arphrd: int         # ARPHRD_* link type
    flags: int          # IFF_*


def _history(bin_ns: int, cfg) -> BinHistory | None:
    """The received bins kept for the gloo probe's traffic model (its window and a
    margin), only when the gloo probe runs."""
    if "gloo" not in (getattr(cfg, "probes", None) or ()):
        return None
    window_s = float(getattr(cfg, "gloo_model_window_s", 10.0))
    return BinHistory(bin_ns, keep_s=window_s + HISTORY_MARGIN_S)


def register_interface(bpf_obj, ifindex: int, ring: int, l2_len: int,
                       slots: int = IFINDEX_SLOTS) -> None:
    """Make the TC programs of a compiled nic object count an interface: its bins in
    rings `ring` (RX) and ring + 1 (TX); l2_len bytes before the network header.
    slots: the object's FS_NIC_IFINDEX_SLOTS."""
    small = ifindex < slots
    table = bpf_obj[b"fs_nic_iface_slots" if small else b"fs_nic_ifaces"]
    value = table.Leaf()
    value.ring, value.l2_len, value.watched = ring, l2_len, 1
    table[table.Key(ifindex)] = value


def _item_size(ctype) -> int:
    """Size of one element of a BCC key/leaf type (per-CPU leaves are arrays per CPU)."""
    import ctypes
    return ctypes.sizeof(getattr(ctype, "_type_", ctype)) if hasattr(ctype, "_length_") \
        else ctypes.sizeof(ctype)


def _compile(s, n_ifaces: int, cpu_ids: int, drops, extra: list[str]):
    from fabricscope.agent import bpf

    flags = [f"-DFS_NIC_BIN_NS={s.bin_ns}", f"-DFS_NIC_RING_SLOTS={s.ring_slots}",
             f"-DFS_NIC_CPUS={cpu_ids}",
             f"-DFS_NIC_RINGS={2 * n_ifaces}", f"-DFS_NIC_MAX_IFACES={max(n_ifaces, 1)}",
             f"-DFS_NIC_MAX_FLOWS={s.max_flows}"]
    if drops is not None:
        flags += ["-DFS_NIC_DROPS=1", f"-DFS_NIC_REASON_OFF={drops[0]}"]
    return bpf.compile_program(FAMILY, flags + extra)


def pick_interfaces(wanted: tuple[str, ...]) -> list[Link]:
    """The configured interfaces, or every non-loopback one that is up; UserError for a
    configured name that does not exist here."""
    links = list_links()
    if wanted:
        by_name = {link.name: link for link in links}
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise UserError(f"interfaces: {', '.join(missing)} not found in this network "
                            "namespace", "list existing ones (ip link), or leave "
                            "--interfaces empty for every interface that is up")
        return [by_name[n] for n in wanted]
    chosen = [link for link in links if link.flags & IFF_UP and not link.flags & IFF_LOOPBACK]
    if not chosen:
        raise ProbeUnavailable("no interface besides loopback is up in this network namespace")
    return chosen


def list_links() -> list[Link]:
    """Every link of the calling thread's network namespace."""
    from pyroute2 import IPRoute
    with IPRoute() as ipr:
        return [Link(m["index"], m.get_attr("IFLA_IFNAME"), m["ifi_type"], m["flags"])
                for m in ipr.get_links()]


def _flow_record(f: FlowDelta, ifname: str, time_ns: int) -> Record:
    tags = {"interface": ifname, "direction": f.direction, "proto": f.proto, "saddr": f.saddr,
            "daddr": f.daddr, "sport": str(f.sport), "dport": str(f.dport)}
    return Record("nic_flow", time_ns, tags, {"bytes": f.bytes, "packets": f.packets,
                                             "ce_marks": f.ce_marks, "dscp": f.dscp})


def _qdisc_record(q: nic_qdisc.QdiscStat, ifname: str, time_ns: int) -> Record:
    tags = {"interface": ifname, "kind": q.kind, "handle": q.handle, "parent": q.parent}
    fields = {"backlog_bytes": q.backlog_bytes, "qlen": q.qlen, "drops": q.drops,
              "overlimits": q.overlimits, "requeues": q.requeues, "bytes": q.bytes,
              "packets": q.packets}
    return Record("nic_qdisc", time_ns, tags, fields)
