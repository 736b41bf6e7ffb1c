"""Measurements of the TCP tracepoint probes (bpf/tcp_retransmit.bpf.c, bpf/tcp_flows.bpf.c).

Every flow record names the flow from this node's side (saddr/sport local) and,
when the agent knows it, the process that owns the socket (the optional owner
tags: pid, comm, cgroup, container, rank, local_rank, world_size, job, namespace,
pod): the
process the kernel saw connect the flow (connect() runs in it), else the one a
/proc scan finds holding the socket (the accepting side; flows opened before the
agent started).
"""

from fabricscope.schema import Field, Measurement

_FLOW = {
    "saddr": "local IP address (v4 dotted or v6)",
    "daddr": "remote IP address",
    "sport": "local TCP port",
    "dport": "remote TCP port",
}
_STATE = {"state": "TCP state of the socket (ESTABLISHED, SYN_SENT, ...)"}
OWNER_TAGS = {
    "pid": "process that connected the flow, else the one holding the socket "
           "(/proc/PID/fd)",
    "comm": "its command name (/proc/PID/comm)",
    "cgroup": "its cgroup path (the cgroup v2 line of /proc/PID/cgroup)",
    "container": "container id (first 12 hex digits) found in the cgroup path",
    "rank": "training rank (RANK in the process's environment)",
    "local_rank": "LOCAL_RANK in the process's environment",
    "world_size": "WORLD_SIZE in the process's environment",
    "job": "training job: FABRICSCOPE_JOB, else the Kubernetes job controller's pod "
           "label (agent/kube/training.py), else MASTER_ADDR:MASTER_PORT",
    "namespace": "Kubernetes namespace of the process's pod (its cgroup names the pod)",
    "pod": "Kubernetes pod the process runs in",
}
_OWNERS = frozenset(OWNER_TAGS)
_KIND = {"kind": "fast (in Recovery, or several segments from the retransmit queue in "
                 "Open/Disorder/CWR), rto (the timeout's own retransmit), slow_start (later "
                 "ones in Loss), tlp (one segment in Open/Disorder/CWR: tail loss probe), "
                 "syn, synack, "
                 "unknown (kernel without tcp_cong_state_set); see agent/probes/tcp/retransmit.py"}
_SOURCE_R = "agent probes tcp_retransmit and tcp_flows (bpf/tcp_retransmit.bpf.c)"
_SOURCE_F = "agent probe tcp_flows (bpf/tcp_flows.bpf.c)"
_SIDE = {"side": "client (this side connected) or server (it accepted)"}


def _i(unit: str, doc: str) -> Field:
    return Field(int, unit, doc)


def _f(unit: str, doc: str) -> Field:
    return Field(float, unit, doc)


