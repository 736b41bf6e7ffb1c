"""Measurements of the TCP tracepoint probes (bpf/tcp_*.bpf.c)."""

from fabricscope.schema import Field, Measurement

MEASUREMENTS = [
    Measurement(
        name="tcp_retransmit",
        doc="One TCP retransmission event (one per retransmitted skb the kernel sent "
            "successfully), from the tcp/tcp_retransmit_skb tracepoint.",
        source="agent probe tcp_retransmit (bpf/tcp_retransmit.bpf.c)",
        tags={
            "saddr": "local IP address (v4 dotted or v6)",
            "daddr": "remote IP address",
            "sport": "local TCP port",
            "dport": "remote TCP port",
            "state": "TCP state of the socket (ESTABLISHED, SYN_SENT, ...)",
        },
        fields={
            "segs": Field(int, "segments", "retransmitted segments in this event"),
        },
    ),
]
