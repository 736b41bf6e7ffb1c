"""Probe tcp_flows: per-flow windows (bytes each way, RTT percentiles, cwnd,
retransmits), a node window (retransmit ratio, kinds), flow opens/closes, resets and
transfers (a socket's bytes without a pause longer than tcp_transfer_gap_us, closed
in the kernel: one event per transfer), each with the flow's owner (pid, command,
cgroup, rank, job; records of a flow new since the last /proc scan wait for the
next one, see OwnerTagger).

Includes everything tcp_retransmit does (one BPF object, bpf/tcp_flows.bpf.c,
compiles the retransmit program in), so the two are not enabled together.

Each window (config tcp_window_s, default 1 s; cut on the first poll after a
wall-clock multiple of it):
1. bump the kernel's window generation (the finished slot is then stable);
2. drain the ring buffers (retransmit, open/close and reset events);
3. read the flow map in one batched syscall, merge the per-CPU slots of the
   finished generation, delete entries idle for a whole window;
4. write one tcp_flow record per flow with traffic and one tcp_node record; the
   retransmits of a window are those whose kernel timestamp precedes the bump.
   With tcp_rx_info, each flow also gets its receive-side counters, read from its
   socket's tcp_info at the cut (agent/probes/tcp/rx_sampler.py): the loss of flows
   whose sender runs no agent.
The window in progress when the agent stops is cut short and written (its
`seconds` says how long it was), in the poll after detach.

Received bytes come from tcp_probe's data_len per segment, and the kernel skips
tcp_probe's program now and then (another tracing program or a BPF map syscall on
that CPU: agent/bpf.py, ProgStats; measured ~1.4 % of the bytes with map syscalls
beside the receiver). The bytes of skipped hits are recovered from the
acknowledgment number of the socket's last packet out, kept by the TC egress
program, once per transfer (bpf/tcp_flows.bpf.c: recover_received): exported as
probe_events_total{event="received_recovered_bytes"}, the skipped runs the kernel
counted as {event="missed_hits"}. The same ACKs take off bytes counted that were
never received in order (a resent duplicate, a segment dropped after its hit,
out-of-order data until acknowledged): {event="received_unacked_bytes"}. Sent bytes
acknowledged in skipped hits at a transfer's start count for it, not for the one
before the gap: TC egress marks where the socket's data resumed after a pause
({event="sent_after_gap_bytes"}). tcp_probe shows a socket as the segment before left
it, so a segment's acknowledgment counts at the next hit; a socket that closes first
gets none after the peer's last answer, and at a close after our FIN was acknowledged
the bytes still uncounted are (bpf/tcp_flows.bpf.c: acked_at_close;
{event="acked_at_close_bytes"}). Bytes acknowledged before a socket's first hit
count from the first sequence number TC egress saw it send (bpf/tcp_flows.bpf.c:
una_baseline; {event="acked_before_first_hit_bytes"}). An open whose inet_sock_set_state hit was skipped
is reported at the socket's first acknowledging packet on TC egress
({event="opened_at_first_ack"}), a close at socket teardown by the raw
tcp_destroy_sock program (from_state UNKNOWN; {event="closed_at_destroy"}): TC
programs and raw tracepoints are not skipped that way. A teardown whose hits were
all skipped (raw ones too: seen on 6.18, uncounted) is reported when a new socket
reuses the freed one's address ({event="closed_at_reuse"}) or, at the latest, by the
sweep (every 10 s), once sock_diag no longer lists the socket
({event="closed_at_sweep"}; agent/probes/tcp/sweep.py, docs/architecture.md).

Cost (BPF run-time stats, kernel.bpf_stats_enabled=1, iperf3 over a lab veth,
4 s): tcp/tcp_probe ~200 ns per segment received (it runs for every socket on
the kernel; other nodes' exit after the address lookup), TC egress ~350 ns per
egress skb, the state/reset/congestion hooks 0.3-1 us per (rare) hit. User space
reads one map entry per active flow per window, not one event per packet:
`fabricscope bench agent-footprint` (3-node DDP: ~35k wire segments/s, ~22
user-space events/s; agent ~0.015 CPU s/s idle and busy alike, RSS ~207 MiB,
most of it BCC's LLVM).
"""

from __future__ import annotations

import ctypes
import logging
import time

import numpy as np

