"""The nic probe family: TC programs on the node's interfaces (bpf/nic.bpf.c).

probe (NicProbe: load, attach, drain), ring (the 100 us bins), window (bins into
windows and bursts), flows (the per-flow table), qdisc and drops (netlink qdisc
stats, skb/kfree_skb reasons), settings (link speeds), bpfmap (raw map syscalls),
standalone (`python -m fabricscope.agent.probes.nic.standalone`: the probe alone, JSON lines).
"""

PROBES = {"nic": "fabricscope.agent.probes.nic.probe:NicProbe"}
