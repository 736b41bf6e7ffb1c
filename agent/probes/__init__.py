"""Probe registry: config name -> "module:Class", imported only when enabled."""

from __future__ import annotations

import importlib

REGISTRY: dict[str, str] = {
    "tcp_retransmit": "agent.probes.tcp_retransmit:TcpRetransmitProbe",
    "tcp_flows": "agent.probes.tcp_flows:TcpFlowsProbe",     # includes tcp_retransmit
    "markers": "agent.sources.markers:MarkersSource",
    "nccl": "agent.probes.nccl:NcclProbe",
    "nccl_log": "agent.sources.nccl_log:NcclLogSource",
    "nic": "agent.probes.nic:NicProbe",
    "synthetic": "agent.sources.synthetic:SyntheticSource",   # load generator (tests, benches)
    "gloo": "agent.probes.gloo:GlooProbe",
}

#: probe -> probes it includes (one BPF object does both); not enabled together
INCLUDES: dict[str, tuple[str, ...]] = {"tcp_flows": ("tcp_retransmit",)}


def load_class(name: str):
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), cls)