MEASUREMENTS = [
    Measurement(
        name="tcp_retransmit",
        doc="One TCP retransmission counted by the kernel in TcpRetransSegs, sent from "
            "this node: one per retransmitted skb (found on TC egress: it starts below "
            "the highest sequence its socket sent; or tcp_retransmit_skb with a transmit "
            "error) and one per SYN-ACK retransmit (on TC egress with tcp_flows: a "
            "SYN-ACK acknowledging the same SYN again; tcp/tcp_retransmit_synack with "
            "tcp_retransmit alone). "
            "With TSO/GSO one skb carries several segments: sum(segs) equals nstat's "
            "TcpRetransSegs, the number of records does not.",
        source=_SOURCE_R,
        tags={**_FLOW, **_STATE, **_KIND, **OWNER_TAGS},
        optional_tags=_OWNERS | {"kind"},
        fields={
            "segs": _i("segments",
                       "segments retransmitted (tcp_skb_pcount, read as gso_segs at TC "
                       "egress); 1 when no packet left (err < 0) or, on kernels without "
                       "raw tracepoints, TC egress did not see it (counted in "
                       "fabricscope_agent_probe_events_total{event=\"segs_unknown\"})"),
            "payload_bytes": _i("bytes", "TCP payload bytes retransmitted (absent when no "
                                         "packet was seen)"),
            "err": _i("code", "0: it left through TC egress (the qdisc behind may still "
                              "drop it: counted in fabricscope_agent_probe_events_total"
                              "{event=\"retransmits_qdisc_dropped\"}; on kernels without "
                              "raw tracepoints err > 0 says so); < 0: -errno of the "
                              "transmit (ENOBUFS, EPERM from netfilter); failures are also "
                              "in TcpExtTCPRetransFail"),
        },
    ),
    Measurement(
        name="tcp_retransmit_skipped",
        doc="A retransmission the kernel gave up before sending or counting it, and "
            "retries later (tcp_retransmit_skb with EBUSY: the original still sits in a "
            "host queue; ENOMEM; EAGAIN: outside the receive window; EHOSTUNREACH: no "
            "route). Not in TcpRetransSegs.",
        source=_SOURCE_R,
        tags={**_FLOW, **_STATE, **_KIND, **OWNER_TAGS,
              "reason": "errno name (EBUSY, ENOMEM, EAGAIN, EHOSTUNREACH)"},
        optional_tags=_OWNERS | {"kind"},
        fields={"err": _i("errno", "negative errno")},
    ),
    Measurement(
        name="tcp_flow",
        doc="One flow over one window (config tcp_window_s), for flows that received "
            "segments or retransmitted in it (or, by their tcp_info, received data or "
            "out-of-order packets: agent/probes/tcp/rx_sampler.py). RTT is the kernel's smoothed RTT (srtt, as "
            "`ss -ti` shows it) sampled on each segment that found snd_una advanced, "
            "aggregated in the kernel as a log2 histogram (percentiles interpolated "
            "inside the bucket, clamped to min/max). Time: the window's start.",
        source=_SOURCE_F,
        tags={**_FLOW, **OWNER_TAGS},
        optional_tags=_OWNERS,
        fields={
            "seconds": _f("s", "window length"),
            "segs_in": _i("segments", "segments received while ESTABLISHED (tcp/tcp_probe "
                                      "hits: ACKs and data)"),
            "bytes_acked": _i("bytes", "bytes the peer newly acknowledged (snd_una advance)"),
            "acked_bps": _f("bit/s", "bytes_acked * 8 / seconds: delivered throughput"),
            "bytes_received": _i("bytes", "TCP payload received (data_len of the segments "
                                          "tcp_probe saw, corrected by this side's ACKs "
                                          "when a transfer ends: skipped hits added, "
                                          "duplicates taken off, in the window of the "
                                          "correction and on its CPU's share)"),
            "received_bps": _f("bit/s", "bytes_received * 8 / seconds"),
            "rtt_samples": _i("samples", "RTT samples in the window"),
            "rtt_p50_us": _f("us", "median smoothed RTT"),
            "rtt_p90_us": _f("us", "90th percentile"),
            "rtt_p99_us": _f("us", "99th percentile"),
            "rtt_min_us": _f("us", "smallest sample"),
            "rtt_max_us": _f("us", "largest sample"),
            "rtt_mean_us": _f("us", "mean of the samples"),
            "rtt_stddev_us": _f("us", "standard deviation of the samples (population)"),
            "cwnd_min": _i("segments", "smallest congestion window seen"),
            "cwnd_max": _i("segments", "largest congestion window seen"),
            "ssthresh_min": _i("segments", "smallest slow-start threshold (absent while "
                                           "unset: TCP_INFINITE_SSTHRESH)"),
            "ssthresh_max": _i("segments", "largest slow-start threshold"),
            "retrans_segs": _i("segments", "segments retransmitted (sum of tcp_retransmit "
                                           "segs in the window)"),
            "retrans_bytes": _i("bytes", "payload bytes retransmitted"),
            "timeouts": _i("events", "retransmission timeouts (kind rto or syn)"),
            "rx_data_segs": _i("segments", "data segments received (the socket's "
                                           "tcpi_data_segs_in over the window, read with "
                                           "sock_diag at the cuts; absent in a socket's "
                                           "first window and with tcp_rx_info off)"),
            "rx_ooo_pkts": _i("packets", "of them, packets queued out of order "
                                         "(tcpi_rcv_ooopack, Linux 5.4+): every segment "
                                         "arriving behind a hole until the retransmit fills "
                                         "it, so loss on the way in even when the sender "
                                         "runs no agent (reordering counts too)"),
            "rcv_rtt_us": _i("us", "the receiver's RTT estimate at the window's end "
                                   "(tcpi_rcv_rtt; present when data came in and the "
                                   "kernel has an estimate)"),
        },
    ),
    Measurement(
        name="tcp_node",
        doc="This node's TCP over one window (config tcp_window_s), written every "
            "window, zero when idle. Time: the window's start.",
        source=_SOURCE_F,
        fields={
            "seconds": _f("s", "window length"),
            "flows": _i("flows", "flows with a tcp_flow record in the window"),
            "bytes_acked": _i("bytes", "sum of the flows' bytes_acked"),
            "segs_out": _i("segments", "own TCP segments leaving on TC egress (gso_segs; "
                                       "data, ACKs and retransmits: segs_out - retrans_segs "
                                       "equals nstat's TcpOutSegs, which leaves "
                                       "retransmits out)"),
            "bytes_out": _i("bytes", "their TCP payload bytes (retransmits included)"),
            "retrans_segs": _i("segments", "segments retransmitted (like TcpRetransSegs)"),
            "retrans_bytes": _i("bytes", "payload bytes retransmitted"),
            "retrans_ratio": _f("fraction", "retrans_bytes / bytes_out"),
            "retrans_seg_ratio": _f("fraction", "retrans_segs / segs_out"),
            "timeouts": _i("events", "retransmission timeouts (kinds rto, syn, synack: "
                                     "like TcpExtTCPTimeouts)"),
            **{f"{k}_segs": _i("segments", f"segments retransmitted of kind {k}")
               for k in ("fast", "rto", "slow_start", "tlp", "syn", "synack", "unknown")},
            "resets_sent": _i("resets", "RSTs sent (tcp/tcp_send_reset)"),
            "resets_received": _i("resets", "RSTs received (tcp/tcp_receive_reset)"),
            "opens": _i("flows", "connections established"),
            "closes": _i("flows", "connections closed"),
        },
    ),
    Measurement(
        name="tcp_flow_open",
        doc="A connection of this node reached ESTABLISHED (sock/inet_sock_set_state; "
            "when the kernel skipped that hook, at the socket's first acknowledging "
            "packet on TC egress, a little later).",
        source=_SOURCE_F,
        tags={**_FLOW, **_SIDE, **OWNER_TAGS},
        optional_tags=_OWNERS,
        fields={
            "active": Field(bool, "", "true when this side connected"),
            "handshake_us": _f("us", "SYN_SENT to ESTABLISHED (client side only)"),
        },
    ),
    Measurement(
        name="tcp_flow_close",
        doc="A connection of this node reached CLOSE (sock/inet_sock_set_state; when the "
            "kernel skipped that hook, at socket teardown, tcp_destroy_sock; when it "
            "skipped that too, once a new socket reuses the address or sock_diag no "
            "longer lists the socket, stamped with its last packet; the same when the "
            "agent's ring had no room for the close). Bytes "
            "are counted from the first byte of the connection's data that TC egress "
            "saw leave (a connection older than the agent: from the first segment the "
            "probe saw while ESTABLISHED). A close after the peer acknowledged our FIN "
            "(from FIN_WAIT2, LAST_ACK or CLOSING) counts every byte sent as "
            "acknowledged, and the FIN as sent; a reset or abort has only what the "
            "probe saw acknowledged.",
        source=_SOURCE_F,
        tags={**_FLOW, **_SIDE, **OWNER_TAGS,
              "from_state": "state it closed from (ESTABLISHED: reset or abort, "
                            "SYN_SENT: connect failed, LAST_ACK/FIN_WAIT2/...: normal; "
                            "UNKNOWN: the kernel skipped the state change's hook and the "
                            "close was seen at socket teardown, address reuse or by "
                            "the sweep)"},
        optional_tags=_OWNERS,
        fields={
            "established": Field(bool, "", "the probe saw it reach ESTABLISHED"),
            "active": Field(bool, "", "true when this side connected"),
            "duration_s": _f("s", "ESTABLISHED to CLOSE (absent when not seen established)"),
            "bytes_acked": _i("bytes", "bytes the peer acknowledged (snd_una advance)"),
            "bytes_sent": _i("bytes", "bytes sent (snd_nxt advance)"),
            "bytes_received": _i("bytes", "TCP payload received in order while established, "
                                          "each byte once (this side's ACKs add the "
                                          "segments of skipped hits and take off "
                                          "duplicates)"),
        },
    ),
    Measurement(
        name="tcp_transfer",
        doc="One transfer of a connection: a run of segments that moved bytes (payload "
            "received, or data the peer acknowledged) with no gap longer than "
            "tcp_transfer_gap_us, of at least tcp_transfer_min_bytes or beginning at most "
            "tcp_transfer_tail_us after the flow's previous reported one ended (the rest of "
            "a transfer a stall split). Reported when the "
            "next transfer of the flow starts or the flow closes. The agent folds the "
            "transfers of a training process inside its own collective windows into those "
            "(gloo_collective); the others, data loading and checkpoints among them, are "
            "written (see agent/training_join.py), those of processes that are not training "
            "ranks at most tcp_transfers_per_s per second. Time: the transfer's first segment.",
        source=_SOURCE_F,
        tags={**_FLOW, **_SIDE, **OWNER_TAGS},
        optional_tags=_OWNERS,
        fields={
            "seconds": _f("s", "first to last segment that moved bytes"),
            "bytes_in": _i("bytes", "TCP payload received in order, each byte once "
                                    "(this side's ACKs add the segments of skipped "
                                    "hits and take off duplicates)"),
            "bytes_out": _i("bytes", "bytes the peer acknowledged (what this side sent)"),
            "gap_s": _f("s", "pause since the flow's previous reported transfer ended "
                             "(absent for its first)"),
        },
    ),
    Measurement(
        name="tcp_reset",
        doc="A TCP reset this node sent (tcp/tcp_send_reset) or received "
            "(tcp/tcp_receive_reset).",
        source=_SOURCE_F,
        tags={**_FLOW, **OWNER_TAGS, "direction": "sent or received",
              "state": "TCP state of the socket (absent: no socket, e.g. a closed port)",
              "reason": "why it was sent (enum sk_rst_reason, kernel 6.10+)"},
        optional_tags=_OWNERS | {"state", "reason"},
        fields={"count": _i("resets", "always 1 (so that sum() counts resets)")},
    ),
]
