"""Measurements of the NIC probe (bpf/nic.bpf.c, agent/probes/nic/probe.py).

Directions: `rx` is TC ingress (what arrived on the interface), `tx` is TC
egress, which runs before the root qdisc: on a shaped or congested interface tx
shows the load offered to the qdisc, the peer's rx shows the wire. Bytes are
skb->len (the L2 frame; a GSO/GRO skb counts whole, as the interface counters
do); packets are wire segments (gso_segs).

Line rate: configured (link_speed_bps), or the kernel's speed of a link with
hardware under it (agent/probes/nic/settings.py). A virtual link (veth, bridge,
tun, dummy) has none unless configured: its records carry `link_speed_source`
unknown and leave out every field relative to a line rate (link_speed_bps,
peak_util, hot_bins, hot_s, bursts, bursts_listed; no nic_burst records), rather
than quote a share of a guess. The rates in bit/s are always there.
"""

from fabricscope.schema import Field, Measurement

_IFACE = {"interface": "interface name in the agent's network namespace",
          "direction": "rx (TC ingress) or tx (TC egress, before the qdisc)"}

MEASUREMENTS = [
    Measurement(
        name="nic_window",
        doc="Traffic of one interface and direction over one aggregation window "
            "(config nic_window_s), resolved in bins of nic_bin_us. Written for every "
            "window, zero when idle. Time: the window's start: a multiple of nic_window_s "
            "on the wall clock, to a bin (the bins run on the kernel's monotonic clock; "
            "the windows are shifted to start with the agent's TCP windows' second).",
        source="agent probe nic (bpf/nic.bpf.c)",
        tags=dict(_IFACE),
        fields={
            "bytes": Field(int, "bytes", "bytes in the window"),
            "packets": Field(int, "packets", "wire segments in the window"),
            "rate_bps": Field(float, "bit/s", "mean rate over the window"),
            "peak_bps": Field(float, "bit/s", "rate of the busiest bin"),
            "p99_bps": Field(float, "bit/s",
                             "99th percentile of the bin rates (idle bins count as 0; "
                             "nearest rank)"),
            "peak_util": Field(float, "fraction", "peak_bps / link_speed_bps; absent without "
                               "a line rate"),
            "hot_bins": Field(int, "bins", "bins at or above nic_burst_threshold utilization; "
                              "absent without a line rate"),
            "hot_s": Field(float, "s", "total length of the hot bins; absent without a line "
                           "rate"),
            "link_speed_bps": Field(int, "bit/s",
                                    "the line rate utilization is relative to; absent when "
                                    "unknown (link_speed_source)"),
            "link_speed_source": Field(str, "",
                                       "where the line rate comes from: config (link_speed_bps "
                                       "IF=RATE), kernel (sysfs speed of a link with hardware "
                                       "under it), config_default (link_speed_bps bare RATE) "
                                       "or unknown (a virtual link: veth, bridge, tun, "
                                       "dummy)"),
            "bin_us": Field(int, "us", "bin length"),
            "lost_bins": Field(int, "bins",
                               "bins the ring overwrote before a drain read them (their "
                               "traffic is missing from this window); 0 normally"),
            "bursts": Field(int, "bursts", "bursts that started in the window (each a "
                                           "nic_burst record when listed); absent without a "
                                           "line rate"),
            "bursts_listed": Field(int, "bursts",
                                   "of which written as nic_burst records: the largest "
                                   "nic_bursts_per_window by bytes; absent without a "
                                   "line rate"),
        },
    ),
    Measurement(
        name="nic_burst",
        doc="One microburst: a run of consecutive hot bins (utilization >= "
            "nic_burst_threshold of the line rate), extended by the partly filled bin on "
            "each side; only on links with a line rate. "
            "Time: the first packet of the burst (bpf_ktime_get_ns of its first bin's "
            "first packet). At most nic_bursts_per_window per interface, direction and "
            "window (the largest by bytes); nic_window counts all of them.",
        source="agent probe nic (bpf/nic.bpf.c)",
        tags=dict(_IFACE),
        fields={
            "duration_ns": Field(int, "ns", "first packet to last packet of the burst"),
            "bytes": Field(int, "bytes", "bytes in the burst's bins"),
            "packets": Field(int, "packets", "wire segments in the burst's bins"),
            "peak_util": Field(float, "fraction", "utilization of the busiest bin"),
            "peak_bps": Field(float, "bit/s", "rate of the busiest bin"),
            "hot_bins": Field(int, "bins", "bins at or above the threshold"),
            "bins": Field(int, "bins", "bins in the burst, with the partial edge bins"),
        },
    ),
    Measurement(
        name="nic_flow",
        doc="Traffic of one flow on one interface and direction during one window "
            "(only flows with traffic). Time: the window's start; the counts are the "
            "growth between two reads of the flow map at window ends.",
        source="agent probe nic (bpf/nic.bpf.c)",
        tags={**_IFACE,
              "proto": "tcp, udp, icmp, icmpv6 or the IP protocol number",
              "saddr": "source IP address",
              "daddr": "destination IP address",
              "sport": "source port (0 without ports: ICMP, later fragments, IPv6 "
                       "extension headers)",
              "dport": "destination port"},
        fields={
            "bytes": Field(int, "bytes", "bytes in the window"),
            "packets": Field(int, "packets", "wire segments in the window"),
            "ce_marks": Field(int, "packets", "wire segments with ECN CE set"),
            "dscp": Field(int, "dscp", "DSCP of the flow's last packet"),
        },
    ),
    Measurement(
        name="nic_qdisc",
        doc="One qdisc of a watched interface, read over netlink at each window end "
            "(clsact/ingress excluded; an interface with noqueue has none).",
        source="agent probe nic (netlink TCA_STATS2)",
        tags={"interface": "interface name",
              "kind": "qdisc kind (tbf, htb, fq_codel, mq, ...)",
              "handle": "qdisc handle, major:minor in hex",
              "parent": "parent handle (root for the root qdisc)"},
        fields={
            "backlog_bytes": Field(int, "bytes", "bytes queued at the read"),
            "qlen": Field(int, "packets", "packets queued at the read"),
            "drops": Field(int, "packets", "packets dropped during the window"),
            "overlimits": Field(int, "events", "overlimit events during the window"),
            "requeues": Field(int, "packets", "requeues during the window"),
            "bytes": Field(int, "bytes", "bytes sent during the window"),
            "packets": Field(int, "packets", "packets sent during the window"),
        },
    ),
    Measurement(
        name="skb_drop",
        doc="Packets the kernel dropped, by reason, from tracepoint skb/kfree_skb, "
            "during one window (only reasons that occurred). The tracepoint carries no "
            "interface and no network namespace, so counts are host-wide: only an agent "
            "in the initial network namespace writes them (agents inside a namespace "
            "would each report every namespace's drops).",
        source="agent probe nic (bpf/nic.bpf.c, tracepoint skb/kfree_skb)",
        tags={"reason": "enum skb_drop_reason name (NO_SOCKET, NETFILTER_DROP, ...; "
                        "OTHER for subsystem reasons)",
              "scope": "host: every namespace of the kernel"},
        fields={"drops": Field(int, "packets", "skbs dropped for this reason in the window")},
    ),
]