from fabricscope.agent import bpf
from fabricscope.agent.probes.nic import bpfmap as nic_bpfmap
from fabricscope.agent.probes.base import ProbeUnavailable
from fabricscope.agent.probes.tcp.common import FsFlow, flow_key
from fabricscope.agent.probes.tcp.flow_layout import (FLOW_DTYPE, FLOW_STATS, SOCK_DTYPE, STAT_DTYPE,
                                          FlowEvent, FlowStat, Sock, connecting_pid,
                                          decode_flow_event)
from fabricscope.agent.probes.tcp.hooks import MAX_FLOW_MAP_BYTES, FlowSettings, hook_cflags
from fabricscope.agent.probes.tcp.retransmit import STATS, TcpRetransmitProbe, record_flow
from fabricscope.agent.probes.tcp.rx_sampler import RxSampler, merge_into
from fabricscope.agent.probes.tcp.sweep import Sweeper, live_cookies, replay_destroy
from fabricscope.agent.probes.tcp.window import (FlowRetrans, NodeTally, flow_fields, flow_record,
                                     merge_slots, node_record, retrans_only_fields)
from fabricscope.records import Record

log = logging.getLogger("fabricscope.agent.tcp_flows")

#: measurements that count into the window tallies
_WINDOWED = ("tcp_retransmit", "tcp_reset", "tcp_flow_open", "tcp_flow_close")


