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
        doc="One TCP retransmission counted by the kernel in TcpRetransSegs, sent from "
            "this node: one per retransmitted skb (tcp/tcp_retransmit_skb, err 0 or a "
            "transmit error) and one per SYN-ACK retransmit (tcp/tcp_retransmit_synack). "
            "With TSO/GSO one skb carries several segments: sum(segs) equals nstat's "
            "TcpRetransSegs, the number of records does not.",
        source="agent probe tcp_retransmit (bpf/tcp_retransmit.bpf.c)",
        tags=dict(_FLOW_TAGS),
        fields={
            "segs": Field(int, "segments",
                          "segments retransmitted (tcp_skb_pcount, read as gso_segs at TC "
                          "egress); 1 when TC egress did not see the packet (counted in "
                          "fabricscope_agent_probe_events_total{event=\"segs_unknown\"})"),
            "err": Field(int, "code",
                         "0: sent; > 0: the qdisc dropped it (1 NET_XMIT_DROP); < 0: -errno "
                         "of the transmit (ENOBUFS, EPERM from netfilter); failures are also "
                         "in TcpExtTCPRetransFail"),
        },
    ),
    Measurement(
        name="tcp_retransmit_skipped",
        doc="A retransmission the kernel gave up before sending or counting it, and "
            "retries later (tcp_retransmit_skb with EBUSY: the original still sits in a "
            "host queue; ENOMEM; EAGAIN: outside the receive window; EHOSTUNREACH: no "
            "route). Not in TcpRetransSegs.",
        source="agent probe tcp_retransmit (bpf/tcp_retransmit.bpf.c)",
        tags={**_FLOW_TAGS, "reason": "errno name (EBUSY, ENOMEM, EAGAIN, EHOSTUNREACH)"},
        fields={"err": Field(int, "errno", "negative errno")},
    ),
]
