"""The tcp probe family: TCP tracepoints and TC egress (bpf/tcp_retransmit.bpf.c,
bpf/tcp_flows.bpf.c).

retransmit (TcpRetransmitProbe: retransmits and their kind), flows (TcpFlowsProbe:
everything retransmit does plus per-flow windows, opens, closes, transfers,
resets), flow_layout and common (the C structs' ctypes mirrors), window (flow
windows into records), hooks (which tracepoints, raw or regular), sweep (closes
the kernel skipped, found with sock_diag), owners (which process owns a flow),
rx_sampler, rx_diag and tcp_info (receive-side counters of each socket, from its
tcp_info through sock_diag, added to the flow windows).
"""

PROBES = {"tcp_retransmit": "fabricscope.agent.probes.tcp.retransmit:TcpRetransmitProbe",
          "tcp_flows": "fabricscope.agent.probes.tcp.flows:TcpFlowsProbe"}
#: tcp_flows compiles tcp_retransmit's programs into its own object: never both
INCLUDES = {"tcp_flows": ("tcp_retransmit",)}