class TcpFlowsProbe(TcpRetransmitProbe):
    name = "tcp_flows"
    family = "tcp_flows"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.settings = FlowSettings.from_config(ctx.config)
        self._cpus = 1
        self._max_flows = self.settings.max_flows
        self._gen = 0
        self._window_start_ns = 0          # wall ns of the current window's start
        self._next_due = 0.0               # wall s of the next cut
        self._windowed: list[Record] = []  # events not yet assigned to a window
        self._closed: set = set()          # flows closed: forget their owner after the window
        self._final: list[Record] = []     # made at detach, handed out by the next poll
        self._out_total = (0, 0)           # TC egress (segs, bytes) at the last cut
        self._counts = {"windows": 0, "flows_read": 0, "flows_deleted": 0,
                        "flow_table_full": 0, "flow_decode_errors": 0, "sweep_errors": 0,
                        "handler_errors": 0, "sweeps": 0}
        self._sweeper = Sweeper()
        self._destroy_fd = None            # raw tcp_destroy_sock program: the sweep replays it
        self._rx = RxSampler(ctx.addresses) if self.settings.rx_info else None

    # --- attach -------------------------------------------------------------------------

    def _cflags(self) -> list[str]:
        self._cpus = nic_bpfmap.possible_cpus()
        per_flow = ctypes.sizeof(FlowStat) * self._cpus
        self._max_flows = min(self.settings.max_flows, MAX_FLOW_MAP_BYTES // per_flow)
        if self._max_flows < 64:
            raise ProbeUnavailable(f"{self._cpus} CPUs leave room for {self._max_flows} "
                                   f"flows in {MAX_FLOW_MAP_BYTES >> 20} MiB")
        if self._max_flows < self.settings.max_flows:
            log.warning("tcp_flows: %d flows x %d CPUs would take %d MiB; tracking %d flows",
                        self.settings.max_flows, self._cpus,
                        self.settings.max_flows * per_flow >> 20, self._max_flows)
        return super()._cflags() + [f"-DMAX_FLOWS={self._max_flows}",
                                    *hook_cflags(self.settings.hooks),
                                    *self.settings.transfer_cflags()]

    def _setup(self) -> None:
        super()._setup()
        b = self._bpf
        bpf.check_layout(FlowStat, b[b"flowstats"].sLeaf)
        bpf.check_layout(FlowEvent, b[b"flow_event_layout"].Leaf)
        bpf.check_layout(Sock, b[b"sock_layout"].Leaf)
        bpf.open_ring(b[b"flow_events"], self._on_flow_event, self._handler_error, self.name)
        fn = b.funcs.get(b"raw_tracepoint__tcp_destroy_sock")
        try:
            b[b"sweeping"]                  # only with raw tracepoints and set_state
            self._destroy_fd = fn.fd if fn is not None else None
        except KeyError:
            self._destroy_fd = None
        self._cut(self._now_ns(), first=True)
        if self._rx is not None:
            self._rx.sample()               # the counters the first window's deltas start from

    def _now_ns(self) -> int:
        """Wall ns on the events' clock (monotonic + the agent's fixed offset), so that
        a cut and the kernel's timestamps compare exactly."""
        return self.ctx.clock.to_wall(time.monotonic_ns())

    def _on_flow_event(self, _ctx, data, size) -> int:
        raw = ctypes.string_at(data, size)
        try:
            record = decode_flow_event(raw, self.ctx.clock.to_wall)
        except ValueError as exc:
            self._counts["flow_decode_errors"] += 1
            log.debug("tcp_flows: undecodable flow event: %s", exc)
            return 0
        pid = connecting_pid(raw)
        if pid:
            self.owners.learn(record_flow(record), pid)
        self._pending.append(record)
        return 0

    def _handler_error(self) -> None:
        self._counts["handler_errors"] += 1

    # --- windows ------------------------------------------------------------------------

    def _cut(self, now_ns: int, first: bool = False) -> tuple[int, int, float]:
        """Start the next window: bump the generation. Returns the finished window's
        (generation, start wall ns, seconds)."""
        self._gen += 1
        self._bpf[b"window"][ctypes.c_int(0)] = ctypes.c_uint32(self._gen)
        finished = (self._gen - 1, self._window_start_ns, (now_ns - self._window_start_ns) / 1e9)
        self._window_start_ns = now_ns
        w = self.settings.window_s
        self._next_due = (now_ns / 1e9 // w + 1) * w
        if first:
            self._out_total = self._tc_totals()
        return finished

    def _tc_totals(self) -> tuple[int, int]:
        sums = dict(zip(STATS, bpf.percpu_sums(self._bpf[b"stats"], len(STATS))))
        return sums["tc_segs"], sums["tc_bytes"]

    @staticmethod
    def _read_map(table, key_size: int, value_size: int,
                  max_entries: int) -> tuple[bytes, bytes, int]:
        """(keys, values, entries) of a whole hash map, packed; value_size as the
        syscall writes a value (per-CPU: stride * CPUs)."""
        try:
            keys, values, n = nic_bpfmap.read_hash(table.map_fd, key_size, value_size,
                                                   max_entries)
        except nic_bpfmap.BatchUnsupported:     # before 5.6: one syscall pair per entry
            items = list(table.items())
            n = len(items)
            keys = b"".join(bytes(k) for k, _ in items)
            values = b"".join(bytes(v) for _, v in items)
        return bytes(keys[:n * key_size]), bytes(values[:n * value_size]), n

    def _read_flows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys: FLOW_DTYPE, values: (flows, cpus) of STAT_DTYPE) of the whole flow map."""
        stride = nic_bpfmap.percpu_stride(STAT_DTYPE.itemsize)
        keys, values, n = self._read_map(self._bpf[b"flowstats"], FLOW_DTYPE.itemsize,
                                         stride * self._cpus, self._max_flows)
        k = np.frombuffer(keys, dtype=FLOW_DTYPE)
        v = np.frombuffer(values, dtype=STAT_DTYPE)
        return k, v.reshape(n, self._cpus)

    def _delete_idle(self, keys: np.ndarray, values: np.ndarray, gen: int) -> None:
        """Entries with no hit in the finished window nor since: flows gone quiet."""
        newest = values["slot"]["gen"].max(axis=(1, 2)) if len(values) else np.array([])
        table = self._bpf[b"flowstats"]
        for i in np.nonzero(newest < gen)[0]:
            try:
                del table[table.Key.from_buffer_copy(keys[i].tobytes())]
                self._counts["flows_deleted"] += 1
            except KeyError:
                pass

    def _window_records(self, gen: int, start_ns: int, seconds: float,
                        cut_ns: int, rx: dict) -> list[Record]:
        keys, values = self._read_flows()
        self._counts["flows_read"] += len(keys)
        if len(keys) >= self._max_flows:
            self._counts["flow_table_full"] += 1
        merged = merge_slots(values["slot"][:, :, gen & 1], gen) if len(keys) else None
        self._delete_idle(keys, values, gen)

        events = [r for r in self._windowed if r.time_ns < cut_ns]
        self._windowed = [r for r in self._windowed if r.time_ns >= cut_ns]
        retrans: dict = {}
        tally = NodeTally()
        for rec in events:
            tally.add_record(rec)
            if rec.measurement == "tcp_retransmit":
                r = retrans.setdefault(record_flow(rec), FlowRetrans())
                r.segs += int(rec.fields["segs"])
                r.bytes += int(rec.fields.get("payload_bytes", 0))
                r.events += 1
                r.timeouts += rec.tags.get("kind") in ("rto", "syn")

        fields_by_flow: dict = {}
        bytes_acked = 0
        if merged is not None:
            for i in np.nonzero(merged["active"])[0]:
                key = flow_key(FsFlow.from_buffer_copy(keys[i].tobytes()))
                fields_by_flow[key] = flow_fields(merged, i, seconds)
                bytes_acked += int(merged["acked"][i])
        for key in retrans:
            fields_by_flow.setdefault(key, retrans_only_fields(seconds))
        merge_into(fields_by_flow, rx, seconds)
        owners = self.owners.resolve(list(fields_by_flow))
        out = [flow_record(key, f, retrans.get(key), start_ns,
                           owners[key].tags() if key in owners else {})
               for key, f in fields_by_flow.items()]
        totals = self._tc_totals()
        out_delta = (totals[0] - self._out_total[0], totals[1] - self._out_total[1])
        self._out_total = totals
        out.append(node_record(start_ns, seconds, len(fields_by_flow), bytes_acked, out_delta,
                               retrans, tally))
        for key in self._closed:
            self.owners.forget(key)
        self._closed.clear()
        self._counts["windows"] += 1
        return out

    def _sweep(self) -> None:
        """Closes of sockets gone from sock_diag with their entry still here: every
        teardown hook of theirs was skipped (agent/probes/tcp/sweep.py)."""
        now = time.monotonic_ns()           # bpf_ktime_get_ns's clock
        if not self._sweeper.due(now):
            return
        self._counts["sweeps"] += 1
        table = self._bpf[b"socks"]
        keys, values, _ = self._read_map(table, 8, SOCK_DTYPE.itemsize, table.max_entries)
        k = np.frombuffer(keys, dtype=np.uint64)
        v = np.frombuffer(values, dtype=SOCK_DTYPE)
        picks = self._sweeper.candidates(k, v, now)
        if not picks:
            return
        try:
            live = live_cookies()
        except OSError as exc:      # netlink: this window's closes wait for reuse instead
            self._counts["sweep_errors"] += 1
            (log.debug if self._counts["sweep_errors"] > 1 else log.warning)(
                "tcp_flows: sock_diag dump for the sweep failed (counted in "
                "probe_events_total{event=\"sweep_errors\"}): %s", exc)
            return
        for sk, cookie in self._sweeper.gone(k, v, picks, now, live):
            try:
                replay_destroy(self._destroy_fd, self._bpf[b"sweeping"], sk, cookie)
            except OSError as exc:  # before 5.10 raw tracepoints cannot be test-run
                self._counts["sweep_errors"] += 1
                self._destroy_fd = None
                log.warning("tcp_flows: the sweep is off, closes whose hooks the kernel "
                            "skipped wait for their address's reuse: replaying a "
                            "teardown failed: %s", exc)
                return

    # --- poll ---------------------------------------------------------------------------

    def poll(self, final: bool = False) -> list[Record]:
        if self._bpf is None:
            out, self._final = self._final + self._tagger.flush(), []
            return out
        now_ns = self._now_ns()
        finished = self._cut(now_ns) if final or now_ns / 1e9 >= self._next_due else None
        # read at the cut, so that the sockets' counters and the flow map share a window
        rx = self._rx.sample() if finished is not None and self._rx is not None else {}
        if finished is not None and self._destroy_fd is not None:
            self._sweep()
        # Drained after the cut: every event stamped before it is in the buffers now.
        self._bpf.ring_buffer_consume()
        fresh, self._pending = self._pending, []
        # Tallied now (a record waiting for its owner's tags is the same object, tagged
        # later); passed on once tagged.
        self._windowed += [r for r in fresh if r.measurement in _WINDOWED]
        out = self._tagger.tag(fresh)
        self._closed.update(record_flow(r) for r in out if r.measurement == "tcp_flow_close")
        if finished is not None:
            gen, start_ns, seconds = finished
            out += self._window_records(gen, start_ns, seconds, now_ns, rx)
        return out

    def detach(self) -> None:
        """Cut the window in progress and keep its records (and the last events) for the
        poll after detach, as the Probe contract asks; then free the BPF objects."""
        if self._bpf is not None:
            try:
                self._final = self.poll(final=True)
            except Exception as exc:      # detach must not fail: the records are lost, said
                log.warning("tcp_flows: last window not written: %s", exc)
        super().detach()

    def stats(self) -> dict[str, int]:
        out = super().stats()
        if self._bpf is None:
            return out
        # this program's counters follow tcp_retransmit's in `stats` (bpf/tcp_flows.bpf.c)
        flow = dict(zip(FLOW_STATS, bpf.percpu_sums(self._bpf[b"stats"], len(FLOW_STATS),
                                                    first=len(STATS))))
        out["lost"] = out.get("lost", 0) + flow.pop("flow_events_lost")
        out.update(flow)
        out.update(self._counts)
        if self._rx is not None:
            out.update(self._rx.counts)
        return out
