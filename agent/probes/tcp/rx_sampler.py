"""Receive-side evidence per flow and window, from the kernel's own per-socket
counters (struct tcp_info through sock_diag; agent/probes/tcp/rx_diag.py).

The tcp probe measures loss where it is sent: a flow whose sender runs no agent (a
storage server, an object store, another cluster's host) shows its loss only to its
receiver. A frame lost on the way in leaves a hole in the sequence space, and every
segment arriving behind the hole until the retransmit fills it is queued out of order:
tcpi_rcv_ooopack counts them (reordering without loss counts too). The same holds for
the spine-to-ToR direction of a rack's uplink: only the rack's receivers see what it
drops.

At each window cut the sampler dumps the connected sockets on the node's addresses
and keeps, per socket (its cookie), the counters of the dump before. A flow's window
gets

- rx_data_segs: data segments received (tcpi_data_segs_in delta),
- rx_ooo_pkts: of them, packets that arrived out of order (tcpi_rcv_ooopack delta;
  absent before Linux 5.4),
- rcv_rtt_us: the receiver's RTT estimate at the cut (tcpi_rcv_rtt), when data came in.

A socket seen for the first time contributes nothing: its counters span its whole
life, not the window. A dump that fails is logged once, counted (rx_info_errors) and
forgets the counters kept, so that the next window's deltas never span two windows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fabricscope.agent.probes.tcp.common import addr_key
from fabricscope.agent.probes.tcp.rx_diag import SockRx, dump_rx
from fabricscope.agent.probes.tcp.tcp_info import counter_delta
from fabricscope.agent.probes.tcp.window import retrans_only_fields

log = logging.getLogger("fabricscope.agent.tcp_rx")

FlowKey = tuple[str, int, str, int]
#: cookie -> (data_segs_in, rcv_ooopack or None) at the last dump
Counters = dict[int, tuple[int, int | None]]


def window_fields(before: Counters, socks: list[SockRx]) -> tuple[dict[FlowKey, dict], Counters]:
    """(tcp_flow fields per flow over the window since `before`, the counters to keep).
    Sockets absent from `before` give no fields; sockets gone from `socks` are dropped."""
    now: Counters = {}
    fields: dict[FlowKey, dict] = {}
    for sock in socks:
        segs, ooo = sock.data_segs_in, sock.rcv_ooopack
        now[sock.cookie] = (segs, ooo)
        prev = before.get(sock.cookie)
        if prev is None:
            continue
        out = fields.setdefault(sock.flow, {"rx_data_segs": 0})
        data = counter_delta(segs, prev[0])
        out["rx_data_segs"] += data
        if ooo is not None and prev[1] is not None:
            out["rx_ooo_pkts"] = out.get("rx_ooo_pkts", 0) + counter_delta(ooo, prev[1])
        if data and sock.rcv_rtt:
            out["rcv_rtt_us"] = max(out.get("rcv_rtt_us", 0), sock.rcv_rtt)
    return fields, now


def merge_into(fields_by_flow: dict, rx: dict[FlowKey, dict], seconds: float) -> None:
    """Add the rx fields to the window's tcp_flow fields. A flow with a record gets
    them as they are; a flow without one gets a record only when it received data or
    out-of-order packets (its tcp_probe hits were skipped, or tcp/tcp_probe is off)."""
    for key, rx_fields in rx.items():
        if key in fields_by_flow:
            fields_by_flow[key].update(rx_fields)
        elif rx_fields["rx_data_segs"] or rx_fields.get("rx_ooo_pkts"):
            fields_by_flow[key] = {**retrans_only_fields(seconds), **rx_fields}


class RxSampler:
    """Receive-side counters of one node's sockets, one dump per window cut."""

    def __init__(self, addresses, dump: Callable[..., list[SockRx]] = dump_rx):
        self._own = frozenset(addr_key(a) for a in addresses)
        self._dump = dump
        self._before: Counters = {}
        self.counts = {"rx_info_dumps": 0, "rx_info_sockets": 0, "rx_info_errors": 0,
                       "rx_info_undecodable": 0}

    def sample(self) -> dict[FlowKey, dict]:
        """The rx fields of each flow over the window that ends now."""
        try:
            socks = self._dump(self._own, self.counts)
        except OSError as exc:
            self.counts["rx_info_errors"] += 1
            self._before = {}
            (log.debug if self.counts["rx_info_errors"] > 1 else log.warning)(
                "tcp_flows: reading the socket table's tcp_info failed, this window has no "
                "rx_* fields (counted in probe_events_total{event=\"rx_info_errors\"}; "
                "tcp_rx_info: false stops reading it): %s", exc)
            return {}
        self.counts["rx_info_dumps"] += 1
        self.counts["rx_info_sockets"] += len(socks)
        fields, self._before = window_fields(self._before, socks)
        return fields
