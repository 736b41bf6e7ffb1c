"""Measurements of the TCP tracepoint probes (bpf/tcp_*.bpf.c)."""

from fabricscope.schema import Field, Measurement

_FLOW_TAGS = {
    "saddr": "local IP address (v4 dotted or v6)",
    "daddr": "remote IP address",
    "sport": "local TCP port",
    "dport": "remote TCP port",
    "state": "TCP state of the socket (ESTABLISHED, SYN_SENT, ...)",
}

MEASUREMENTS = [
    Measurement(
        name="tcp_retransmit",
        doc="One TCP retransmission the kernel sent from this node (one per retransmitted "
            "skb, from the tcp/tcp_retransmit_skb tracepoint with err 0, and one per "
            "SYN-ACK retransmit from tcp/tcp_retransmit_synack). With TSO/GSO one skb "
            "carries several segments: sum(segs) equals the kernel's TcpRetransSegs "
            "(nstat), the number of records does not.",
        source="agent probe tcp_retransmit (bpf/tcp_retransmit.bpf.c)",
        tags=dict(_FLOW_TAGS),
        fields={
            "segs": Field(int, "segments",
                          "segments retransmitted (tcp_skb_pcount, read as gso_segs at TC "
                          "egress); 1 when TC egress did not see the packet (counted in "
                          "fabricscope_agent_probe_events_total{event=\"segs_unknown\"})"),
        },
    ),
    Measurement(
        name="tcp_retransmit_failed",
        doc="A retransmission the kernel attempted but did not send (tcp_retransmit_skb "
            "with err != 0). EBUSY: the original is still queued in the host, retried "
            "later, counted nowhere by the kernel; other errors are counted in "
            "TcpExtTCPRetransFail. None of these are in TcpRetransSegs.",
        source="agent probe tcp_retransmit (bpf/tcp_retransmit.bpf.c)",
        tags={**_FLOW_TAGS, "reason": "errno name of err (EBUSY, ENOBUFS, ...)"},
        fields={"err": Field(int, "errno", "negative errno returned by the transmit")},
    ),
]
