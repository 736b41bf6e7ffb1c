"""Python side of bpf/tcp_flows.h: ctypes mirrors, numpy views, flow event decoding.

The mirrors are checked against what clang compiled at load (fabricscope.agent.bpf.check_layout)
and against the host C compiler in tests/unit/test_tcp_flows_layout.py.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np

from fabricscope.agent.probes.tcp.common import FsFlow, flow_key, flow_tags, state_name
from fabricscope.records import Record

RTT_BUCKETS = 24          # FS_RTT_BUCKETS
CWND_BUCKETS = 16         # FS_CWND_BUCKETS
SSTHRESH_INFINITE = 0x7FFFFFFF
EV_OPEN, EV_CLOSE, EV_RST_SENT, EV_RST_RECV, EV_TRANSFER = 1, 2, 3, 4, 5
CLOSE_ESTABLISHED, CLOSE_UNA, TRANSFER_AFTER_REPORTED = 1, 2, 4
RST_REASON_NONE = 0xFFFFFFFF
#: FS_FSTAT_* order
FLOW_STATS = ("probe_hits", "rtt_samples", "flow_events_emitted", "flow_events_lost",
              "no_slot", "state_hits", "transfers", "transfers_small", "transfers_tail",
              "received_recovered_bytes", "closed_at_destroy", "opened_at_first_ack",
              "closed_at_reuse", "closed_at_sweep", "acked_before_first_hit_bytes",
              "received_unacked_bytes", "sent_after_gap_bytes",
              "acked_at_close_bytes")

#: enum sk_rst_reason (include/net/rstreason.h, 6.10+), as the tracepoint prints it
RST_REASONS = ("NOT_SPECIFIED", "NO_SOCKET", "TCP_INVALID_ACK_SEQUENCE", "TCP_RFC7323_PAWS",
               "TCP_TOO_OLD_ACK", "TCP_ACK_UNSENT_DATA", "TCP_FLAGS", "TCP_OLD_ACK",
               "TCP_ABORT_ON_DATA", "TCP_TIMEWAIT_SOCKET", "INVALID_SYN",
               "TCP_ABORT_ON_CLOSE", "TCP_ABORT_ON_LINGER", "TCP_ABORT_ON_MEMORY",
               "TCP_STATE", "TCP_KEEPALIVE_TIMEOUT", "TCP_DISCONNECT_WITH_DATA")


class FlowSlot(ctypes.Structure):
    _fields_ = [("gen", ctypes.c_uint32), ("segs_in", ctypes.c_uint32),
                ("rtt_samples", ctypes.c_uint32), ("rtt_min_us", ctypes.c_uint32),
                ("rtt_max_us", ctypes.c_uint32), ("cwnd_min", ctypes.c_uint32),
                ("cwnd_max", ctypes.c_uint32), ("ssthresh_min", ctypes.c_uint32),
                ("ssthresh_max", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("acked", ctypes.c_uint64), ("rtt_sum_us", ctypes.c_uint64),
                ("rtt_sumsq_us", ctypes.c_uint64), ("received", ctypes.c_uint64),
                ("rtt_hist", ctypes.c_uint32 * RTT_BUCKETS),
                ("cwnd_hist", ctypes.c_uint32 * CWND_BUCKETS)]


class FlowStat(ctypes.Structure):
    _fields_ = [("slot", FlowSlot * 2)]


class Sock(ctypes.Structure):
    _fields_ = [("start_ns", ctypes.c_uint64), ("est_ns", ctypes.c_uint64),
                ("acked", ctypes.c_uint64), ("sent", ctypes.c_uint64),
                ("received", ctypes.c_uint64), ("xfer_start", ctypes.c_uint64),
                ("xfer_last", ctypes.c_uint64), ("xfer_in", ctypes.c_uint64),
                ("xfer_out", ctypes.c_uint64), ("xfer_reported_end", ctypes.c_uint64),
                ("last_una", ctypes.c_uint32), ("last_nxt", ctypes.c_uint32),
                ("has_una", ctypes.c_uint8), ("active", ctypes.c_uint8),
                ("has_ack", ctypes.c_uint8), ("pad", ctypes.c_uint8),
                ("pid", ctypes.c_uint32), ("rcv_acked", ctypes.c_uint64),
                ("last_in_ns", ctypes.c_uint64), ("last_ack", ctypes.c_uint32),
                ("xfer_nxt", ctypes.c_uint32), ("made_ns", ctypes.c_uint64),
                ("cookie", ctypes.c_uint64)]


class FlowEvent(ctypes.Structure):
    _fields_ = [("ts_ns", ctypes.c_uint64), ("flow", FsFlow), ("family", ctypes.c_uint16),
                ("type", ctypes.c_uint8), ("active", ctypes.c_uint8),
                ("oldstate", ctypes.c_int32), ("state", ctypes.c_int32),
                ("reason", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("duration_ns", ctypes.c_uint64), ("bytes_acked", ctypes.c_uint64),
                ("bytes_sent", ctypes.c_uint64), ("bytes_received", ctypes.c_uint64),
                ("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("gap_ns", ctypes.c_uint64)]


FLOW_DTYPE = np.dtype(FsFlow)
SOCK_DTYPE = np.dtype(Sock)
SLOT_DTYPE = np.dtype(FlowSlot)
STAT_DTYPE = np.dtype(FlowStat)


_PID = struct.Struct("<I")


def connecting_pid(raw: bytes) -> int:
    """The pid (host namespace) that connected the event's flow, 0 when unknown: set
    on the open, close and transfer events of sockets this host connected after
    attach."""
    if len(raw) < ctypes.sizeof(FlowEvent):
        return 0
    return _PID.unpack_from(raw, FlowEvent.pid.offset)[0]


def decode_flow_event(raw: bytes, to_wall) -> Record:
    """One flow_events ring buffer event -> tcp_flow_open, tcp_flow_close, tcp_reset or
    tcp_transfer."""
    size = ctypes.sizeof(FlowEvent)
    if len(raw) < size:
        raise ValueError(f"flow event of {len(raw)} bytes, expected {size}")
    ev = FlowEvent.from_buffer_copy(raw[:size])
    tags = flow_tags(flow_key(ev.flow))
    time_ns = to_wall(ev.ts_ns)
    side = "client" if ev.active else "server"
    if ev.type == EV_OPEN:
        fields = {"active": bool(ev.active)}
        if ev.duration_ns:
            fields["handshake_us"] = ev.duration_ns / 1e3
        return Record("tcp_flow_open", time_ns, {**tags, "side": side}, fields)
    if ev.type == EV_CLOSE:
        fields = {"established": bool(ev.flags & CLOSE_ESTABLISHED), "active": bool(ev.active)}
        if ev.flags & CLOSE_ESTABLISHED:
            fields["duration_s"] = ev.duration_ns / 1e9
        if ev.flags & CLOSE_UNA:
            fields["bytes_acked"] = int(ev.bytes_acked)
            fields["bytes_sent"] = int(ev.bytes_sent)
            fields["bytes_received"] = int(ev.bytes_received)
        return Record("tcp_flow_close", time_ns,
                      {**tags, "side": side, "from_state": state_name(ev.oldstate)}, fields)
    if ev.type in (EV_RST_SENT, EV_RST_RECV):
        tags["direction"] = "sent" if ev.type == EV_RST_SENT else "received"
        if ev.state:
            tags["state"] = state_name(ev.state)
        if ev.type == EV_RST_SENT and ev.reason != RST_REASON_NONE:
            tags["reason"] = (RST_REASONS[ev.reason] if ev.reason < len(RST_REASONS)
                              else str(ev.reason))
        return Record("tcp_reset", time_ns, tags, {"count": 1})
    if ev.type == EV_TRANSFER:
        seconds = ev.duration_ns / 1e9
        fields = {"seconds": seconds, "bytes_in": int(ev.bytes_received),
                  "bytes_out": int(ev.bytes_acked)}
        if ev.flags & TRANSFER_AFTER_REPORTED:
            fields["gap_s"] = ev.gap_ns / 1e9
        return Record("tcp_transfer", time_ns, {**tags, "side": side}, fields)
    raise ValueError(f"flow event of unknown type {ev.type}")
